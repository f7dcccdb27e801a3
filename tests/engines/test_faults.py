"""The fault matrix: one real fault per test, injected into the real engines (issue 11, item 7).

Each test proves four things: what the user sees (a clear error naming the cause and the fix), that
nothing is left running (no vLLM process of that boot, no child process of this test), that nothing
is promoted or left for a rerun to trust, and that no token is printed where a token is involved.

Faults proven elsewhere (not repeated here):
- API server killed during the stress test:
  tests/engines/test_stress.py::test_killed_server_fails_fast_and_leaves_nothing
- a boot that cannot fit its memory:
  tests/engines/test_capacity.py::test_boot_that_cannot_fit_names_the_remedy_and_leaves_nothing
- a cancelled or killed boot: tests/engines/test_capacity.py::test_cancelled_boot_leaves_no_process
- Hub 401/403/404/5xx, dropped upload, lost commit answer, rerun: tests/engines/test_hub.py
- a rerun reuses the checkpoint: tests/engines/test_quantize.py::test_rerun_reuses_checkpoint
- the flow run cancelled from the UI while vLLM runs (it needs the flow tests' Prefect server and
  worker): tests/flows/test_flow.py::test_cancel_from_the_ui_stops_vllm_and_promotes_nothing

vLLM boots are the expensive part (20-30 s each on a 2-core CPU), so one boot serves the accuracy
and capacity faults (the accuracy test kills it, the capacity test then meets the dead server);
the engine-worker faults need a boot each, since each one ends its boot.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import psutil
import pytest

from quantize_serve.core.errors import (
    GateError,
    QuantizationError,
    ServerBootError,
    ServerUnavailableError,
)
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving.server import ServerSpec, vllm_server
from tests.conftest import ROOT, vllm_processes_of
from tests.unit.test_faults import small_disk

RECIPE = load_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml")


MODEL = ROOT / "models" / "tiny-llama"


KV_BYTES = 12_000_000  # the stress tests' budget: ~11.6k 16-bit tokens, more than max_num_seqs needs


def spec(**serve_changes) -> ServerSpec:
    # bf16 weights and a 16-bit KV cache: what vLLM serves on every CPU (quantize_serve/serving/host.py)
    return ServerSpec(
        model_dir=str(MODEL),
        serve=RECIPE.serve.model_copy(update=serve_changes),
        kv_cache_dtype="auto",
        kv_cache_memory_bytes=KV_BYTES,
    )


class Boot:
    """One vLLM boot that a test may end early (close() is idempotent)."""

    def __init__(self, server_spec: ServerSpec, log_path: Path) -> None:
        self.stack, self.log_path, self.spec = ExitStack(), log_path, server_spec
        self.server = self.stack.enter_context(vllm_server(server_spec, log_path=log_path))

    def close(self) -> None:
        self.stack.close()


def wait_until_gone(log_path: Path, within_s: float = 30) -> list:
    """vLLM processes of this boot still alive after ``within_s`` (empty: nothing left)."""
    deadline = time.monotonic() + within_s
    while (left := vllm_processes_of(str(log_path))) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def requests_finished(server) -> float:
    """Requests the server has finished since it started (vLLM's counter, all finish reasons)."""
    try:
        text = server._fetch("/metrics", timeout=2)
    except OSError:
        return -1.0
    return sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)", text, re.M))


class After(threading.Thread):
    """Runs ``action`` once the server has finished ``n`` more requests (or after ``within_s``);
    ``.at`` is when it ran (time.monotonic)."""

    def __init__(self, server, n: int, action, *, within_s: float = 120) -> None:
        super().__init__(daemon=True)
        self.server, self.n, self.action, self.within_s, self.at = server, n, action, within_s, None
        self.start()

    def run(self) -> None:
        start, deadline = requests_finished(self.server), time.monotonic() + self.within_s
        while time.monotonic() < deadline and requests_finished(self.server) < start + self.n:
            time.sleep(0.05)
        self.action()
        self.at = time.monotonic()


@pytest.mark.gpu_host
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "changes, cause, remedy",
    [
        # extra_args travel as vLLM config keys (ServerSpec.vllm_config), so vLLM sees `--no-such-flag 1`
        (
            {"extra_args": ["--no-such-flag=1"]},
            "unrecognized arguments: --no-such-flag",
            "vLLM does not know --no-such-flag",
        ),
        (
            {"max_model_len": 2048},
            "User-specified max_model_len (2048) is greater than the derived max_model_len",
            "serve.max_model_len = 2048 is longer than the model's context (1024 tokens",
        ),
    ],
    ids=["unknown-extra-arg", "max-model-len-beyond-model"],
)
def test_boot_refused_setting_names_cause_and_fix(tmp_path, changes, cause, remedy):
    log = tmp_path / "vllm.log"
    with pytest.raises(ServerBootError) as info:
        with vllm_server(spec(**changes), log_path=log):
            pytest.fail("vLLM booted with a setting it should refuse")
    headline, message = str(info.value).splitlines()[0], str(info.value)
    assert "before it became healthy" in headline and cause in headline, message  # the cause, first
    assert re.search(r"^Remedy: .*" + re.escape(remedy), message, re.M), message
    assert not wait_until_gone(log), "a vLLM process of the refused boot is still running"


@pytest.fixture
def doomed_boot(tmp_path_factory) -> Iterator[Boot]:
    """The base model, booted for one test that kills it (one boot per test: a boot shared
    between a killing test and the next made their result depend on the order they ran in)."""
    boot = Boot(spec(), tmp_path_factory.mktemp("doomed") / "vllm.log")
    yield boot
    boot.close()


@pytest.mark.timeout(300)
def test_vllm_killed_during_accuracy_gate_fails_the_gate_fast(doomed_boot, tmp_path):
    from quantize_serve.gates.accuracy.run import run_accuracy

    server = doomed_boot.server
    killer = After(server, 3, lambda: os.kill(server.pid, signal.SIGKILL))  # once lm-eval is sending
    with pytest.raises(GateError) as info:  # a failed gate, never a skip or an empty result
        run_accuracy(
            server.base_url,
            RECIPE.gates.accuracy,
            tokenizer_dir=str(MODEL),
            max_length=RECIPE.serve.max_model_len,
            base_dir=Path(RECIPE.base_dir),
            output_dir=tmp_path / "accuracy",
        )
    failed_at = time.monotonic()
    killer.join(timeout=5)
    message = str(info.value)
    assert killer.at is not None, "the gate ended before the server was killed"
    print(f"accuracy gate failed {failed_at - killer.at:.1f} s after the kill: {message[:400]}")
    assert server.base_url in message and "stopped answering" in message, message
    assert "Fix:" in message and "read its log" in message, message
    # bounded by lm-eval's own retries (3 attempts, 1-10 s backoff), not its 600 s request timeout
    assert failed_at - killer.at < 45, f"the gate took {failed_at - killer.at:.0f} s to notice a dead server"
    assert not (tmp_path / "accuracy" / "accuracy_run.json").exists()  # no result to compare


@pytest.mark.timeout(240)
def test_capacity_on_a_killed_server_is_a_clear_error_and_leaves_nothing(doomed_boot):
    from quantize_serve.capacity.measure import measure_capacity

    server = doomed_boot.server
    os.kill(server.pid, signal.SIGKILL)
    time.sleep(1)
    try:
        with pytest.raises(ServerUnavailableError) as info:
            measure_capacity(server, doomed_boot.spec, name="base")
    finally:
        doomed_boot.close()  # what the flow's `served` block does on the way out
    message = str(info.value)
    assert "did not answer GET /metrics" in message and f"(pid {server.pid}) has exited" in message, message
    assert "Remedy: the server died while in use" in message and "re-run" in message, message
    assert isinstance(info.value, ConnectionError)  # handlers of OSError still catch it
    assert info.value.__context__ is None  # no urllib traceback chained under it
    assert not wait_until_gone(doomed_boot.log_path), "a vLLM process of the killed boot is still running"


def engine_process(server_pid: int, name: str) -> psutil.Process:
    """vLLM's engine-core (or worker) process below the API server, by its process title."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for p in psutil.Process(server_pid).children(recursive=True):
            try:
                if p.name() == name or (p.cmdline() or [""])[0] == name:
                    return p
            except psutil.Error:
                continue
        time.sleep(0.2)
    titles = [p.name() for p in psutil.Process(server_pid).children(recursive=True)]
    pytest.fail(f"no {name} process below the vLLM server (pid {server_pid}); found {titles}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "target, sig",
    [
        # the engine core is a process of its own on every device; on a GPU host it also holds the GPU memory
        pytest.param("VLLM::EngineCore", signal.SIGKILL, marks=pytest.mark.gpu_host),
        ("VLLM::Worker", signal.SIGILL),  # a process of its own only in vLLM's CPU layout
    ],
    ids=["engine-core-SIGKILL", "worker-SIGILL"],
)
def test_engine_death_during_stress_fails_the_check_and_leaves_nothing(tmp_path, monkeypatch, target, sig):
    """SIGKILL of the engine core is what the OOM killer does to the biggest process; SIGILL of the
    worker is the CPU crash seen on AMX machines (see WARMUP_PROMPT in quantize_serve/serving/server.py).
    vLLM's own CPU layout, with the worker as a process of its own (tests/conftest.py)."""
    from quantize_serve.gates.stress import run_stress_test

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    boot = Boot(spec(), tmp_path / "vllm.log")
    try:
        server = boot.server
        victim = engine_process(server.pid, target)
        assert victim.pid != server.pid
        killer = After(server, 6, lambda: os.kill(victim.pid, sig))
        result = run_stress_test(
            server,
            RECIPE.gates.stress,
            RECIPE.serve,
            tokenizer_dir=str(MODEL),
            output_dir=tmp_path / "stress",
            log=lambda _: None,
        )
        killer.join(timeout=5)
    finally:
        boot.close()
    print(f"{target} {sig.name}: {result.duration_s} s, failures: {result.failures}")
    assert not result.passed and result.server_died, result.failures
    assert any("the server died during the stress test" in f for f in result.failures), result.failures
    assert any("engine" in f.lower() for f in result.failures), result.failures  # vLLM's own reason
    assert result.completed < RECIPE.gates.stress.num_requests and result.throughput is None
    assert result.duration_s < RECIPE.gates.stress.request_timeout_s / 2  # fails fast, no request timeouts
    assert not wait_until_gone(boot.log_path), "a vLLM process of the crashed boot is still running"


@pytest.mark.timeout(300)
def test_disk_full_during_quantization_names_the_disk_and_keeps_nothing(tmp_path, monkeypatch):
    from quantize_serve.core.settings import get_settings
    from quantize_serve.quantize.run import MANIFEST, checkpoint_key, quantize_model
    from quantize_serve.validate.preflight import resolve_base, validate_recipe

    validated = validate_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml")
    base = resolve_base(validated)
    recipe = validated.recipe  # less calibration: the fault is in the save, not in the calibration
    recipe = recipe.model_copy(
        update={"calibration": recipe.calibration.model_copy(update={"num_samples": 16, "max_seq_len": 64})}
    )
    # room for the spec and the config files, not for the weights (the checkpoint is ~1 MB)
    with small_disk(tmp_path, "256k") as disk:
        monkeypatch.setenv("QS_WORK_DIR", str(disk))
        get_settings.cache_clear()
        try:
            with pytest.raises(QuantizationError) as info:
                quantize_model(
                    recipe,
                    Path(base.local_dir),
                    base_identity=base.identity,
                    calibration_fingerprint=validated.calibration_fingerprint,
                    log=lambda _: None,
                )
            left = sorted(p.name for p in (disk / "checkpoints").iterdir())
        finally:
            get_settings.cache_clear()
    message = str(info.value)
    print(message)
    assert message.startswith("the disk is full: no space left on the device under") and str(disk) in message
    assert "QS_WORK_DIR" in message and "Fix: free space there" in message, message
    assert "No space left on device" in message  # what llm-compressor's save hit, kept as evidence
    # nothing a rerun could trust: no checkpoint folder under its key, no half-written one
    key = checkpoint_key(
        recipe, base_identity=base.identity, calibration_fingerprint=validated.calibration_fingerprint
    )
    assert left == [], f"left on the full disk: {left}"
    assert not (disk / "checkpoints" / f"awq-{key}" / MANIFEST).exists()
