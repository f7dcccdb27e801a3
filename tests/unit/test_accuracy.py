"""The accuracy gate without a server: recovery arithmetic, task resolution and data paths, and what
an unreachable server gives (tests/engines/test_accuracy.py runs lm-eval against real vLLM)."""


from __future__ import annotations

import math
from pathlib import Path

import pytest

from quantize_serve.core.errors import GateError
from quantize_serve.gates.accuracy import (
    AccuracyRun,
    MetricResult,
    TaskRun,
    absolute_data_paths,
    extract_metrics,
    resolve_task,
    run_accuracy,
)
from quantize_serve.gates.recovery import compare_accuracy
from quantize_serve.recipe.gates import AccuracyGate, AccuracyTask
from quantize_serve.recipe.load import load_recipe
from tests.conftest import ROOT

RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


MODEL_DIR = ROOT / "models" / "tiny-llama"


MC, PPL = "../evals/tasks/qs_facts_mc.yaml", "../evals/tasks/qs_heldout_ppl.yaml"


def make_run(metrics: dict[str, dict[str, tuple[float, bool | None]]]) -> AccuracyRun:
    """{task: {metric: (value, higher_is_better)}} -> AccuracyRun."""
    return AccuracyRun(
        server_base_url="http://test",
        seconds=0.0,
        lm_eval_version="test",
        tasks={
            task: TaskRun(task=task, lm_eval_name=task, num_fewshot=0, limit=None, num_docs=10,
                          seconds=0.0, results_path="/dev/null",
                          metrics={m: MetricResult(value=v, higher_is_better=h) for m, (v, h) in ms.items()})
            for task, ms in metrics.items()
        },
    )


def gate_of(*tasks: AccuracyTask, default: float = 0.95) -> AccuracyGate:
    return AccuracyGate(tasks=list(tasks), default_recovery=default)


def by_metric(checks):
    return {(c.task, c.metric): c for c in checks}


def test_higher_is_better_recovery_is_quantized_over_base():
    base = make_run({"mc": {"acc": (0.80, True), "acc_norm": (0.80, True)}})
    quant = make_run({"mc": {"acc": (0.78, True), "acc_norm": (0.70, True)}})
    checks = by_metric(compare_accuracy(base, quant, gate_of(AccuracyTask(task="mc"))))
    acc, norm = checks["mc", "acc"], checks["mc", "acc_norm"]
    assert acc.recovery == pytest.approx(0.78 / 0.80) and acc.passed and acc.higher_is_better
    assert norm.recovery == pytest.approx(0.70 / 0.80) and not norm.passed
    assert norm.threshold == 0.95 and "<" in norm.reason


def test_lower_is_better_recovery_is_base_over_quantized():
    base = make_run({"ppl": {"word_perplexity": (10.0, False), "bits_per_byte": (1.0, False)}})
    quant = make_run({"ppl": {"word_perplexity": (10.4, False), "bits_per_byte": (1.2, False)}})
    checks = by_metric(compare_accuracy(base, quant, gate_of(AccuracyTask(task="ppl"))))
    wp, bpb = checks["ppl", "word_perplexity"], checks["ppl", "bits_per_byte"]
    assert wp.recovery == pytest.approx(10.0 / 10.4) and wp.passed and wp.higher_is_better is False
    assert bpb.recovery == pytest.approx(1.0 / 1.2) and not bpb.passed
    # a quantized model with a *lower* perplexity recovers more than 100%
    better = compare_accuracy(base, make_run({"ppl": {"word_perplexity": (9.0, False),
                                                      "bits_per_byte": (0.9, False)}}),
                              gate_of(AccuracyTask(task="ppl")))
    assert all(c.passed and c.recovery > 1 for c in better)


def test_per_metric_override_beats_default():
    base = make_run({"mc": {"acc": (0.80, True), "acc_norm": (0.80, True)}})
    quant = make_run({"mc": {"acc": (0.70, True), "acc_norm": (0.70, True)}})
    gate = gate_of(AccuracyTask(task="mc", recovery={"acc": 0.85}), default=0.99)
    checks = by_metric(compare_accuracy(base, quant, gate))
    assert checks["mc", "acc"].threshold == 0.85 and checks["mc", "acc"].passed  # 0.875 >= 0.85
    assert checks["mc", "acc_norm"].threshold == 0.99 and not checks["mc", "acc_norm"].passed


def test_metric_missing_on_one_side_is_a_failed_check():
    base = make_run({"mc": {"acc": (0.8, True), "acc_norm": (0.8, True)}})
    quant = make_run({"mc": {"acc": (0.8, True), "f1": (0.5, True)}})
    checks = by_metric(compare_accuracy(base, quant, gate_of(AccuracyTask(task="mc"))))
    assert checks["mc", "acc"].passed
    assert not checks["mc", "acc_norm"].passed and "quantized" in checks["mc", "acc_norm"].reason
    assert checks["mc", "acc_norm"].base == 0.8 and checks["mc", "acc_norm"].quantized is None
    assert not checks["mc", "f1"].passed and "base" in checks["mc", "f1"].reason


def test_override_for_a_metric_nobody_reported_fails():
    run = make_run({"mc": {"acc": (0.8, True)}})
    checks = by_metric(compare_accuracy(run, run, gate_of(AccuracyTask(task="mc", recovery={"acc_nrom": 0.9}))))
    assert checks["mc", "acc"].passed
    typo = checks["mc", "acc_nrom"]
    assert not typo.passed and typo.threshold == 0.9 and "override" in typo.reason


def test_task_missing_from_a_run_fails_not_skips():
    base = make_run({"mc": {"acc": (0.8, True)}, "ppl": {"word_perplexity": (5.0, False)}})
    quant = make_run({"mc": {"acc": (0.8, True)}})
    checks = compare_accuracy(base, quant, gate_of(AccuracyTask(task="mc"), AccuracyTask(task="ppl")))
    failed = [c for c in checks if not c.passed]
    assert [(c.task, c.metric) for c in failed] == [("ppl", "*")]
    assert "quantized" in failed[0].reason


@pytest.mark.parametrize(
    ("base", "quant", "higher", "passed", "words"),
    [
        (0.8, math.nan, True, False, "finite"),
        (math.inf, 5.0, False, False, "finite"),
        (0.8, 0.8, None, False, "higher is better"),
        (-1.0, -1.1, True, False, "non-negative"),
        (0.0, 0.0, True, True, "does not measure"),
        (0.0, 0.1, True, True, "inf"),
    ],
)
def test_values_that_give_no_ratio(base, quant, higher, passed, words):
    checks = compare_accuracy(make_run({"t": {"m": (base, higher)}}), make_run({"t": {"m": (quant, higher)}}),
                              gate_of(AccuracyTask(task="t")))
    assert len(checks) == 1 and checks[0].passed is passed and words in checks[0].reason


def test_identical_runs_recover_fully():
    run = make_run({"mc": {"acc": (0.9, True)}, "ppl": {"word_perplexity": (2.1, False)}})
    checks = compare_accuracy(run, run, gate_of(AccuracyTask(task="mc"), AccuracyTask(task="ppl"), default=1.0))
    assert [c.recovery for c in checks] == [1.0, 1.0] and all(c.passed for c in checks)


def test_extract_metrics_skips_stderr_and_keeps_filters():
    results = {
        "results": {"gsm": {"alias": "gsm", "sample_len": 5, "exact_match,strict-match": 0.5,
                            "exact_match_stderr,strict-match": 0.1, "exact_match,flexible-extract": 0.6,
                            "exact_match_stderr,flexible-extract": "N/A", "acc,none": 0.4}},
        "higher_is_better": {"gsm": {"exact_match": True, "acc": True}},
    }
    metrics = extract_metrics(results, "gsm")
    assert set(metrics) == {"exact_match,strict-match", "exact_match,flexible-extract", "acc"}
    assert metrics["exact_match,strict-match"].stderr == 0.1
    assert metrics["exact_match,flexible-extract"].stderr is None
    assert all(m.higher_is_better for m in metrics.values())


def test_extract_metrics_of_a_tag_prefixes_members():
    results = {"results": {"a": {"acc,none": 0.5}, "b": {"acc,none": 0.7}},
               "higher_is_better": {"a": {"acc": True}, "b": {"acc": True}}}
    assert set(extract_metrics(results, "my_tag")) == {"a/acc", "b/acc"}


def test_task_yaml_data_paths_become_absolute_whatever_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(RECIPE)
    for task, data in ((MC, "facts_mc.jsonl"), (PPL, "heldout_ppl.jsonl")):
        spec = resolve_task(AccuracyTask(task=task), Path(recipe.base_dir))
        data_file = Path(spec.load_spec["dataset_kwargs"]["data_files"]["test"])
        assert data_file == ROOT / "data" / "evals" / data and data_file.is_file()
        assert spec.include_path == ROOT / "evals" / "tasks"
    named = resolve_task(AccuracyTask(task="hellaswag"), ROOT)
    assert named.load_spec == "hellaswag" and named.include_path is None


def test_absolute_data_paths_leaves_hub_and_absolute_paths_alone(tmp_path):
    config = {"task": "t", "dataset_path": "../data", "dataset_kwargs": {
        "data_files": {"test": ["a.jsonl", "/abs/b.jsonl", "hf://datasets/x/c.jsonl"]}, "data_dir": "d"}}
    out = absolute_data_paths(config, tmp_path / "tasks")
    assert out["dataset_path"] == str(tmp_path / "data")
    assert out["dataset_kwargs"]["data_files"]["test"] == [
        str(tmp_path / "tasks" / "a.jsonl"), "/abs/b.jsonl", "hf://datasets/x/c.jsonl"]
    assert out["dataset_kwargs"]["data_dir"] == str(tmp_path / "tasks" / "d")
    assert config["dataset_kwargs"]["data_dir"] == "d"  # the input is not modified
    assert absolute_data_paths({"task": "t", "dataset_path": "json"}, tmp_path)["dataset_path"] == "json"


def test_missing_task_file_is_a_gate_error(tmp_path):
    gate = gate_of(AccuracyTask(task="evals/nope.yaml"))
    with pytest.raises(GateError, match="does not exist.*relative to the recipe's folder"):
        run_accuracy("http://127.0.0.1:9", gate, tokenizer_dir=str(MODEL_DIR), max_length=512,
                     base_dir=tmp_path, output_dir=tmp_path / "out")


def test_unreachable_server_is_a_gate_error_through_the_prefect_task(tmp_path):
    from quantize_serve.serving.server import free_port
    from tasks.accuracy import run_accuracy as run_accuracy_task

    assert run_accuracy_task.name == "run-accuracy" and run_accuracy_task.retries == 0
    gate = load_recipe(RECIPE).gates.accuracy
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GateError, match="did not answer"):
        run_accuracy_task.fn(url, gate, tokenizer_dir=str(MODEL_DIR), max_length=512,
                             base_dir=RECIPE.parent, output_dir=tmp_path)


def test_a_group_aggregate_without_a_direction_takes_the_one_its_members_agree_on():
    """lm-eval 0.4.13's mmlu: the group row has acc but no higher_is_better; its 57 tasks (in four
    sub-groups) all say acc: True. Members that disagree give no direction (the check then fails)."""
    results = {
        "results": {"mmlu": {"alias": "mmlu", "acc,none": 0.25, "acc_stderr,none": "N/A"},
                    "mmlu_anatomy": {"acc,none": 0.2}, "mmlu_virology": {"acc,none": 0.3}},
        "group_subtasks": {"mmlu": ["mmlu_stem", "mmlu_other"], "mmlu_stem": ["mmlu_anatomy"],
                           "mmlu_other": ["mmlu_virology"]},
        "higher_is_better": {"mmlu_anatomy": {"acc": True}, "mmlu_virology": {"acc": True}},
    }
    assert extract_metrics(results, "mmlu")["acc"].higher_is_better is True
    results["higher_is_better"]["mmlu_virology"] = {"acc": False}
    assert extract_metrics(results, "mmlu")["acc"].higher_is_better is None


def test_a_group_counts_the_documents_of_its_tasks():
    """lm-eval counts documents per task only: mmlu at limit 20 is its tasks' 20 each. The count
    feeds gates.accuracy.min_samples and the run's log line (it said "None documents" for mmlu)."""
    from quantize_serve.gates.accuracy import _num_docs

    results = {
        "group_subtasks": {"mmlu": ["mmlu_stem", "mmlu_other"], "mmlu_stem": ["mmlu_anatomy"],
                           "mmlu_other": ["mmlu_virology", "mmlu_nutrition"]},
        "n-samples": {"mmlu_anatomy": {"original": 135, "effective": 20},
                      "mmlu_virology": {"original": 166, "effective": 20},
                      "mmlu_nutrition": {"original": 306, "effective": 20},
                      "gsm8k": {"original": 1319, "effective": 500}},
    }
    assert _num_docs(results, "mmlu") == 60
    assert _num_docs(results, "mmlu_other") == 40
    assert _num_docs(results, "gsm8k") == 500
    del results["n-samples"]["mmlu_virology"]
    assert _num_docs(results, "mmlu") is None  # one task uncounted: unknown, not an undercount
    assert _num_docs(results, "arc_challenge") is None
