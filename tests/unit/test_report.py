"""The report's charts: a relative link on disk (report.md, the model card ship the PNG beside it),
the PNG itself inline for the Prefect UI's markdown artifact, which has no folder to resolve a link."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from quantize_serve.capacity.chart import CHART
from quantize_serve.capacity.measure import CapacityReport
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.report.run_report import (
    ReleaseRejected,
    RunReport,
    render_markdown,
    report_of,
    write_report,
)
from quantize_serve.validate.preflight import BaseModelRef
from tests.release_fixtures import bare_report, capacity_config, failed_checks


def report_with_capacity() -> RunReport:
    configs = [
        capacity_config(
            name=name, kv_cache_dtype=dtype, weights_bytes=w, kv_cache_memory_bytes=kv, kv_cache_tokens=t
        )
        for name, dtype, w, kv, t in [
            ("base", "auto", 2_000_000, 6_000_000, 6016),
            ("w4a16", "bfloat16", 900_000, 7_000_000, 7168),
            ("w4a16-fp8kv", "fp8", 900_000, 7_000_000, 14464),
        ]
    ]
    return bare_report(
        recipe_source="recipes/x.yaml",
        capacity=CapacityReport(
            method="fixed budget",
            budget_bytes=8_000_000,
            configs=configs,
            freed_weight_bytes=1_100_000,
            fp8_token_ratio=2.0,
            gain_quantized=1.19,
            gain_fp8=2.4,
            planner=[],
        ),
    )


def test_report_on_disk_links_the_chart_and_the_ui_copy_embeds_it(tmp_path):
    report = report_with_capacity()
    paths = write_report(report, tmp_path)

    assert f"![capacity]({CHART})" in paths["markdown"].read_text()
    inline = render_markdown(report, embed_images=True)
    m = re.search(r"!\[capacity\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", inline)
    assert m and base64.b64decode(m.group(1)) == (tmp_path / CHART).read_bytes()
    assert inline.replace(m.group(0), f"![capacity]({CHART})") == paths["markdown"].read_text()


def test_nothing_to_embed_keeps_the_link():
    report = report_with_capacity()  # never written: no report folder, no chart file
    assert f"![capacity]({CHART})" in render_markdown(report, embed_images=True)


def test_pushed_card_names_no_machine_path(awq_recipe, tmp_path):
    """The card that goes to the Hub: local folders (the base model, the checkpoint under the work
    dir) appear by repo id, project-relative path or folder name, never as this machine's path."""
    from quantize_serve.capacity.measure import published_serve_command
    from quantize_serve.core.settings import PROJECT_ROOT
    from quantize_serve.release.card import render_model_card, report_card_inputs
    from quantize_serve.validate.preflight import ValidatedRecipe

    ckpt = tmp_path / "work" / "checkpoints" / "tiny-llama-awq-0123abcd"
    validated = ValidatedRecipe(
        recipe=awq_recipe,
        source=str(PROJECT_ROOT / "recipes/tiny-llama-awq.yaml"),
        recipe_sha256="0" * 64,
        calibration_fingerprint="2" * 64,
    )
    report = report_with_capacity().model_copy(
        update={
            "base": BaseModelRef(local_dir=str(PROJECT_ROOT / "models/tiny-llama"), sha="1" * 64),
            "checkpoint": report_with_capacity().checkpoint.model_copy(update={"checkpoint_dir": str(ckpt)}),
            "serving_command": published_serve_command(awq_recipe, ckpt),
        }
    )
    for status in ("candidate", "promoted"):
        card = str(render_model_card(report_card_inputs(validated, report, status=status)))
        assert str(PROJECT_ROOT) not in card and str(tmp_path) not in card, card
        assert (
            "vllm serve quantize-serve/tiny-llama-awq-w4a16 --revision production " in card
        )  # the release ref
    assert str(PROJECT_ROOT) not in render_markdown(report)


# --------------------------------------------------------------------------------------------
# What the card and the report name: lm-eval task names and dataset ids, the serving vLLM, the run
# --------------------------------------------------------------------------------------------


def write_lm_eval_results(folder, configs: dict, groups: dict | None = None) -> None:
    """lm-eval's raw results as run_accuracy leaves them (only the keys the report reads)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lm_eval_x.json").write_text(json.dumps({"configs": configs, "group_subtasks": groups or {}}))


def test_a_task_file_is_named_by_its_task_and_its_data_by_id_and_content():
    from quantize_serve.core.digest import file_sha256
    from quantize_serve.core.settings import PROJECT_ROOT
    from quantize_serve.report.provenance import eval_task_ref

    ref = eval_task_ref("../evals/tasks/qs_facts_mc.yaml", base_dir=PROJECT_ROOT / "recipes")
    assert (ref.task, ref.dataset, ref.dataset_split) == ("qs_facts_mc", "local:facts_mc", "test")
    assert ref.dataset_revision == file_sha256(PROJECT_ROOT / "data/evals/facts_mc.jsonl")


def test_a_named_task_takes_its_dataset_from_what_lm_eval_ran(tmp_path):
    from quantize_serve.report.provenance import eval_task_refs

    write_lm_eval_results(
        tmp_path / "accuracy-quantized",
        {
            "gsm8k": {
                "task": "gsm8k",
                "dataset_path": "openai/gsm8k",
                "dataset_name": "main",
                "test_split": "test",
            },
            **{
                f"mmlu_{s}": {"dataset_path": "cais/mmlu", "dataset_name": s, "test_split": "test"}
                for s in ("anatomy", "virology")
            },
        },
        groups={"mmlu": ["mmlu_anatomy", "mmlu_virology"]},
    )
    refs = eval_task_refs(["gsm8k", "mmlu", "hellaswag"], base_dir=tmp_path, report_dir=str(tmp_path))
    assert refs["gsm8k"].model_dump() == {
        "task": "gsm8k",
        "dataset": "openai/gsm8k",
        "dataset_config": "main",
        "dataset_split": "test",
        "dataset_revision": None,
    }
    assert (refs["mmlu"].dataset, refs["mmlu"].dataset_config) == ("cais/mmlu", None)  # a group, one dataset
    assert refs["hellaswag"].dataset == "hellaswag"  # no record of what ran: the task's own name, no guess


def test_a_run_url_on_this_machine_is_not_published():
    from quantize_serve.report.provenance import public_url

    assert (
        public_url("https://prefect.example.com/runs/flow-run/1")
        == "https://prefect.example.com/runs/flow-run/1"
    )
    assert public_url("http://127.0.0.1:4200/runs/flow-run/1") is None
    assert public_url("http://localhost:4200/runs/flow-run/1") is None and public_url(None) is None


def test_run_url_is_prefects_ui_page_of_the_flow_run_or_none(monkeypatch):
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    from tasks import report as report_tasks

    monkeypatch.setattr(report_tasks.flow_run, "get_id", lambda: "0b7e")
    with temporary_settings({PREFECT_UI_URL: "https://prefect.example.com", PREFECT_API_URL: None}):
        assert report_tasks.run_url() == "https://prefect.example.com/runs/flow-run/0b7e"
    with temporary_settings(restore_defaults={PREFECT_UI_URL, PREFECT_API_URL}):  # ephemeral API: no UI
        assert report_tasks.run_url() is None
    monkeypatch.setattr(report_tasks.flow_run, "get_id", lambda: None)
    assert report_tasks.run_url() is None


def test_report_names_tasks_the_serving_vllm_and_the_run(tmp_path, monkeypatch):
    from quantize_serve.report import run_report as report_module

    monkeypatch.setattr(report_module, "serving_vllm_version", lambda: "0.32.0")
    report = report_with_capacity().model_copy(
        update={
            "recipe_source": "recipes/tiny-llama-awq.yaml",
            "accuracy": failed_checks("../evals/tasks/qs_facts_mc.yaml"),
            "run_url": "https://prefect.example.com/runs/flow-run/r",
        }
    )
    text = write_report(report, tmp_path)["markdown"].read_text()
    assert report.vllm_version == "0.32.0" and "- served with vLLM 0.32.0" in text
    assert "run `r` (https://prefect.example.com/runs/flow-run/r)" in text
    assert "| qs_facts_mc | local:facts_mc | acc |" in text and "evals/tasks" not in text


def test_gated_card_names_tasks_and_datasets_never_paths(awq_recipe, tmp_path):
    """The card of a rejected run: model-index, the table and the reasons (the decision's rows, named by
    report/provenance.py task_labels) say `qs_facts_mc` and `openai/gsm8k`, not the recipe's
    `../evals/tasks/qs_facts_mc.yaml`."""
    from quantize_serve.gates.decision import decide
    from quantize_serve.report.provenance import task_labels
    from quantize_serve.release.card import render_model_card, report_card_inputs
    from quantize_serve.validate.preflight import ValidatedRecipe

    validated = ValidatedRecipe(
        recipe=awq_recipe,
        source="recipes/tiny-llama-awq.yaml",
        recipe_sha256="0" * 64,
        calibration_fingerprint="2" * 64,
    )
    write_lm_eval_results(
        tmp_path / "accuracy-quantized",
        {"gsm8k": {"dataset_path": "openai/gsm8k", "dataset_name": "main", "test_split": "test"}},
    )
    spelled = "../evals/tasks/qs_facts_mc.yaml"
    report = report_with_capacity().model_copy(
        update={
            "accuracy": failed_checks(spelled, "gsm8k"),
            "report_dir": str(tmp_path),
            "vllm_version": "0.32.0",
            "run_url": "http://127.0.0.1:4200/runs/flow-run/r",
            "decision": decide(
                failed_checks(spelled),
                None,
                task_labels=task_labels([spelled], base_dir=Path(awq_recipe.base_dir)),
            ),
        }
    )
    card = render_model_card(report_card_inputs(validated, report, status="rejected"))
    results = {(r.task_name, r.dataset_type, r.dataset_split) for r in card.data.eval_results}
    assert results == {("qs_facts_mc", "local:facts_mc", "test"), ("gsm8k", "openai/gsm8k", "test")}
    assert "evals/tasks" not in card.content and "qs_facts_mc.yaml" not in card.content
    assert "- accuracy qs_facts_mc acc: recovery quantized/base = 0.5000 < 0.95" in card.text
    assert "measured on vLLM 0.32.0" in card.text
    assert "127.0.0.1" not in card.content and "| run | - |" in card.text  # a local UI is not linked
    assert card.data.base_model is None and "names no `base_model`" in card.text  # a local base folder


def test_report_says_which_recipe_fields_the_run_parameters_changed(tmp_path):
    overrides = {"gates.accuracy.tasks": [{"task": "../evals/tasks/qs_heldout_ppl.yaml"}]}
    text = write_report(report_with_capacity().model_copy(update={"overrides": overrides}), tmp_path)[
        "markdown"
    ]
    assert (
        "the run's parameters changed the recipe: `gates.accuracy.tasks` = "
        '`[{"task": "../evals/tasks/qs_heldout_ppl.yaml"}]`'
    ) in text.read_text()
    plain = write_report(report_with_capacity(), tmp_path / "plain")["markdown"].read_text()
    assert "parameters changed" not in plain


def test_report_and_card_name_the_quantization_device(awq_recipe):
    """Where llm-compressor ran (the worker's torch device) is in report.md and the card's
    Quantization table; an existing checkpoint was not quantized again; an old one did not record it."""
    from quantize_serve.quantize.run import NOT_QUANTIZED
    from quantize_serve.release.card import render_model_card, report_card_inputs
    from quantize_serve.validate.preflight import ValidatedRecipe

    validated = ValidatedRecipe(
        recipe=awq_recipe,
        source="recipes/tiny-llama-awq.yaml",
        recipe_sha256="0" * 64,
        calibration_fingerprint="2" * 64,
    )
    for device, shown in [
        ("cuda:0 NVIDIA H200", "cuda:0 NVIDIA H200"),
        ("cpu", "cpu"),
        (NOT_QUANTIZED, "n/a (not quantized again)"),
        (None, "not recorded"),
    ]:
        base = report_with_capacity()
        report = base.model_copy(update={"checkpoint": base.checkpoint.model_copy(update={"device": device})})
        assert f"- quantization device: {shown}\n" in render_markdown(report)
        card = render_model_card(report_card_inputs(validated, report, status="promoted"))
        assert f"| quantization device | {shown} |" in card.text
    stored = report.checkpoint.model_copy(update={"device": "cuda:0 NVIDIA H200"}).model_dump_json()
    assert QuantizeResult.model_validate_json(stored).device == "cuda:0 NVIDIA H200"  # report.json keeps it


def test_the_capacity_table_shows_the_fp8_row_unavailable_with_the_reason(tmp_path):
    """A CPU whose vLLM has no fp8 KV cache: the production boot serves a 16-bit one, and the table,
    the summary line, the chart and report.json say that instead of measuring fp8 (no crash)."""
    base = report_with_capacity()
    why = "this CPU has no AVX-512 (avx512f missing): vLLM's CPU backend serves fp8 KV caches only with ..."
    capacity = base.capacity.model_copy(
        update={
            "configs": base.capacity.configs[:2],
            "fp8_token_ratio": None,
            "gain_fp8": None,
            "fp8_kv_unavailable": why,
        }
    )
    paths = write_report(base.model_copy(update={"capacity": capacity}), tmp_path)
    text = paths["markdown"].read_text()
    assert f"| w4a16-fp8kv | fp8 | - | - | not available on this CPU: {why} | - | - |" in text
    assert (
        "fp8 KV not available on this CPU; the production boot serves the 16-bit KV cache of the w4a16 row"
        in text
    )
    assert (tmp_path / CHART).stat().st_size > 0
    assert '"fp8_kv_unavailable": "this CPU has no AVX-512' in paths["json"].read_text()


def test_decision_rows_report_and_artifact_name_a_task_by_its_lm_eval_name_never_by_its_absolute_path(
    tmp_path,
):
    """A recipe may give a task as an absolute YAML path (a generated recipe does): the decision's rows,
    the report's table and the regression rows say `qs_facts_mc`; two files of one task name are told
    apart by their file, relative to the recipe."""
    from quantize_serve.core.settings import PROJECT_ROOT
    from quantize_serve.gates.decision import accuracy_rows, decide
    from quantize_serve.gates.regression import RecordedMetric, compare_with_production
    from quantize_serve.recipe.gates import RegressionGate
    from quantize_serve.report.provenance import task_labels
    from tests.release_fixtures import results

    absolute = str(PROJECT_ROOT / "evals" / "tasks" / "qs_facts_mc.yaml")
    recipe_dir = tmp_path / "recipes"
    recipe_dir.mkdir()
    labels = task_labels([absolute, "../evals/tasks/qs_heldout_ppl.yaml"], base_dir=PROJECT_ROOT / "recipes")
    assert labels == {absolute: "qs_facts_mc", "../evals/tasks/qs_heldout_ppl.yaml": "qs_heldout_ppl"}
    assert [r.check for r in accuracy_rows(failed_checks(absolute), labels)] == ["accuracy qs_facts_mc acc"]
    assert [r.check for r in accuracy_rows(failed_checks(absolute))] == [
        "accuracy qs_facts_mc acc"
    ]  # its stem

    copy = recipe_dir / "mine" / "qs_facts_mc.yaml"  # the same task name in a file of the recipe's own
    copy.parent.mkdir()
    copy.write_text((PROJECT_ROOT / "evals" / "tasks" / "qs_facts_mc.yaml").read_text())
    both = task_labels([absolute, str(copy)], base_dir=recipe_dir)
    assert both == {
        absolute: "qs_facts_mc (evals/tasks/qs_facts_mc.yaml)",
        str(copy): "qs_facts_mc (mine/qs_facts_mc.yaml)",
    }

    report = report_with_capacity().model_copy(
        update={
            "recipe_source": str(recipe_dir / "r.yaml"),
            "accuracy": failed_checks(absolute),
            "decision": decide(
                failed_checks(absolute), None, task_labels=task_labels([absolute], base_dir=recipe_dir)
            ),
        }
    )
    text = write_report(report, tmp_path / "run")["markdown"].read_text()
    assert (
        "| qs_facts_mc | local:facts_mc | acc |" in text and "| accuracy qs_facts_mc acc | **FAIL** |" in text
    )
    assert str(PROJECT_ROOT) not in text and report.task_labels() == {absolute: "qs_facts_mc"}

    production = results().model_copy(
        update={"accuracy": [RecordedMetric(task=absolute, metric="acc", value=0.5)]}
    )
    candidate = results().model_copy(
        update={"accuracy": [RecordedMetric(task=absolute, metric="acc", value=0.25)]}
    )
    result = compare_with_production(
        candidate,
        production,
        RegressionGate(),
        release_ref="production",
        production_sha="a" * 40,
        source="recorded",
        task_labels=labels,
    )
    assert result.rows[0].measure == "qs_facts_mc acc"
    assert str(PROJECT_ROOT) not in "".join(r.reason for r in decide([], None, regression=result).checks)


def test_a_rejected_runs_failed_state_raises_the_rejection_and_keeps_its_report():
    """Prefect's engine ends a deployment's run by raising its failed state's data: the rejection, with the
    reasons (the report itself surfaced as "TypeError: Unexpected result for failed state" and its whole repr
    in the run's log). Callers reading the state get the report; pickled (a persisted result), it is kept."""
    import pickle

    import pytest
    from prefect.states import Failed

    from tests.release_fixtures import run_report

    report = run_report(repo_id="org/m", candidate_sha="c" * 40, run_id="r1")
    message = "release rejected: accuracy mmlu acc: recovery 0.91"
    state = Failed(message=message, data=ReleaseRejected(message, report))
    with pytest.raises(ReleaseRejected, match="recovery 0.91"):
        state.result()
    assert report_of(state.result(raise_on_failure=False)) == report
    assert report_of(pickle.loads(pickle.dumps(ReleaseRejected(message, report)))) == report
    failure = RuntimeError("vLLM died")  # a run stopped before its report: the exception, as it was
    assert report_of(failure) is failure and report_of(report) is report
