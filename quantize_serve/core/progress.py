"""What a person following a run sees, as events: stages that start and end, and the counts of the
long steps (the layers being quantized, lm-eval's documents, the stress test's requests).

The flow's tasks publish them; whoever shows them listens (``quantize-serve run``'s console,
quantize_serve/console.py). Nobody listening (a deployment's worker, the tests) costs a list lookup.
The same stages also go to the run's log (tasks/progress.py), so the Prefect UI keeps them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class StageStarted:
    name: str


@dataclass(frozen=True)
class StageEnded:
    name: str
    seconds: float | None  # None: the stage ran beside others and has no time of its own
    figure: str  # its key figure: "5,799 calibration tokens", "13,696 KV tokens", "passed: ..."
    passed: bool = True


@dataclass(frozen=True)
class Count:
    """How far a long step is: ``done`` of ``total`` (None: not known), e.g. ("requests", 12, 48). ``stage``:
    the stage it counts for, where stages run beside each other (quantization beside the base's accuracy);
    None: the latest stage to start whose counts name no stage."""

    label: str
    done: float
    total: float | None = None
    stage: str | None = None


@dataclass(frozen=True)
class RunFolder:
    """The run's folder, once the flow has made it (where ``run.log`` goes)."""

    path: str


Event = StageStarted | StageEnded | Count | RunFolder
_listeners: list[Callable[[Event], None]] = []
_lock = threading.Lock()


def publish(event: Event) -> None:
    for listener in list(_listeners):
        listener(event)


def count(label: str, done: float, total: float | None = None, *, stage: str | None = None) -> None:
    if _listeners:
        publish(Count(label, done, total, stage))


@contextmanager
def listening(listener: Callable[[Event], None]) -> Iterator[None]:
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)
