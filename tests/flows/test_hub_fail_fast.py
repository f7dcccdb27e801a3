"""Fail fast on the Hub (issue 72): a Hub step the release needs that failed for good (its retries spent)
stops the run's boots and gates within seconds, leaves no vLLM process behind, promotes nothing, and the
run's last words name the step, the Hub and the fix.

The whole flow, in-process against the session's Prefect API, on the tiny AWQ recipe releasing the
session's checkpoint as an existing checkpoint (nothing quantized), with the Hub unreachable: a port
bound here that nobody listens on, so every connection is refused (hub/client.py retries it 4 times,
1 + 2 + 4 s apart). Without the fail-fast the run went on to score the base, boot and score the
candidate and stress it (about a minute here), and failed only after.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
import yaml

from quantize_serve.core import progress
from quantize_serve.recipe.load import apply_overrides
from tests.conftest import ROOT, SERVING_OVERRIDES, vllm_processes_of

TOKEN = "hf_FailFastTestToken0123456789abcdef"
REPO = "quantize-serve/tiny-llama-awq-hub-fail-fast"
HUB_STEPS = ("push-candidate", "find-production-release")


@pytest.fixture
def unreachable_hub(tmp_path, monkeypatch):
    """The Hub client of this process (and of what it starts) pointed at a loopback port that is bound but
    never listened on: a refused connection at once, every time, and no other process can take the port."""
    from localhub.client import hub_client_env
    from quantize_serve.core.settings import get_settings

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{held.getsockname()[1]}"
        with hub_client_env(endpoint, cache_dir=tmp_path / "hf-cache"):
            monkeypatch.setenv("HF_TOKEN", TOKEN)
            monkeypatch.setenv("QS_RUNS_DIR", str(tmp_path / "runs"))
            monkeypatch.setenv("QS_REUSE_BASE_REFERENCE", "false")  # the base boots first, on any machine
            get_settings.cache_clear()
            try:
                yield endpoint
            finally:
                get_settings.cache_clear()


def fail_fast_recipe(folder: Path, checkpoint: str) -> Path:
    """The tiny AWQ recipe releasing ``checkpoint`` as it is, served as this host serves it, one
    perplexity task on 10 documents (what the run would have scored), its own Hub repo."""
    data = yaml.safe_load((ROOT / "recipes" / "tiny-llama-awq.yaml").read_text())
    serve = {k: v for k, v in SERVING_OVERRIDES.items() if k.startswith("serve.")}
    data = apply_overrides(data, serve, source="fail-fast")
    data["name"] = "tiny-llama-awq-hub-fail-fast"
    data["model"]["id"] = str(ROOT / "models" / "tiny-llama")
    data["calibration"]["dataset"] = str(ROOT / "data" / "calibration" / "tiny_calibration.jsonl")
    data["quantization"] = {"checkpoint": checkpoint}
    data["gates"]["accuracy"]["tasks"] = [
        {"task": str(ROOT / "evals" / "tasks" / "qs_heldout_ppl.yaml"), "limit": 10}
    ]
    data["hub"]["repo_id"] = REPO
    path = folder / "tiny-llama-awq-hub-fail-fast.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def task_runs(flow_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def booted(run_dir: Path) -> list[str]:
    """The boots that got their command line (a process only prepared ahead of its boot has none)."""
    return sorted(
        p.name for p in run_dir.glob("vllm-*.log") if "\n$ " in "\n" + p.read_text(errors="replace")
    )


class VllmWatch:
    """Samples, every half second from a thread of its own, whether a vLLM process logging under ``folder``
    lives: the last time one was seen."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.last_seen, self.done = str(folder), None, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.done.wait(0.5):
            for p in vllm_processes_of():
                try:
                    if p.environ().get("QS_SERVER_LOG", "").startswith(self.folder):
                        self.last_seen = time.monotonic()
                except Exception:  # noqa: BLE001 - it ended while we looked
                    continue

    def __enter__(self) -> VllmWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(30)


@pytest.mark.timeout(600)
def test_an_unreachable_hub_stops_the_boots_within_seconds_and_promotes_nothing(
    unreachable_hub, awq_checkpoint, tmp_path
):
    from flows.pipeline import quantize_serve
    from quantize_serve.cli import render_error
    from quantize_serve.core.errors import HubError

    recipe, runs = fail_fast_recipe(tmp_path, awq_checkpoint.checkpoint_dir), tmp_path / "runs"
    events: list[tuple[float, progress.Event]] = []
    with progress.listening(lambda e: events.append((time.monotonic(), e))), VllmWatch(runs) as vllm:
        state = quantize_serve(str(recipe), return_state=True)
        ended = time.monotonic()

    error = state.result(raise_on_failure=False)
    assert state.is_failed() and isinstance(error, HubError), f"{state.type}: {state.message}"
    message = str(error)
    step = next(s for s in HUB_STEPS if message.startswith(s))  # whichever failed first: both did
    assert "failed for good" in message and f"the Hub at {unreachable_hub}" in message, message
    assert REPO in message and "after 4 attempt(s)" in message and "Fix:" in message, message
    assert "promoted nothing" in message and TOKEN not in message
    screen = render_error(error)  # what `quantize-serve run` prints last
    assert len(screen.splitlines()) <= 4 and screen.startswith(f"quantize-serve: {step} failed"), screen

    # the step's line on the screen, the moment it failed for good; no stage started after it
    (blocked_at,) = [
        t for t, e in events if isinstance(e, progress.StageEnded) and e.name == step.replace("-", " ")
    ]
    started = [(e.name, t > blocked_at) for t, e in events if isinstance(e, progress.StageStarted)]
    assert not [name for name, after in started if after], started
    boots = [name for name, _ in started if name.startswith("boot ")]  # the base's alone, on a CPU
    gone = 0.0 if vllm.last_seen is None else vllm.last_seen - blocked_at
    print(f"vLLM gone {gone:.1f} s and the run ended {ended - blocked_at:.1f} s after {step} failed for good")
    assert gone < 10, "the boot went on after the Hub step failed for good"
    # the run's end waits for work started ahead in this process to settle (core/ahead.py: lm-eval's imports
    # and task index, as the base's boot started; 13-17 s on 2 busy cores), never for a boot or a gate
    assert ended - blocked_at < 45, "the run went on after the Hub step failed for good"

    runs_of = {t.name.rsplit("-", 1)[0] for t in task_runs(state.state_details.flow_run_id)}
    assert "promote-or-reject" not in runs_of and "record-results" not in runs_of, sorted(runs_of)
    (run_dir,) = runs.glob("tiny-llama-awq-hub-fail-fast-*")
    assert len(booted(run_dir)) <= len(boots), (booted(run_dir), boots)  # none booted after it
    assert not (run_dir / "report.json").exists()
    left = [p for p in vllm_processes_of() if p.environ().get("QS_SERVER_LOG", "").startswith(str(runs))]
    assert not left, f"vLLM processes of the run outlived it: {[p.pid for p in left]}"
