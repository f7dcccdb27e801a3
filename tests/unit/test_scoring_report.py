"""The run report says when context-once scoring was turned off, or kept past a difference, and why
(gates/accuracy/results.py ``scoring_notes``; issue 72: a candidate's check turned it off on an H100 and the
report said nothing)."""

from __future__ import annotations

from quantize_serve.gates.accuracy.results import AccuracyRun, ScoringCheck, scoring_notes
from quantize_serve.report.run_report import write_report
from tests.release_fixtures import failed_checks
from tests.unit.test_report import report_with_capacity

OFF = ScoringCheck(
    path="first",
    checked=32,
    over_tolerance=2,
    disagreed=2,
    largest_nats=0.2856,
    first="(-5.3928, False) against (-5.1072, False)",
    first_tokens=1,
    echo_spread=0.0,
    kept=False,
)
KEPT = OFF.model_copy(
    update={"path": "rows", "over_tolerance": 1, "disagreed": 0, "echo_spread": 0.21, "kept": True}
)


def run(*checks: ScoringCheck) -> AccuracyRun:
    return AccuracyRun(
        server_base_url="http://127.0.0.1:1",
        tasks={},
        seconds=1.0,
        lm_eval_version="0.4.13",
        scoring_checks=checks,
    )


def test_the_report_names_the_check_the_count_the_first_disagreement_and_the_likely_cause(tmp_path):
    quiet = OFF.model_copy(update={"over_tolerance": 0, "disagreed": 0, "echo_spread": None, "kept": True})
    notes = scoring_notes({"base": run(quiet), "candidate": run(OFF, KEPT)})
    assert notes == [f"candidate: {OFF.line()}", f"candidate: {KEPT.line()}"]  # the base agreed: not shown
    report = report_with_capacity().model_copy(
        update={"accuracy": failed_checks("../evals/tasks/qs_facts_mc.yaml"), "scoring": notes}
    )
    files = write_report(report, tmp_path)
    text = files["markdown"].read_text()
    off = (
        "- scoring, candidate: context-once (first) turned off: 2 of 32 checked requests differed from "
        "lm-eval's echo path by more than bf16 noise (first: (-5.3928, False) against (-5.1072, False) "
        "over 1 tokens; largest 0.286 nats), beyond 2x the echo path's own spread (0.000 nats a token when "
        "the same requests were sent again one at a time): not the server's noise but a misread row, a "
        "shifted context boundary or a different quantity; the run scored these requests the echo way"
    )
    assert off in text
    assert (
        "- scoring, candidate: context-once (rows) kept: 1 of 32" in text
        and "batch-dependent numerics" in text
    )
    assert files["json"].read_text().count("context-once (first) turned off: 2 of 32") == 1


def test_a_run_recorded_before_the_checks_were_kept_reads_as_none():
    recorded = run().model_dump(exclude={"scoring_checks"})
    assert AccuracyRun.model_validate(recorded).scoring_checks == []
