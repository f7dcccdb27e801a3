"""`quantize-serve run`'s console: the stage lines on the terminal, everything else in run.log (fast: the
flow is played by the events and writes it would make)."""

from __future__ import annotations

import io
import logging
import sys

from quantize_serve.console import decision_lines, run_console, terminal_handlers
from quantize_serve.core import progress
from quantize_serve.gates.decision import CheckRow, Decision


class Terminal(io.StringIO):
    def __init__(self, tty: bool = False) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def play_a_run(folder, logger: logging.Logger) -> None:
    """What a run does while the console is on: log lines, prints, a library's bar, the stage events."""
    logger.info("Task run 'validate-recipe' - Finished in state Completed()")
    progress.publish(progress.StageEnded("validate", None, "tiny: awq W4A16_ASYM, 64 calibration samples"))
    progress.publish(progress.RunFolder(str(folder)))
    progress.publish(progress.StageStarted("quantize"))
    progress.count("layers", 2, 5)
    print("[quantize] 64 calibration samples, 5799 tokens")
    for done in range(0, 51, 10):  # lm-eval's bar, drawn in this process
        sys.stderr.write(
            f"\rRequesting API: {done * 2:3d}%|{'#' * (done // 5):<10}| {done}/50 [00:01<00:01, 9.9it/s]"
        )
    sys.stderr.write("\n")
    logger.warning("lm_eval.evaluator - Overwriting default num_fewshot of qs_facts_mc from None to 0")
    progress.publish(progress.StageEnded("quantize", 25.4, "5,799 calibration tokens"))
    progress.publish(progress.StageStarted("stress"))


def test_the_terminal_gets_the_stage_lines_and_run_log_everything_else(tmp_path):
    terminal, handler_terminal = Terminal(), Terminal()
    logger = logging.getLogger("qs-test-console")
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(handler_terminal)  # a log handler drawing on the terminal (Prefect's)
    logger.addHandler(handler)
    try:
        with run_console(verbose=False, out=terminal, handlers=[handler]) as stages:
            play_a_run(tmp_path, logger)
        assert sys.stdout is not None and handler.stream is handler_terminal  # all put back
    finally:
        logger.removeHandler(handler)
    shown = terminal.getvalue().splitlines()
    assert shown == [
        f"✓ {'validate':<26}{'':>7}  tiny: awq W4A16_ASYM, 64 calibration samples",
        f"  full log: {tmp_path / 'run.log'}",
        "  quantize ...",
        f"✓ {'quantize':<26}{'25 s':>7}  5,799 calibration tokens",
        "  stress ...",
        shown[-1],
    ]
    assert shown[-1].startswith("✗ stress") and shown[-1].endswith(
        "failed"
    )  # still running when the run ended
    assert handler_terminal.getvalue() == ""
    log = (tmp_path / "run.log").read_text().splitlines()
    assert stages.log_path == tmp_path / "run.log"
    assert log[0] == "Task run 'validate-recipe' - Finished in state Completed()"  # before the folder: kept
    assert "[quantize] 64 calibration samples, 5799 tokens" in log
    assert [line for line in log if line.startswith("Requesting API")] == [
        "Requesting API: 100%|##########| 50/50 [00:01<00:01, 9.9it/s]"
    ]  # the bar, collapsed to its last frame
    assert log[-1].startswith("lm_eval.evaluator - Overwriting")


def test_verbose_streams_the_log_as_it_comes_and_still_writes_run_log(tmp_path):
    terminal, handler_terminal = Terminal(), Terminal()
    logger = logging.getLogger("qs-test-console-verbose")
    handler = logging.StreamHandler(handler_terminal)
    logger.addHandler(handler)
    try:
        with run_console(verbose=True, out=terminal, handlers=[handler]):
            play_a_run(tmp_path, logger)
    finally:
        logger.removeHandler(handler)
    # the log lines on the terminal (stderr's stream here: handlers go where stderr went), the prints too
    assert "[quantize] 64 calibration samples" in terminal.getvalue()
    assert "stage" not in terminal.getvalue() and "full log: " in terminal.getvalue()
    assert "[quantize] 64 calibration samples, 5799 tokens" in (tmp_path / "run.log").read_text()


def test_a_terminal_gets_a_live_bar_and_the_same_stage_lines(tmp_path):
    terminal = Terminal(tty=True)
    with run_console(verbose=False, out=terminal):
        play_a_run(tmp_path, logging.getLogger("qs-test-console-tty"))
    text = terminal.getvalue()
    assert "✓ quantize" in text and "5,799 calibration tokens" in text and "✗ stress" in text
    assert "  quantize ..." not in text  # the live bar says it


def test_terminal_handlers_finds_the_stream_handlers_on_stdout_and_stderr_and_the_kinds_asked_for():
    on_stderr, on_file, elsewhere = (
        logging.StreamHandler(sys.stderr),
        logging.StreamHandler(io.StringIO()),
        logging.NullHandler(),
    )
    logger = logging.getLogger("qs-test-terminal-handlers")
    for h in (on_stderr, on_file, elsewhere):
        logger.addHandler(h)
    try:
        found = terminal_handlers((logging.NullHandler,))
        assert on_stderr in found and elsewhere in found and on_file not in found
    finally:
        for h in (on_stderr, on_file, elsewhere):
            logger.removeHandler(h)


def test_the_decision_is_a_line_per_check():
    decision = Decision(
        passed=False,
        checks=[
            CheckRow(check="accuracy qs_facts_mc acc", passed=True, reason="recovery 0.99"),
            CheckRow(check="stress", passed=False, reason="2 request(s) got a server error"),
            CheckRow(check="regression", passed=True, off=True, reason="off: no release yet"),
        ],
    )
    assert decision_lines(decision) == [
        "  pass  accuracy qs_facts_mc acc  recovery 0.99",
        "  FAIL  stress                    2 request(s) got a server error",
        "  off   regression                off: no release yet",
    ]
    # on a terminal 40 wide: a passed check keeps to its line, a failure says all of why
    assert decision_lines(decision, width=40) == [
        "  pass  accuracy qs_facts_mc acc  rec...",
        "  FAIL  stress                    2 request(s) got a server error",
        "  off   regression                off...",
    ]


def test_each_stage_ends_with_its_key_figure():
    """The figure a person wants from each stage (tasks/progress.py): a gate that failed ends its line as
    failed, with why."""
    from prefect.states import Completed, Failed

    from quantize_serve.gates.stress import StressResult
    from tasks.progress import key_figure
    from tests.release_fixtures import accuracy_checks, capacity_config, placeholder_checkpoint

    quantized = placeholder_checkpoint(
        seconds=25.0, base_bytes=2_100_000, quantized_bytes=900_000, calibration_tokens=5799
    )
    assert key_figure(quantized) == (True, "5,799 calibration tokens, 2.1 MB -> 0.9 MB")
    capacity = capacity_config(kv_cache_dtype="fp8", kv_cache_tokens=14_464, max_model_len=512)
    figure = "14,464 KV tokens (fp8), max concurrency 28.2 at 512 tokens: measured"
    assert key_figure(capacity) == (True, figure)
    assert key_figure(accuracy_checks()) == (True, "3 of 3 metrics pass, lowest recovery 0.9902")
    stress = StressResult.model_construct(
        requests=50,
        completed=47,
        rejected_overlong=2,
        overlong_expected=2,
        peak_kv_cache_usage=0.25,
        failures=["1 request(s) timed out"],
    )
    assert key_figure(Completed(data=stress)) == (
        False,
        "47/48 requests completed, 2/2 over-long rejected, peak KV 25%; 1 request(s) timed out",
    )
    assert key_figure(Failed(data=RuntimeError("the server died\nits log: ..."))) == (
        False,
        "RuntimeError: the server died",
    )


def test_a_handler_on_a_closed_stream_or_on_whatever_stderr_is_is_redirected_without_a_fuss(tmp_path):
    """Prefect's console handler keeps the stderr of when it was made (under pytest's capture, a stream
    closed since); logging's last resort writes to sys.stderr as it is: both end up in run.log."""
    gone = io.StringIO()
    gone.close()
    logger = logging.getLogger("qs-test-console-closed")
    logger.setLevel(logging.INFO)
    stale, last_resort = logging.StreamHandler(gone), logging._StderrHandler()
    for h in (stale, last_resort):
        logger.addHandler(h)
    try:
        with run_console(verbose=False, out=Terminal(), handlers=[stale, last_resort]):
            progress.publish(progress.RunFolder(str(tmp_path)))
            logger.info("a line from the run")
        assert stale.stream is gone
    finally:
        for h in (stale, last_resort):
            logger.removeHandler(h)
    assert (tmp_path / "run.log").read_text().count("a line from the run") == 2


def test_beside_stages_keep_their_own_counts_on_the_live_bars(tmp_path):
    """Quantization beside the base's accuracy run: the layers (which name their stage) stay on the quantize
    bar, lm-eval's documents (which name none) go to the accuracy bar that started after it."""
    from quantize_serve.quantize.run import STAGE

    terminal = Terminal(tty=True)
    with run_console(verbose=False, out=terminal) as lines:
        progress.publish(progress.StageStarted(STAGE))
        progress.publish(progress.StageStarted("accuracy base"))
        progress.count("layers", 3, 33, stage=STAGE)
        sys.stderr.write("\rRequesting API:  40%|####      | 20/50 [00:01<00:01, 9.9it/s]\n")
        bars = {task.description: task.fields["count"] for task in lines._bars.tasks}
        assert bars == {f"{STAGE}: layers": "3/33", "accuracy base: Requesting API": "20/50"}
        progress.publish(progress.StageEnded(STAGE, 25.4, "5,799 calibration tokens"))
        sys.stderr.write("\rRequesting API:  80%|########  | 40/50 [00:02<00:01, 9.9it/s]\n")
        assert {task.description for task in lines._bars.tasks} == {"accuracy base: Requesting API"}
