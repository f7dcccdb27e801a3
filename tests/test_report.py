"""The report's charts: a relative link on disk (report.md, the model card ship the PNG beside it),
the PNG itself inline for the Prefect UI's markdown artifact, which has no folder to resolve a link."""

from __future__ import annotations

import base64
import re

from quantize_serve.capacity import CapacityConfig, CapacityReport
from quantize_serve.decision import Decision
from quantize_serve.quantize import QuantizeResult
from quantize_serve.report import CHART, RunReport, render_markdown, write_report
from quantize_serve.validate import BaseModelRef


def report_with_capacity() -> RunReport:
    configs = [CapacityConfig(name=name, kv_cache_dtype=dtype, weights_bytes=w, kv_cache_memory_bytes=kv,
                              kv_cache_tokens=t, num_blocks=t // 16, block_size=16, max_model_len=512,
                              max_concurrency=t / 512, boot_seconds=20.0)
               for name, dtype, w, kv, t in [("base", "auto", 2_000_000, 6_000_000, 6016),
                                             ("w4a16", "bfloat16", 900_000, 7_000_000, 7168),
                                             ("w4a16-fp8kv", "fp8", 900_000, 7_000_000, 14464)]]
    return RunReport(
        run_id="r", recipe="tiny-llama-awq", recipe_source="recipes/x.yaml", recipe_sha256="0" * 64,
        base=BaseModelRef(local_dir="models/tiny-llama", sha="1" * 64),
        checkpoint=QuantizeResult(checkpoint_dir="c", method="awq", scheme="W4A16_ASYM", seconds=1.0,
                                  base_bytes=2, quantized_bytes=1, calibration_fingerprint="2" * 64,
                                  engine_versions={}),
        capacity=CapacityReport(method="fixed budget", budget_bytes=8_000_000, configs=configs,
                                freed_weight_bytes=1_100_000, fp8_token_ratio=2.0, gain_quantized=1.19,
                                gain_fp8=2.4, planner=[]),
        decision=Decision(passed=True, checks=[]), serving_command="vllm serve c")


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
    from quantize_serve.capacity import published_serve_command
    from quantize_serve.model_card import render_model_card
    from quantize_serve.settings import PROJECT_ROOT
    from quantize_serve.validate import ValidatedRecipe

    ckpt = tmp_path / "work" / "checkpoints" / "tiny-llama-awq-0123abcd"
    validated = ValidatedRecipe(recipe=awq_recipe, source=str(PROJECT_ROOT / "recipes/tiny-llama-awq.yaml"),
                                recipe_sha256="0" * 64, calibration_fingerprint="2" * 64)
    report = report_with_capacity().model_copy(update={
        "base": BaseModelRef(local_dir=str(PROJECT_ROOT / "models/tiny-llama"), sha="1" * 64),
        "checkpoint": report_with_capacity().checkpoint.model_copy(update={"checkpoint_dir": str(ckpt)}),
        "serving_command": published_serve_command(awq_recipe, ckpt)})
    for status in ("candidate", "promoted"):
        card = str(render_model_card(report.card_inputs(validated, status=status)))
        assert str(PROJECT_ROOT) not in card and str(tmp_path) not in card, card
        assert "vllm serve quantize-serve/tiny-llama-awq-w4a16" in card
    assert str(PROJECT_ROOT) not in render_markdown(report)
