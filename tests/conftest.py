"""Shared fixtures. Expensive things (quantized checkpoints, vLLM boots) are session-scoped and
shared by every test that needs them; checkpoints are cached by their inputs under
.cache/test-work so a second local run does not quantize again (CI starts clean). The base references
(figures of a base measured by an earlier run) are not kept from one suite to the next: a first release
in a test is a first release on every machine."""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from localhub.server import LocalHub
from quantize_serve.serving import gpu
from quantize_serve.serving.host import servable_overrides, serving_host_gap

ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("QS_WORK_DIR", str(ROOT / ".cache" / "test-work"))
# The suite never touches the user's Prefect home (~/.prefect): a run started by hand while the
# tests run would otherwise share one SQLite database with them ("database is locked").
TEST_PREFECT_HOME = tempfile.mkdtemp(prefix="qs-test-prefect-")
os.environ["PREFECT_HOME"] = TEST_PREFECT_HOME
os.environ.pop("PREFECT_API_URL", None)
# vLLM's process layout for the suite's boots: the API server and the engine core, with the model
# worker inside the engine core, as vLLM serves a one-GPU model (TP 1) in production. On a CPU, vLLM
# otherwise starts the worker as a third process (its default there: VLLM_ENABLE_V1_MULTIPROCESSING=1),
# which costs every boot one more interpreter importing torch and vLLM: about 10 s of a 27 s boot on
# a 2-core machine, and the suite boots vLLM about 35 times. The tests about that third process (a
# worker crash, tests/engines/test_faults.py) boot vLLM's CPU default; every boot's processes are
# still a process group that must leave nothing behind (API server + engine core at least).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# `make test` runs two lanes on a CPU host (pytest-xdist, pytest_xdist_auto_num_workers and LANES
# below). Each lane's vLLM computes on a core of its own (vLLM's CPU default binds every server to the
# first core).
LANE = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1"; None when the suite runs in one process
GPU_MEMORY = gpu.usable_memory_bytes()  # None: no NVIDIA GPU here
if LANE and not GPU_MEMORY:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(int(LANE[2:]) % (os.cpu_count() or 1)))
    # and one OpenMP thread for every other process a lane starts (the quantization worker's torch): two
    # threads next to the other lane's busy core spin-wait, and llm-compressor's calibration then ran up to
    # 15x slower (benchmarks/results/release-time/quantize_speed.json, "rule": 4.5 s quiet, 70 s beside
    # another job)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# What this machine's vLLM serves (quantize_serve/serving/host.py). Where its CPU has no AVX-512, the
# session's checkpoint and production boot (awq_recipe, awq_checkpoint, awq_fp8_server) are the
# shipped recipe as INT8 W8A8 with a 16-bit KV cache (SERVING_OVERRIDES, as `make demo` runs there),
# and only the tests about W4A16 kernels or the fp8 KV cache skip, each with the reason (its gap).
SERVING_OVERRIDES, _ = servable_overrides()
SERVING_GAPS = {
    "w4a16_serving": ("W4A16 kernels", serving_host_gap("W4A16", None)),
    "fp8_kv_serving": ("the fp8 KV cache", serving_host_gap(None, "fp8")),
}
# The flags of an AVX2-only x86 CPU (seen: an AMD EPYC of family 25), for tests that fake one.
AVX2_ONLY = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2".split())


def as_cpu_host(monkeypatch, flags: frozenset[str]) -> None:
    """This machine as an x86 CPU host with ``flags`` and no GPU, as quantize_serve/serving/host.py sees
    it."""
    from quantize_serve.serving import gpu, host

    monkeypatch.setattr(host, "cpu_flags", lambda cpuinfo=None: flags)
    monkeypatch.setattr(host.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(gpu, "nvml", lambda: None)  # no NVML: every figure of quantize_serve/serving/gpu.py


@pytest.fixture
def avx2_host(monkeypatch):
    """This machine as an AVX2-only x86 CPU host (no GPU)."""
    as_cpu_host(monkeypatch, AVX2_ONLY)


TIERS = ("unit", "engines", "flows", "gpu")  # tests/<tier>/: the tier is the folder, and so the marker
# The gpu tier needs an NVIDIA GPU (NVML); elsewhere it is skipped with this reason.
NO_GPU = (
    None
    if GPU_MEMORY
    else (
        "no NVIDIA GPU here (NVML finds none): the gpu tier runs on a GPU host, where `make test` includes it"
    )
)
# On a GPU host `make test` runs the unit and gpu tiers, and of the engines and flows tiers the tests
# marked ``gpu_host``: those whose subject is how the engine behaves on the device (a boot that cannot
# fit its KV cache, a refused setting, a cancelled or killed engine and the memory it must give back, a
# stress test beyond the KV budget). A GPU boots vLLM in about a minute (compile, CUDA graphs) against
# under half of that on a CPU, so the whole of those tiers would take about 40 minutes there; the rest of
# them (orchestration, the Hub, the CLI, the gates' arithmetic) does not depend on the device and runs
# wherever the CPU suite runs, as CI does.
ON_GPU_HOST_ONLY_MARKED = (
    "proved by the CPU suite: its subject does not depend on the device (on a GPU "
    "host `make test` runs the unit and gpu tiers and the tests marked gpu_host)"
)


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (make test): two lanes on a CPU host, one process on a GPU host (one GPU serves one
    vLLM at a time: its boots take most of its memory)."""
    return 0 if GPU_MEMORY else 2


def tier_of(item) -> str | None:
    return next((part for part in Path(item.fspath).relative_to(ROOT / "tests").parts if part in TIERS), None)


# `make test`'s two lanes (pytest-xdist), by test file: each lane runs its files in one process, so its
# session boots and flow runs stay shared; every other test is a unit of its own, run where there is
# room. The split balances the lanes' seconds (benchmarks/results/setup-and-tests/test_durations.json).
# On 2026-12-03 (a fresh clone, 20:34 in all) the flows lane took 1,225 s and the engines lane 983 s; the
# MoE and shape-capacity files (77 s, their own quantization and boots) went back to the engines lane:
# 1,143 / 1,015 s, 19:12 in all.
LANES = {
    "tests/engines/test_real_model_gate.py": "flows",  # its own model, quantization and boots
    "tests/engines/": "engines",
    "tests/flows/test_formats.py": "engines",
    "tests/flows/": "flows",
}
# Where vLLM serves no W4A16 checkpoint (a CPU without AVX-512), test_flow.py, test_formats.py and
# test_real_model_gate.py skip and the flows lane loses most of its seconds, while the engines lane's
# 16-bit boots run slower. On AVX2 (emulated, benchmarks/avx2_emulation, 2026-12-04) the engines and flows
# tests took 580 / 356 s; on an AVX2 EPYC the suite took 22 min. The fault matrix (137 s there, its own
# boots, no session fixture) then runs in the flows lane: the emulated suite took 500 s instead of 593 s.
if SERVING_GAPS["w4a16_serving"][1]:
    LANES = {"tests/engines/test_faults.py": "flows", **LANES}


def pytest_xdist_make_scheduler(config, log):
    """The lanes above as pytest-xdist work units. Its own --dist loadgroup would group by a marker, but
    under pytest 9.2 and later it silently stops grouping: it marks a group by renaming the test's node
    id, which pytest's structured node ids ignore (pytest-xdist issue #1386; its fix, PR #1388, was
    still open in 2026-12)."""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((lane for prefix, lane in LANES.items() if nodeid.startswith(prefix)), nodeid)

    return Lanes(config, log)


def pytest_collection_modifyitems(config, items):
    """Each test gets its tier's marker from its folder: ``unit`` (no engine, no server),
    ``engines`` (the real vLLM, llm-compressor, lm-eval, the Hub client against the local Hub) and
    ``flows`` (Prefect flows against a throwaway Prefect server, tests/flows/conftest.py) and ``gpu``
    (what only a GPU host proves; skipped elsewhere with the reason). On a GPU host only the engines
    and flows tests marked ``gpu_host`` run (ON_GPU_HOST_ONLY_MARKED says why).

    Tests marked ``w4a16_serving`` or ``fp8_kv_serving`` serve a W4A16 checkpoint or an fp8 KV cache
    with the real vLLM on purpose. Where this CPU's vLLM has no such kernels they are skipped with
    the reason (SERVING_GAPS), and tests/unit/test_cpu_support.py checks that the product refuses
    such a recipe up front; everything else runs, the session's quantized boots included."""
    for item in items:
        tier = tier_of(item)
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        if tier == "gpu" and NO_GPU:
            item.add_marker(pytest.mark.skip(reason=NO_GPU))
        if GPU_MEMORY and tier in ("engines", "flows") and not item.get_closest_marker("gpu_host"):
            item.add_marker(pytest.mark.skip(reason=ON_GPU_HOST_ONLY_MARKED))
        for marker, (about, gap) in SERVING_GAPS.items():
            if gap and item.get_closest_marker(marker):
                item.add_marker(
                    pytest.mark.skip(reason=f"about {about}, which vLLM cannot serve here: {gap}")
                )
                break


@pytest.fixture(scope="session")
def prefect_api():
    """One throwaway Prefect server (SQLite in a temporary folder), for the tests that run flows
    (the flows tier uses it for every test: tests/flows/conftest.py).

    Stopped at session end, inside pytest, so it can never outlive the suite (an ephemeral server
    stopped from an atexit hook was seen orphaned after a run).
    """
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def awq_recipe():
    from quantize_serve.recipe.load import load_recipe

    return load_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml", SERVING_OVERRIDES)


@pytest.fixture(scope="session")
def gptq_recipe():
    from quantize_serve.recipe.load import load_recipe

    return load_recipe(ROOT / "recipes" / "tiny-llama-gptq.yaml")


# What each session quantization logged, by method (a checkpoint reused from the cache logs one line).
QUANTIZE_LOGS: dict[str, list[str]] = {}


@pytest.fixture(scope="session")
def quantize_logs() -> dict[str, list[str]]:
    """QUANTIZE_LOGS as pytest loaded it (an import of tests.conftest would be a second copy)."""
    return QUANTIZE_LOGS


def safetensors_tensors(path: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) of every tensor in a .safetensors file, from its JSON header alone (no
    torch)."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"}


def _quantize(recipe_path: Path, log=lambda _: None, overrides: dict | None = None):
    from quantize_serve.quantize.run import quantize_model
    from quantize_serve.validate.preflight import resolve_base, validate_recipe

    validated = validate_recipe(recipe_path, overrides)
    base = resolve_base(validated)
    return quantize_model(
        validated.recipe,
        Path(base.local_dir),
        base_identity=base.identity,
        calibration_fingerprint=validated.calibration_fingerprint,
        log=log,
    )


@pytest.fixture(scope="session")
def awq_checkpoint():
    return _quantize(
        ROOT / "recipes" / "tiny-llama-awq.yaml",
        log=QUANTIZE_LOGS.setdefault("awq", []).append,
        overrides=SERVING_OVERRIDES,
    )


@pytest.fixture(scope="session")
def gptq_checkpoint():
    log = QUANTIZE_LOGS.setdefault("gptq", []).append
    return _quantize(ROOT / "recipes" / "tiny-llama-gptq.yaml", log=log)


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    return ROOT / "models" / "tiny-llama"


@pytest.fixture(scope="session")
def base_server(awq_recipe, base_model_dir, tmp_path_factory):
    """(a) the base model, 16-bit KV, under the recipe's budget: capacity and accuracy share it."""
    from quantize_serve.serving.spec import capacity_spec
    from quantize_serve.serving.boot import Boot
    from quantize_serve.serving.server import vllm_server

    spec = capacity_spec(awq_recipe, Boot.BASE, base_model_dir)
    with vllm_server(spec, log_path=tmp_path_factory.mktemp("vllm-base") / "vllm.log") as server:
        yield server, spec


@pytest.fixture(scope="session")
def awq_fp8_server(awq_recipe, awq_checkpoint, tmp_path_factory):
    """(c) the session's checkpoint in the production settings (AWQ with fp8 KV; INT8 W8A8 with 16-bit
    KV where this CPU serves neither, SERVING_OVERRIDES), named by its repo id as the flow boots it:
    capacity, accuracy, stress."""
    from quantize_serve.serving.spec import capacity_spec
    from quantize_serve.serving.boot import Boot
    from quantize_serve.serving.server import vllm_server

    spec = capacity_spec(awq_recipe, Boot.PRODUCTION, Path(awq_checkpoint.checkpoint_dir), as_published=True)
    with vllm_server(spec, log_path=tmp_path_factory.mktemp("vllm-awq-fp8") / "vllm.log") as server:
        yield server, spec


def vllm_processes_of(log_path: str = "") -> list:
    """Live processes started by a vLLM boot (all inherit QS_SERVER_LOG=<its log path>)."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            tag = p.environ().get("QS_SERVER_LOG")
        except (psutil.Error, OSError):
            continue
        if tag and (not log_path or tag == log_path) and p.status() != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


@contextmanager
def local_hub_server(
    root: Path, *, tokens: tuple[str, ...] = (), read_tokens: tuple[str, ...] = (), online: bool = False
) -> Iterator[LocalHub]:
    """The one way tests start a local Hub (localhub/, the Hub's HTTP protocol) under ``root``: the
    ``local_hub`` fixture below, or this for a hub of one test's own.

    ``tokens`` may write, ``read_tokens`` only read (none: anyone may). ``online``: this process and
    the processes it starts (the quantization worker loads the calibration data) reach it as the Hub,
    with HF_TOKEN the first token and a private HF cache, and runs go to ``hub.runs`` (root/runs), as a
    whole flow run needs."""
    from localhub.client import hub_client_env
    from localhub.server import start_local_hub
    from quantize_serve.core.settings import get_settings

    with start_local_hub(root / "hub", tokens=tokens, read_tokens=read_tokens) as hub:
        if not online:
            yield hub
            return
        with hub_client_env(hub.endpoint, cache_dir=root / "hf-cache"), pytest.MonkeyPatch.context() as mp:
            if tokens:
                mp.setenv("HF_TOKEN", tokens[0])
            hub.runs = root / "runs"
            hub.runs.mkdir(parents=True, exist_ok=True)
            mp.setenv("QS_RUNS_DIR", str(hub.runs))
            get_settings.cache_clear()
            try:
                yield hub
            finally:
                get_settings.cache_clear()


# The tokens of a module's ``local_hub`` (below): one that may write, one that may only read.
HUB_WRITE = "hf_WriteTokenForLocalHubTests0123456789"
HUB_READ = "hf_ReadOnlyTokenForLocalHubTests01234567"


@pytest.fixture(scope="module")
def local_hub_access() -> dict:
    """Who may use the module's ``local_hub``: local_hub_server's keywords. HUB_WRITE writes, HUB_READ
    only reads, offline (each test sets its client); a module that needs another hub overrides this."""
    return {"tokens": (HUB_WRITE,), "read_tokens": (HUB_READ,)}


@pytest.fixture(scope="module")
def local_hub(local_hub_access, tmp_path_factory):
    """One local Hub for the test module (``local_hub_access`` says who may use it); each test uses
    repos of its own. A module that needs content on it publishes it in a fixture built on this one."""
    with local_hub_server(tmp_path_factory.mktemp("hub"), **local_hub_access) as hub:
        yield hub


@pytest.fixture(scope="session")
def datasets_hub(tmp_path_factory):
    """A local hub holding the datasets the shipped recipes name, made by localhub.datasets:
    ``openai/gsm8k`` (config ``main``: train 12 / test 8 rows) and ``HuggingFaceH4/ultrachat_200k``
    (default config: train_sft 256 / test_sft 32 conversations). Use it through ``hub_env``."""
    from huggingface_hub import HfApi

    from localhub.client import hub_client_env
    from localhub.datasets import publish_gsm8k, publish_ultrachat

    root = tmp_path_factory.mktemp("datasets-hub")
    with local_hub_server(root) as hub:
        with hub_client_env(hub.endpoint, cache_dir=root / "publish-cache"):
            api = HfApi(endpoint=hub.endpoint)
            publish_gsm8k(api)
            publish_ultrachat(api)
        yield hub


@pytest.fixture
def hub_env(datasets_hub, tmp_path):
    """This test's huggingface_hub / datasets (and child processes) online against ``datasets_hub``,
    with caches of its own (so every load is served by the hub, not an earlier test's cache)."""
    from localhub.client import hub_client_env

    with hub_client_env(datasets_hub.endpoint, cache_dir=tmp_path / "hf-cache"):
        yield datasets_hub


def use_local_hub_client(monkeypatch: pytest.MonkeyPatch, endpoint: str, hf_cache: Path) -> None:
    """For one test, what HF_ENDPOINT=... HF_HUB_DISABLE_XET=1 would set at import time in this
    process's huggingface_hub (online against the local hub, plain LFS, no telemetry, a private HF
    cache so nothing is served from an earlier test's downloads), and no ambient HF_TOKEN."""
    from huggingface_hub import constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(hf_constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf_cache))
    monkeypatch.delenv("HF_TOKEN", raising=False)


def pytest_addoption(parser):
    parser.addoption(
        "--durations-json",
        metavar="PATH",
        default=None,
        help="write each test's seconds (setup + call + teardown), its tier and outcome to PATH",
    )


DURATIONS: dict[str, dict] = {}
SESSION_STARTED: list[float] = []


def pytest_sessionstart(session):
    SESSION_STARTED.append(time.monotonic())
    if not hasattr(session.config, "workerinput"):  # once a suite, before a lane runs a test
        from quantize_serve.report.base_reference import FOLDER

        shutil.rmtree(Path(os.environ["QS_WORK_DIR"]) / FOLDER, ignore_errors=True)


def pytest_runtest_logreport(report):
    row = DURATIONS.setdefault(report.nodeid, {"seconds": 0.0, "outcome": "passed"})
    row["seconds"] = round(row["seconds"] + report.duration, 2)
    if report.outcome == "failed" or (report.outcome == "skipped" and row["outcome"] == "passed"):
        row["outcome"] = report.outcome  # a skip is reported at setup, a failure at any phase


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--durations-json")
    if not path or not DURATIONS or LANE:  # two lanes: the controller, which sees every report, writes it
        return
    tiers = {
        tier: round(sum(r["seconds"] for n, r in DURATIONS.items() if n.startswith(f"tests/{tier}/")), 1)
        for tier in TIERS
    }
    tests = dict(sorted(DURATIONS.items(), key=lambda kv: -kv[1]["seconds"]))
    Path(path).parent.mkdir(parents=True, exist_ok=True)  # .cache/ on a fresh clone
    Path(path).write_text(
        json.dumps(
            {
                "what": "seconds per test of the last `make test` (setup + call + teardown; session fixtures "
                "are charged to the first test that uses them)",
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                "wall_s": round(time.monotonic() - SESSION_STARTED[0], 1),
                "total_s": round(sum(r["seconds"] for r in DURATIONS.values()), 1),
                "tiers_s": tiers,
                "count": len(DURATIONS),
                "outcomes": {
                    o: sum(1 for r in DURATIONS.values() if r["outcome"] == o)
                    for o in ("passed", "failed", "skipped")
                },
                "tests": tests,
            },
            indent=1,
        )
        + "\n"
    )


def pytest_unconfigure(config):
    shutil.rmtree(TEST_PREFECT_HOME, ignore_errors=True)
