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
the engine-worker faults need a boot each, since each one ends its boot."""

from __future__ import annotations

import threading
import time

import pytest


@pytest.mark.timeout(120)
def test_two_runs_queue_on_the_gpu_limit():
    from prefect.client.orchestration import get_client

    from quantize_serve.core.settings import get_settings
    from tasks.serve import gpu_slot

    hold_s, spans, errors = 2.0, {}, []
    ready = threading.Barrier(2)

    def run(name: str) -> None:
        try:
            ready.wait()
            asked = time.monotonic()
            with gpu_slot():
                entered = time.monotonic()
                time.sleep(hold_s)
                spans[name] = (asked, entered, time.monotonic())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not errors, errors
    (_, first_in, first_out), (second_asked, second_in, _) = sorted(spans.values(), key=lambda s: s[1])
    assert second_in >= first_out - 0.05, f"both held the gpu slot at once: {spans}"
    assert second_in - second_asked >= hold_s * 0.8, "the second run did not wait for the first"
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(get_settings().gpu_concurrency_limit)
    assert limit.limit == 1 and limit.active_slots == 0  # both slots given back
