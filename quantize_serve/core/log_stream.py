"""A child process's output as log lines a person can read: progress bars collapsed.

Progress bars (tqdm, which llm-compressor, transformers and huggingface_hub all use) redraw one
terminal line with carriage returns; streamed line by line, every redraw becomes a log line (one
AWQ run logged 126 lines of a single grid-search bar). ``ProgressLines`` turns a raw stream into
log lines where a bar shows its latest frame when it finishes, when another bar takes over the
line (nested and ``leave=False`` bars never draw their 100% frame) and at most every
``interval_s`` while it runs; the redraws in between, a bar's empty first frame, the blank frames
that clear a bar and cursor escape codes are dropped. Every other line passes through unchanged.
``on_frame`` sees every frame, redraws included (a live display's counts: :meth:`BarFrame.counts`).
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

# "desc:  35%|███▌      | 7/20 [00:05<00:09,  1.4it/s, best_error=6.5e-06]" (a known total) or
# "desc: 12it [00:03, 3.9it/s]" (an unknown total); desc may be empty.
_KNOWN = re.compile(
    r"^(?P<desc>.*?):?\s*(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<n>[^\s/]+)/(?P<total>\S+) \[[^\]]*\]"
)
_UNKNOWN = re.compile(r"^(?P<desc>.*?):\s*(?P<n>[\d.]+[kMGTP]?)[A-Za-z/]* \[\d+:\d+(?::\d+)?, [^\]]*\]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BREAKS = re.compile(r"\r\n|\r|\n")
_ZERO = re.compile(r"^0(\.0*)?$")


@dataclass
class _Bar:
    desc: str
    frame: str = ""
    n: str = "0"
    total: str | None = None
    emitted_n: str = "0"
    emitted_frame: str = ""  # the last frame reported, or the first one (never worth a line)
    emitted_at: float = 0.0
    done: bool = False


@dataclass(frozen=True)
class BarFrame:
    desc: str
    n: str
    total: str | None  # None: a bar that counts without a total
    finished: bool
    text: str  # the frame itself
    rest: str  # text glued after it (a log line written while the bar was on screen)

    def counts(self) -> tuple[float, float | None] | None:
        """(done, total) as numbers (tqdm's "950k" is 950000); None when done is not a count."""
        done = _number(self.n)
        return None if done is None else (done, _number(self.total) if self.total else None)


_SCALE = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def _number(text: str) -> float | None:
    m = re.fullmatch(r"([\d.]+)([kMGTP]?)", text)
    try:
        return float(m[1]) * _SCALE[m[2]] if m else None
    except ValueError:
        return None


def parse_bar(segment: str) -> BarFrame | None:
    """The progress-bar frame at the start of ``segment``, or None if it is not one."""
    m = _KNOWN.match(segment)
    if m:
        return BarFrame(
            m["desc"].strip(), m["n"], m["total"], m["pct"] == "100", m.group(0), segment[m.end() :]
        )
    m = _UNKNOWN.match(segment)
    if m and m["desc"].strip():
        return BarFrame(m["desc"].strip(), m["n"], None, False, m.group(0), segment[m.end() :])
    return None


class ProgressLines:
    """Feed raw output (any chunking); get back the log lines to emit."""

    def __init__(
        self,
        *,
        interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_frame: Callable[[BarFrame], None] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.on_frame = on_frame
        self._partial = ""
        self._bars: dict[str, _Bar] = {}
        self._current: str | None = None
        self._on_bar_line = False  # text right after a frame shares the terminal line it cleared

    def feed(self, text: str) -> list[str]:
        parts = _BREAKS.split(self._partial + text)
        self._partial = parts.pop()  # the unterminated rest waits for its line break
        out: list[str] = []
        for part in parts:
            self._segment(part, out)
        return out

    def close(self) -> list[str]:
        """End of stream: the unterminated rest, then the last frame of every unfinished bar."""
        out: list[str] = []
        if self._partial:
            self._segment(self._partial, out)
            self._partial = ""
        for bar in self._bars.values():
            self._flush(bar, out)
        self._bars.clear()
        return out

    def _segment(self, raw: str, out: list[str]) -> None:
        segment = _ANSI.sub("", raw).rstrip()
        if self._on_bar_line:
            segment = segment.lstrip()
        if not segment.strip():
            self._on_bar_line = self._on_bar_line or bool(raw)  # spaces clear a bar's line
            return
        frame = parse_bar(segment)
        if frame is None:
            out.append(segment)
            self._on_bar_line = False
            return
        self._on_bar_line = True
        if self.on_frame:
            self.on_frame(frame)
        if self._current not in (None, frame.desc) and self._current in self._bars:
            self._flush(self._bars[self._current], out)  # another bar took over the line
        self._current = frame.desc
        bar = self._bars.setdefault(frame.desc, _Bar(frame.desc, emitted_at=self.clock()))
        if bar.done and frame.finished and frame.n == bar.n:
            pass  # the closing redraw of a bar already reported
        else:
            restarted = (bool(_ZERO.match(frame.n)) and not _ZERO.match(bar.n)) or frame.total != bar.total
            if restarted or bar.done or not bar.frame:  # a bar (re)starts under this name
                first = frame.text if _ZERO.match(frame.n) else ""  # an empty first frame says nothing
                bar.emitted_n, bar.emitted_frame, bar.emitted_at, bar.done = "0", first, self.clock(), False
            bar.frame, bar.n, bar.total = frame.text, frame.n, frame.total
            if frame.finished:
                if bar.emitted_n != bar.n:
                    self._emit(bar, out)
                bar.done, self._current = True, None
            elif bar.n != bar.emitted_n and self.clock() - bar.emitted_at >= self.interval_s:
                self._emit(bar, out)
        if frame.rest.strip():
            self._segment(frame.rest, out)

    def _flush(self, bar: _Bar, out: list[str]) -> None:
        """Report a bar that stops drawing before 100% (another bar took over, or the stream
        ended) if it moved since its last report: progress, or a new postfix such as AWQ's best
        error, whose steps tqdm counts only every TQDM_MININTERVAL."""
        if not bar.done and bar.frame != bar.emitted_frame:
            self._emit(bar, out)

    def _emit(self, bar: _Bar, out: list[str]) -> None:
        out.append(bar.frame)
        bar.emitted_n, bar.emitted_frame, bar.emitted_at = bar.n, bar.frame, self.clock()


def stream_lines(
    stream: IO[bytes],
    emit: Callable[[str], None],
    *,
    interval_s: float = 30.0,
    on_frame: Callable[[BarFrame], None] | None = None,
) -> None:
    """Read a binary stream to its end, emitting collapsed log lines as they arrive.

    Binary on purpose: a text-mode pipe translates every carriage return into a line break, so
    the redraws of a bar could no longer be told from real lines.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    lines = ProgressLines(interval_s=interval_s, on_frame=on_frame)
    read = getattr(stream, "read1", stream.read)
    while chunk := read(65536):
        for line in lines.feed(decoder.decode(chunk)):
            emit(line)
    for line in lines.feed(decoder.decode(b"", final=True)) + lines.close():
        emit(line)
