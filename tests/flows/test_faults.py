"""Fault-matrix rows that need Prefect (two runs queue on the `gpu` slot): the matrix and its rules are
described in tests/engines/test_faults.py."""

from __future__ import annotations

import threading
import time

import pytest


@pytest.mark.timeout(120)
def test_two_runs_queue_on_the_gpu_limit():
    from prefect.client.orchestration import get_client

    from quantize_serve.core.settings import get_settings
    from tasks.boot import gpu_slot

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
