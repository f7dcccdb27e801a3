"""Work started ahead (quantize_serve/core/ahead.py) is joined before the code that shares its imports runs.

On a GPU host the flow counts calibration's tokens ahead, in a thread, as the base resolves; with a local
base the count in the flow's thread came a second later and imported transformers while the thread still
did: ``ImportError: cannot import name 'AutoTokenizer' from 'transformers'`` (``make demo`` on an H100, 4
runs of 4). The first test fails on that code every time; the second runs the real imports in a fresh
interpreter, as the flow does."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from quantize_serve.core import ahead
from quantize_serve.quantize import calibration
from quantize_serve.recipe.load import load_recipe
from tests.conftest import ROOT

RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"
MODEL = ROOT / "models" / "tiny-llama"


def test_the_count_starts_after_the_work_started_ahead_has_ended(monkeypatch):
    recipe = load_recipe(RECIPE)
    real, events = calibration.load_calibration, []

    def load(r, **kwargs):  # the data both load; the thread that loads it ahead takes its time
        ahead_thread = threading.current_thread() is not threading.main_thread()
        events.append(("ahead" if ahead_thread else "count", "starts"))
        if ahead_thread:
            time.sleep(0.5)
        rows = real(r, **kwargs)
        events.append(("ahead" if ahead_thread else "count", "ends"))
        return rows

    monkeypatch.setattr(calibration, "load_calibration", load)
    future = calibration.count_ahead(recipe)
    tokens = calibration.calibration_tokens(recipe, MODEL)
    assert future.done() and future.exception() is None
    assert events == [("ahead", "starts"), ("ahead", "ends"), ("count", "starts"), ("count", "ends")], events
    assert tokens > recipe.calibration.num_samples


def test_work_ahead_runs_one_piece_at_a_time_and_settle_waits_for_all_of_it():
    running, overlaps, order = [], [], []

    def piece(name: str) -> str:
        overlaps.append(len(running))
        running.append(name)
        time.sleep(0.2)
        order.append(name)
        running.remove(name)
        return name

    futures = [ahead.start(piece, n) for n in ("imports", "task index")]
    failed = ahead.start(lambda: 1 / 0)
    ahead.settle()
    assert all(f.done() for f in [*futures, failed])
    assert order == ["imports", "task index"] and overlaps == [0, 0]
    assert isinstance(failed.exception(), ZeroDivisionError)  # its error stays for whoever takes it
    ahead.settle()  # nothing pending: returns at once


def test_a_settle_that_cancels_waits_only_for_the_piece_under_way():
    began = []
    futures = [ahead.start(lambda n=n: began.append(n) or time.sleep(0.3)) for n in range(3)]
    while not began:
        time.sleep(0.01)
    ahead.settle(cancel=True)
    assert began == [0] and futures[0].exception() is None
    assert all(f.cancelled() for f in futures[1:])


def test_the_count_and_its_work_ahead_import_transformers_in_a_fresh_process():
    """What a GPU host's flow does with a local base, in a process that has not imported transformers yet."""
    code = (
        "from pathlib import Path\n"
        "from quantize_serve.quantize.calibration import calibration_tokens, count_ahead\n"
        "from quantize_serve.recipe.load import load_recipe\n"
        f"r = load_recipe(Path({str(RECIPE)!r}))\n"
        "count_ahead(r)\n"
        f"print(calibration_tokens(r, Path({str(MODEL)!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 0
