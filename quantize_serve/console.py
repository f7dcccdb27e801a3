"""What ``quantize-serve run`` shows a person: a line as each stage starts and ends (its time and key
figure), a live bar for the long ones on a terminal, and, from the CLI, the decision table at the end.

Everything else the run writes (Prefect's task logs, lm-eval's, llm-compressor's and vLLM's lines as the
flow logs them, progress bars, warnings) goes to ``run.log`` in the run's folder, bars collapsed to a
line each (core/log_stream.py); with ``verbose`` it also streams to the terminal as it comes. The Prefect
API's handler is left alone, so the UI keeps every log line. The stages come as events
(core/progress.py): with stdout not a terminal (CI, tests) only the stage lines are printed.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from quantize_serve.core import progress
from quantize_serve.core.log_stream import BarFrame, ProgressLines
from quantize_serve.gates.decision import Decision

LOG_NAME = "run.log"


class RunLog:
    """The run's full log: lines are kept until the run's folder is known, then go to its run.log."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._pending: list[str] = []
        self._file: TextIO | None = None
        self._lock = threading.Lock()

    def write_line(self, line: str) -> None:
        with self._lock:
            if self._file is None:
                self._pending.append(line)
            else:
                self._file.write(line + "\n")
                self._file.flush()

    def open_in(self, folder: Path) -> None:
        with self._lock:
            if self._file is not None:
                return
            self.path = folder / LOG_NAME
            self._file = self.path.open("a", encoding="utf-8")
            self._file.writelines(line + "\n" for line in self._pending)
            self._file.flush()
            self._pending.clear()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()


class CapturedStream(io.TextIOBase):
    """What replaces sys.stdout or sys.stderr (and the terminal's log handlers' stream) during a run: its
    text goes to the run log as lines, bars collapsed; every bar frame to ``on_frame``; with ``echo``
    the text also goes on to that stream unchanged (``--verbose``)."""

    def __init__(
        self, log: RunLog, *, replaces: TextIO, on_frame: Any = None, echo: TextIO | None = None
    ) -> None:
        super().__init__()
        self.log, self.echo, self.replaces = log, echo, replaces
        self._lines = ProgressLines(on_frame=on_frame)
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            for line in self._lines.feed(text):
                self.log.write_line(line)
        if self.echo is not None:
            self.echo.write(text)
        return len(text)

    def flush(self) -> None:
        if self.echo is not None:
            self.echo.flush()

    def close_lines(self) -> None:
        with self._lock:
            for line in self._lines.close():
                self.log.write_line(line)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.echo is not None and self.echo.isatty()

    def fileno(self) -> int:
        """The replaced stream's: a child process handed this stream writes where it always did."""
        return self.replaces.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


class StageLines:
    """Listens to the run's events and prints them to ``out``: the stage lines, and on a terminal a
    live bar under them for the stage that runs (with its count when it reports one)."""

    def __init__(self, out: TextIO, *, live: bool) -> None:
        self.out = out
        self.running: dict[str, float] = {}  # stage -> when it started
        self.counted_by_name: set[str] = set()  # running stages whose counts name them (progress.Count)
        self.log_path: Path | None = None
        try:
            "✓✗".encode(getattr(out, "encoding", None) or "utf-8")  # a StringIO has none: any text goes
            self.marks = ("✓", "✗")
        except (UnicodeEncodeError, LookupError):
            self.marks = ("ok", "x")
        self._bars: Any = None
        self._bar_ids: dict[str, Any] = {}
        if live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._bars = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[count]}"),
                TimeElapsedColumn(),
                transient=True,
                console=Console(file=out),
                redirect_stdout=False,
                redirect_stderr=False,
                refresh_per_second=4,
            )
            self._bars.start()

    def __call__(self, event: progress.Event) -> None:
        if isinstance(event, progress.StageStarted):
            self.running[event.name] = time.monotonic()
            if self._bars is not None:
                self._bar_ids[event.name] = self._bars.add_task(event.name, total=None, count="")
            else:
                self.print(f"  {event.name} ...")
        elif isinstance(event, progress.StageEnded):
            self.running.pop(event.name, None)
            self.counted_by_name.discard(event.name)
            self._drop_bar(event.name)
            took = "" if event.seconds is None else f"{event.seconds:.0f} s"
            mark = self.marks[0 if event.passed else 1]
            self.print(f"{mark} {event.name:<26}{took:>7}  {event.figure}".rstrip())
        elif isinstance(event, progress.Count):
            self.count(event.label, event.done, event.total, stage=event.stage)
        elif isinstance(event, progress.RunFolder):
            self.log_path = Path(event.path) / LOG_NAME
            self.print(f"  full log: {shown_path(self.log_path)}")

    def count(self, label: str, done: float, total: float | None, *, stage: str | None = None) -> None:
        """``stage``'s bar shows ``label``: done of total. A count that names no stage (lm-eval's bars) is
        the latest-started stage's among those whose counts name none: with quantization beside the base's
        accuracy run, the layers stay on the quantize bar and the documents on the accuracy one."""
        if self._bars is None or not self.running:
            return
        if stage is not None:
            self.counted_by_name.add(stage)
        else:
            unnamed = [s for s in self.running if s not in self.counted_by_name] or list(self.running)
            stage = unnamed[-1]
        if stage in self._bar_ids:
            count = f"{done:,.0f}/{total:,.0f}" if total else f"{done:,.0f}"
            self._bars.update(
                self._bar_ids[stage],
                description=f"{stage}: {label}",
                completed=done,
                total=total,
                count=count,
            )

    def bar_frame(self, frame: BarFrame) -> None:
        """A progress bar drawn in this process (lm-eval's): its count, when it counts to a total."""
        counts = frame.counts()
        if counts and counts[1] and counts[1] > 1:
            self.count(frame.desc or "documents", *counts)

    def print(self, line: str) -> None:
        if self._bars is not None:
            self._bars.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.out, flush=True)

    def finish(self) -> None:
        """The stages still running when the run stopped (an error ended it) end as failed."""
        for name, began in list(self.running.items()):
            self._drop_bar(name)
            self.print(f"{self.marks[1]} {name:<26}{time.monotonic() - began:>5.0f} s  failed")
        self.running.clear()
        if self._bars is not None:
            self._bars.stop()

    def _drop_bar(self, name: str) -> None:
        if self._bars is not None and name in self._bar_ids:
            self._bars.remove_task(self._bar_ids.pop(name))


@contextmanager
def run_console(
    *, verbose: bool, out: TextIO | None = None, handlers: Sequence[logging.Handler] = ()
) -> Iterator[StageLines]:
    """For the duration of a run: sys.stdout and sys.stderr, and ``handlers`` (the log handlers that
    write to the terminal), go to the run log (and on to the terminal with ``verbose``); the stage
    lines go to ``out`` (the terminal's stdout)."""
    out = out or sys.stdout
    err = sys.stderr
    lines = StageLines(out, live=not verbose and out.isatty())
    log = RunLog()
    captured_out = CapturedStream(log, replaces=out, on_frame=lines.bar_frame, echo=out if verbose else None)
    captured_err = CapturedStream(log, replaces=err, on_frame=lines.bar_frame, echo=err if verbose else None)

    def on_event(event: progress.Event) -> None:
        if isinstance(event, progress.RunFolder):
            log.open_in(Path(event.path))
        if not verbose or isinstance(event, progress.RunFolder):  # verbose: the log says the rest
            lines(event)

    restore = [_redirect(h, captured_err) for h in handlers]
    sys.stdout, sys.stderr = captured_out, captured_err
    try:
        with progress.listening(on_event):
            yield lines
    finally:
        sys.stdout, sys.stderr = out, err
        for undo in restore:
            undo()
        captured_out.close_lines()
        captured_err.close_lines()
        log.close()
        lines.finish()


def _redirect(handler: logging.Handler, stream: TextIO) -> Any:
    """Point a stream handler (Prefect's console handler draws through a rich Console) at ``stream``;
    returns what puts it back. Not setStream: it flushes the old stream, which may be closed (a handler
    made while a stream now gone was sys.stderr, as under pytest's capture)."""
    console = getattr(handler, "console", None)
    old, old_file = getattr(handler, "stream", None), getattr(console, "file", None)
    # a handler whose stream is a property (logging's last resort) writes to sys.stderr as it is then
    settable = isinstance(handler, logging.StreamHandler) and not isinstance(
        getattr(type(handler), "stream", None), property
    )
    with _locked(handler):
        if settable:
            handler.stream = stream
        if console is not None:
            console.file = stream

    def undo() -> None:
        with _locked(handler):
            if settable:
                handler.stream = old
            if console is not None:
                console.file = old_file

    return undo


@contextmanager
def _locked(handler: logging.Handler) -> Iterator[None]:
    handler.acquire()
    try:
        yield
    finally:
        handler.release()


def terminal_handlers(kinds: tuple[type[logging.Handler], ...] = ()) -> list[logging.Handler]:
    """Every log handler that writes to the terminal: a stream handler on stdout or stderr, and any
    handler of ``kinds`` (Prefect's console handler, bound to whatever stderr was when it was made)."""
    terminal = {id(s) for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None}
    loggers = [
        logging.getLogger(),
        *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)),
    ]
    found: dict[int, logging.Handler] = {}
    for lg in loggers:
        for h in lg.handlers:
            on_terminal = (
                isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)
                and id(h.stream) in terminal
            )
            if on_terminal or isinstance(h, kinds):
                found[id(h)] = h
    return list(found.values())


def decision_lines(decision: Decision, *, width: int | None = None) -> list[str]:
    """The decision as a table of lines: result, check, reason. Given the terminal's ``width``, a check
    that passed keeps to one screen line (report.md has its whole reason); a failure's reason is whole."""
    name = max((len(c.check) for c in decision.checks), default=0)
    lines = []
    for c in decision.checks:
        line = f"  {'off' if c.off else 'pass' if c.passed else 'FAIL':<4}  {c.check:<{name}}  {c.reason}"
        if width and c.passed and len(line) > width:
            line = line[: width - 3] + "..."
        lines.append(line)
    return lines


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as the terminal shows it: relative to the working folder when inside it."""
    p = Path(path).resolve()
    return p.relative_to(Path.cwd()).as_posix() if p.is_relative_to(Path.cwd()) else str(p)
