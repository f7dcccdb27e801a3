"""Recovery with its uncertainty: the ~95% interval from lm-eval's stderrs, the warning when it
crosses the threshold, gates.accuracy.on_uncertain and gates.accuracy.min_samples (all pure).

Expected intervals are worked out by hand below each case (delta method, 1.96 standard errors);
the stderrs are picked so the relative errors form a 3-4-5 triangle and the square root is exact.
"""

from __future__ import annotations

import pytest

from quantize_serve.gates.accuracy import AccuracyRun, MetricResult, TaskRun, extract_metrics
from quantize_serve.gates.decision import accuracy_rows
from quantize_serve.gates.recovery import check_metric, compare_accuracy
from quantize_serve.recipe.gates import AccuracyGate, AccuracyTask


def run_of(metrics: dict[str, MetricResult], num_docs: int | None = 500) -> AccuracyRun:
    return AccuracyRun(server_base_url="http://test", seconds=0.0, lm_eval_version="test", tasks={
        "mc": TaskRun(task="mc", lm_eval_name="mc", num_fewshot=0, limit=None, num_docs=num_docs,
                      metrics=metrics, seconds=0.0, results_path="/dev/null")})


def acc(value: float, stderr: float | None) -> MetricResult:
    return MetricResult(value=value, stderr=stderr, higher_is_better=True)


# base 0.80 +- 0.024 (3 %), quantized 0.76 +- 0.0304 (4 %): r = 0.95, relative se = sqrt(.03^2 + .04^2)
# = 0.05, se_r = 0.95 * 0.05 = 0.0475, 1.96 * 0.0475 = 0.0931 -> [0.8569, 1.0431]
WIDE = (acc(0.80, 0.024), acc(0.76, 0.0304))


def test_interval_of_a_higher_is_better_metric_by_hand():
    check = check_metric("mc", "acc", *WIDE, threshold=0.9)
    assert check.recovery == pytest.approx(0.95)
    assert check.recovery_interval == pytest.approx((0.8569, 1.0431), abs=1e-9)
    assert check.recovery_text == "0.9500 [0.857, 1.043]"
    assert "0.9500 [0.857, 1.043] >= 0.9" in check.reason


def test_interval_of_a_lower_is_better_metric_by_hand():
    # base 2.0 +- 0.06 (3 %), quantized 2.5 +- 0.1 (4 %): r = base/quantized = 0.8, se_r = 0.8 * 0.05 = 0.04,
    # 1.96 * 0.04 = 0.0784 -> [0.7216, 0.8784]: wholly below 0.95, so a plain failure, no warning
    base = MetricResult(value=2.0, stderr=0.06, higher_is_better=False)
    quant = MetricResult(value=2.5, stderr=0.1, higher_is_better=False)
    check = check_metric("ppl", "loss", base, quant, threshold=0.95)
    assert check.recovery == pytest.approx(0.8)
    assert check.recovery_interval == pytest.approx((0.7216, 0.8784), abs=1e-9)
    assert not check.passed and check.warning == ""
    assert "base/quantized (lower is better) = 0.8000 [0.722, 0.878] < 0.95" in check.reason


def test_a_narrow_interval_clear_of_the_threshold_carries_no_warning():
    # base 0.5 +- 0.003 (0.6 %), quantized 0.49 +- 0.00392 (0.8 %): r = 0.98, relative se = 0.01,
    # se_r = 0.0098, 1.96 * 0.0098 = 0.019208 -> [0.960792, 0.999208], above 0.95
    check = check_metric("mc", "acc", acc(0.5, 0.003), acc(0.49, 0.00392), threshold=0.95)
    assert check.recovery_interval == pytest.approx((0.960792, 0.999208), abs=1e-9)
    assert check.passed and check.warning == ""


def test_a_failing_point_whose_upper_end_crosses_is_warned():
    # base 0.5 +- 0.015 (3 %), quantized 0.46 +- 0.0184 (4 %): r = 0.92, se_r = 0.046,
    # 1.96 * 0.046 = 0.09016 -> [0.82984, 1.01016]: the point fails, the upper end is above 0.95
    check = check_metric("mc", "acc", acc(0.5, 0.015), acc(0.46, 0.0184), threshold=0.95)
    assert check.recovery_interval == pytest.approx((0.82984, 1.01016), abs=1e-9)
    assert not check.passed
    assert check.warning == ("recovery 0.9200 [0.830, 1.010] crosses the threshold 0.95: too few samples to "
                             "be sure; raise limit (gates.accuracy.tasks[].limit)")


def test_stderr_na_gives_no_interval_and_no_warning():
    results = {"results": {"ppl": {"word_perplexity,none": 12.0, "word_perplexity_stderr,none": "N/A",
                                   "acc,none": 0.5, "acc_stderr,none": float("nan")}},
               "higher_is_better": {"ppl": {"word_perplexity": False, "acc": True}}}
    base = extract_metrics(results, "ppl")
    assert base["word_perplexity"].stderr is None and base["acc"].stderr is None
    quant = MetricResult(value=12.5, stderr=None, higher_is_better=False)
    check = check_metric("ppl", "word_perplexity", base["word_perplexity"], quant, threshold=0.95)
    assert check.recovery == pytest.approx(0.96) and check.passed
    assert check.recovery_interval is None and check.warning == ""
    assert check.recovery_text == "0.9600" and "[" not in check.reason
    # the same with on_uncertain: fail: nothing to be uncertain about
    assert check_metric("ppl", "word_perplexity", base["word_perplexity"], quant, threshold=0.95,
                        on_uncertain="fail").passed


@pytest.mark.parametrize("on_uncertain, passed", [("warn", True), ("fail", False)])
def test_interval_crossing_the_threshold_warns_or_fails(on_uncertain, passed):
    gate = AccuracyGate(tasks=[AccuracyTask(task="mc", recovery={"acc": 0.9})], on_uncertain=on_uncertain)
    [check] = compare_accuracy(run_of({"acc": WIDE[0]}), run_of({"acc": WIDE[1]}), gate)
    assert check.passed is passed
    assert check.warning.startswith("recovery 0.9500 [0.857, 1.043] crosses the threshold 0.9: too few "
                                    "samples to be sure; raise limit")
    [row] = accuracy_rows([check])
    assert row.passed is passed
    assert row.reason.startswith("recovery 0.9500 [0.857, 1.043] >= 0.90 (base 0.8, quantized 0.76)")
    cause = "warning" if passed else "failed (gates.accuracy.on_uncertain: fail)"
    assert f"; {cause}: recovery 0.9500 [0.857, 1.043] crosses" in row.reason
    assert ("on_uncertain is 'fail'" in check.reason) is (not passed)


def test_min_samples_fails_a_task_with_too_few_documents():
    gate = AccuracyGate(tasks=[AccuracyTask(task="mc")], min_samples=200)
    checks = compare_accuracy(run_of({"acc": acc(0.5, 0.01)}, num_docs=50),
                              run_of({"acc": acc(0.5, 0.01)}, num_docs=50), gate)
    samples = [c for c in checks if c.metric == "samples"]
    assert [c.passed for c in checks if c.metric == "acc"] == [True]
    assert len(samples) == 1 and not samples[0].passed
    reason = samples[0].reason
    assert "'mc'" in reason and "50 documents" in reason and "min_samples = 200" in reason
    assert "Fix: raise the task's limit" in reason
    [_, row] = accuracy_rows(checks)
    assert row.check == "accuracy mc samples" and not row.passed and row.reason == reason


def test_min_samples_passes_enough_documents_and_fails_an_unknown_count():
    gate = AccuracyGate(tasks=[AccuracyTask(task="mc")], min_samples=200)
    enough = compare_accuracy(run_of({"acc": acc(0.5, 0.01)}, num_docs=200),
                              run_of({"acc": acc(0.5, 0.01)}, num_docs=200), gate)
    assert [c.metric for c in enough] == ["acc"] and all(c.passed for c in enough)
    unknown = compare_accuracy(run_of({"acc": acc(0.5, 0.01)}, num_docs=None),
                               run_of({"acc": acc(0.5, 0.01)}, num_docs=200), gate)
    [samples] = [c for c in unknown if c.metric == "samples"]
    assert not samples.passed and "did not report how many documents" in samples.reason


def test_report_and_card_show_the_interval():
    from quantize_serve.gates.decision import Decision
    from quantize_serve.quantize.run import QuantizeResult
    from quantize_serve.release.card import AccuracyRow, ModelCardInputs, Provenance, render_model_card
    from quantize_serve.report.run_report import RunReport, render_markdown
    from quantize_serve.validate.preflight import BaseModelRef

    check = check_metric("mc", "acc", *WIDE, threshold=0.9)
    report = RunReport(
        run_id="r", recipe="x", recipe_source="recipes/x.yaml", recipe_sha256="0" * 64,
        base=BaseModelRef(local_dir="models/tiny-llama", sha="1" * 64),
        checkpoint=QuantizeResult(checkpoint_dir="c", method="awq", scheme="W4A16", seconds=1.0, base_bytes=2,
                                  quantized_bytes=1, calibration_fingerprint="2" * 64, engine_versions={}),
        accuracy=[check], decision=Decision(passed=True, checks=accuracy_rows([check])),
        serving_command="vllm serve c")
    text = render_markdown(report)
    assert "| 0.9500 [0.857, 1.043] | 0.90 | pass, uncertain |" in text
    assert "warning: recovery 0.9500 [0.857, 1.043] crosses the threshold 0.9" in text  # the decision

    row = AccuracyRow(task="mc", dataset="local:mc", metric="acc", base=0.8, quantized=0.76, recovery=0.95,
                      recovery_interval=check.recovery_interval, threshold=0.9, passed=True)
    card = render_model_card(ModelCardInputs(repo_id="org/m", base_model="org/base", method="awq",
                                             scheme="W4A16", group_size=128, accuracy=[row],
                                             provenance=Provenance(recipe_sha256="0" * 64)))
    assert "| 0.9500 [0.857, 1.043] | 0.9 | yes |" in str(card)
