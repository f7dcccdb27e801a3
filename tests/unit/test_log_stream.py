"""A child's output as log lines: progress-bar redraws collapsed to a line per bar (fast, no engines)."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

from tqdm import tqdm

from quantize_serve.core.log_stream import ProgressLines, parse_bar, stream_lines


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TtyBuffer(io.StringIO):
    """What tqdm writes to a terminal, kept raw (carriage returns and cursor escapes included)."""

    def isatty(self) -> bool:
        return True


def awq_like_output() -> str:
    """Real tqdm, drawn the way llm-compressor's AWQ draws: an outer 'Smoothing' bar, a nested
    leave=False grid-search bar per layer refreshed on every step by set_postfix, log lines
    written in between, and a plain calibration bar."""
    out = TtyBuffer()
    for i in tqdm(range(8), desc="(1/2): Calibrating", file=out, mininterval=0):
        pass
    layers = ["model.layers.0.input_layernorm", "model.layers.0.mlp.up_proj"]
    for name in tqdm(layers, desc="Smoothing", file=out, mininterval=5):
        out.write("2026-11-30T16:46:12.3621 | get_main_device | WARNING - No accelerator available!\n")
        bar = tqdm(range(20), desc=f"Grid search for {name}", leave=False, file=out, mininterval=5)
        for step in bar:
            bar.set_postfix({"best_error": f"{1e-5 / (step + 1):.3e}"})
    out.write("[quantize] saved in 3.2 s\n")
    return out.getvalue()


def collapse(raw: str, *, chunk: int = 7, clock=None, interval_s: float = 30.0) -> list[str]:
    lines = ProgressLines(interval_s=interval_s, clock=clock or FakeClock())
    out: list[str] = []
    for i in range(0, len(raw), chunk):  # any chunking gives the same lines
        out += lines.feed(raw[i : i + chunk])
    return out + lines.close()


def test_parse_bar_reads_tqdm_frames():
    frame = parse_bar(
        "Grid search for model.layers.1.mlp.up_proj:   0%|          | 0/20 "
        "[00:00<?, ?it/s, best_error=3.451e-04]"
    )
    assert frame and frame.desc == "Grid search for model.layers.1.mlp.up_proj" and frame.n == "0"
    assert not frame.finished
    done = parse_bar("(2/5): Calibrating: 100%|██████████| 8/8 [00:02<00:00,  2.89it/s]")
    assert done and done.finished and done.n == "8" and done.desc == "(2/5): Calibrating"
    glued = parse_bar("Smoothing:  33%|███▎      | 1/3 [00:05<00:11,  5.62s/it]2026-11-30 | x | WARNING")
    assert glued and glued.rest == "2026-11-30 | x | WARNING"
    download = parse_bar("model.safetensors: 100%|██████████| 4.20M/4.20M [00:00<00:00, 50.3MB/s]")
    assert download and download.finished and download.total == "4.20M"
    assert parse_bar("Smoothing: 3it [00:01,  2.10it/s]").n == "3"
    assert parse_bar("2026-11-30T16:46:02 | initialize | INFO - Compression lifecycle initialized") is None


def test_awq_output_collapses_to_a_line_per_bar():
    raw = awq_like_output()
    naive = [p for p in raw.replace("\r", "\n").split("\n") if p.strip()]
    lines = collapse(raw)
    assert len(naive) > 45  # the old streaming: one log line per redraw
    grid = [ln for ln in lines if ln.startswith("Grid search")]
    assert [g.split(":")[0] for g in grid] == [
        "Grid search for model.layers.0.input_layernorm",
        "Grid search for model.layers.0.mlp.up_proj",
    ]
    assert [ln for ln in lines if ln.startswith("(1/2): Calibrating")] == [
        next(ln for ln in lines if "8/8" in ln)
    ]
    assert sum(ln.startswith("Smoothing") for ln in lines) <= 2 and any("2/2" in ln for ln in lines)
    warning = "2026-11-30T16:46:12.3621 | get_main_device | WARNING - No accelerator available!"
    assert lines.count(warning) == 2
    assert lines[-1] == "[quantize] saved in 3.2 s"
    assert not any("\x1b" in ln or not ln.strip() for ln in lines)
    assert len(lines) <= 8, lines


def test_a_long_bar_reports_at_most_every_interval():
    clock = FakeClock()
    lines = ProgressLines(interval_s=30, clock=clock)
    out = lines.feed("step:   0%|          | 0/100 [00:00<?, ?it/s]")
    for n in range(1, 101):
        clock.now += 1.0  # 100 s in all, a redraw every second
        pct = n
        out += lines.feed(f"\rstep: {pct:3d}%|#         | {n}/100 [00:{n:02d}<00:00,  1.00it/s]")
    out += lines.feed("\n") + lines.close()
    assert [ln.split("|")[2].split()[0] for ln in out] == ["30/100", "60/100", "90/100", "100/100"]


def test_plain_lines_pass_through_and_a_dying_bar_is_flushed():
    raw = "loading\r\nfirst line\nstep:  40%|####      | 4/10 [00:02<00:03,  2.00it/s]"
    assert collapse(raw) == ["loading", "first line", "step:  40%|####      | 4/10 [00:02<00:03,  2.00it/s]"]


def test_a_restarted_bar_under_the_same_name_is_reported_again():
    frame = "Preparing cache: {p}%|          | {n}/8 [00:00<00:00, 9.0it/s]"
    raw = "".join("\r" + frame.format(p=p, n=n) for p, n in [(0, 0), (100, 8), (100, 8)])
    raw += "\n" + "".join("\r" + frame.format(p=p, n=n) for p, n in [(0, 0), (100, 8)]) + "\n"
    assert collapse(raw) == [frame.format(p=100, n=8)] * 2


def test_a_bar_that_changes_its_total_is_a_new_bar():
    """AWQ draws 'Smoothing' once with no total (a subgraph without mappings), then with one."""
    raw = (
        "\rSmoothing: 0it [00:00, ?it/s]\rSmoothing: 0it [00:00, ?it/s]\n"
        "\rSmoothing:   0%|          | 0/3 [00:00<?, ?it/s]2026-11-30 | get_main_device | WARNING - w\n"
        "\n\rGrid search for a:   0%|          | 0/20 [00:00<?, ?it/s]\x1b[A"
        "\n\rGrid search for a:   0%|          | 0/20 [00:04<?, ?it/s, best_error=1.3e-03]\x1b[A"
        "\n\r" + " " * 80 + "\x1b[A\rSmoothing: 100%|##########| 3/3 [00:05<00:00,  1.9s/it]\n"
    )
    assert collapse(raw) == [
        "2026-11-30 | get_main_device | WARNING - w",
        "Grid search for a:   0%|          | 0/20 [00:04<?, ?it/s, best_error=1.3e-03]",
        "Smoothing: 100%|##########| 3/3 [00:05<00:00,  1.9s/it]",
    ]


def test_stream_lines_reads_a_child_in_binary():
    """A real child: its carriage returns survive (a text-mode pipe would turn them into lines)."""
    child = textwrap.dedent("""
        import sys
        from tqdm import tqdm
        class Tty:
            def __init__(self, f): self.f = f
            def write(self, s): self.f.write(s)
            def flush(self): self.f.flush()
            def isatty(self): return True
        for _ in tqdm(range(50), desc="work", file=Tty(sys.stderr), mininterval=0):
            pass
        print("done", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    got: list[str] = []
    stream_lines(proc.stdout, got.append)
    assert proc.wait() == 0
    assert len(got) == 2 and got[0].startswith("work: 100%") and "50/50" in got[0] and got[1] == "done"


def test_every_frame_reaches_on_frame_with_its_counts_and_the_layer_count_follows_the_subgraphs():
    """What a live display reads: each frame (redraws too, which the log drops), as numbers; and the
    quantization's count of llm-compressor's subgraphs, "(k/N): Calibrating" (quantize/run.py)."""
    from quantize_serve.core import progress
    from quantize_serve.quantize.run import count_layers

    frames = []
    lines = ProgressLines(on_frame=frames.append)
    logged = lines.feed(awq_like_output()) + lines.close()
    assert len(frames) > len(logged)
    first = frames[0]
    assert (first.desc, first.counts()) == ("(1/2): Calibrating", (0.0, 8.0))
    assert parse_bar("model.safetensors: 100%|██████████| 950k/950k [00:00<00:00, 96.4MB/s]").counts() == (
        950e3,
        950e3,
    )
    assert parse_bar("Generating test split: 395it [00:00, 36367.33it/s]").counts() == (395.0, None)
    counted: list = []
    with progress.listening(counted.append):
        for frame in frames:
            count_layers(frame)
    assert counted and {(c.label, c.total) for c in counted} == {("layers", 2)}
    assert counted[-1].done == 1.0  # "(1/2)" done: one of two subgraphs
