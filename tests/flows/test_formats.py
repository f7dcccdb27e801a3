"""The format choice (quantization.candidates), as its own subflow: every candidate measured with
real boots, the best that passes chosen; none passing stops the run with the table (the rule and
its table without boots: tests/unit/test_formats.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import ROOT
from tests.unit.test_formats import recipe_with

AUTOAWQ = ROOT / "tests" / "fixtures" / "tiny-llama-autoawq"


TOKEN = "hf_FormatsTestToken0123456789abcdefghij"


@pytest.fixture(scope="module")
def local_hub_access() -> dict:
    """The module's local Hub (tests/conftest.py): TOKEN writes, reached as the Hub; runs go to a
    temporary folder."""
    return {"tokens": (TOKEN,), "online": True}


@pytest.fixture(scope="module")
def formats_hub(local_hub):
    """The module's local Hub, holding the AutoAWQ checkpoint as a repo."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=local_hub.endpoint, token=TOKEN)
    api.create_repo("community/tiny-llama-awq", private=True)
    api.upload_folder(repo_id="community/tiny-llama-awq", folder_path=str(AUTOAWQ))
    return local_hub


@pytest.fixture(scope="module")
def format_choice(formats_hub, tmp_path_factory):
    """One run of the choose-format subflow on its own: an INT8 W8A8 candidate quantized here against
    the AutoAWQ checkpoint served from the local Hub by repo id. (validated recipe, choice, run folder)."""
    from flows.formats import choose_format
    from quantize_serve.validate.preflight import resolve_base, validate_recipe

    folder = tmp_path_factory.mktemp("formats")
    data = yaml.safe_load(
        recipe_with(
            folder,
            {
                "group_size": 128,
                "ignore": ["lm_head"],
                "kv_cache_scales": True,
                "candidates": [
                    {"name": "int8-w8a8", "method": "smoothquant-gptq", "scheme": "W8A8"},
                    {"name": "community-awq", "checkpoint": "community/tiny-llama-awq"},
                ],
                "choose": {
                    "rule": "kv_capacity",
                    "concurrency": 4,
                    "input_tokens": 32,
                    "output_tokens": 16,
                    "num_prompts": 8,
                    "repeats": 2,
                },
            },
        ).read_text()
    )
    acc = ROOT / "evals" / "tasks"
    data["gates"]["accuracy"] = {
        "tasks": [{"task": str(acc / "qs_heldout_ppl.yaml"), "limit": 20}],
        "error_rates": {"bad_recovery": 0.8, "good_recovery": 0.9},
    }  # the subject is the choice, not a close call
    path = folder / "formats.yaml"
    path.write_text(yaml.safe_dump(data))
    validated = validate_recipe(path)
    run_dir = folder / "run"
    choice = choose_format(validated, resolve_base(validated), run_dir)
    return validated, choice, run_dir


@pytest.mark.w4a16_serving
@pytest.mark.fp8_kv_serving
@pytest.mark.timeout(1500)
def test_the_subflow_measures_every_format_and_chooses_the_best_that_passes(format_choice):
    """Each candidate is served with the expected kernel, benched twice, and goes through the
    accuracy and stress gates; the rule picks the most KV tokens. (The winner then runs the pipeline
    as an existing checkpoint, not quantized again: tests/flows/test_approval.py runs the pipeline on
    an existing checkpoint.)"""
    from tests.conftest import vllm_processes_of

    _, chosen, run_dir = format_choice
    rows = {r.name: r for r in chosen.rows}
    assert list(rows) == ["base", "int8-w8a8", "community-awq"]
    assert rows["int8-w8a8"].kernels == ["CPUInt8ScaledMMLinearKernel"]
    assert "CPUWNA16LinearKernel" in rows["community-awq"].kernels
    for name in ("int8-w8a8", "community-awq"):
        r = rows[name]
        assert not r.failures, r.failures
        assert len(r.runs) == 2 and all(run.completed == 8 for run in r.runs)
        assert r.kv_cache_tokens > r.kv_cache_tokens_16bit > 0  # fp8 KV, and the 16-bit row derived from it
        assert r.recovery is not None
        assert (run_dir / "formats" / name / "stress").is_dir()  # the stress gate ran on every candidate
    # the rule: most KV tokens (4-bit weights leave more of the same budget to the cache)
    assert rows["community-awq"].kv_cache_tokens > rows["int8-w8a8"].kv_cache_tokens
    assert chosen.winner == "community-awq"
    for f in ("formats.json", "formats.md", "formats.png"):
        assert (run_dir / f).is_file()
    assert "**release**" in (run_dir / "formats.md").read_text()
    assert json.loads((run_dir / "formats.json").read_text())["winner"] == "community-awq"
    assert not [p for p in vllm_processes_of() if _started_in(p, run_dir)]  # every boot stopped


@pytest.mark.w4a16_serving
@pytest.mark.fp8_kv_serving
def test_when_no_candidate_passes_the_run_stops_with_the_table(format_choice):
    """The same measured rows under a latency limit none meets: no release, and the subflow's stop
    (a GateError with the table, raised before the flow quantizes again, pushes or promotes)."""
    from quantize_serve.core.errors import GateError
    from quantize_serve.formats.choose import choose, release_format
    from quantize_serve.recipe.quantization import FormatRule

    validated, measured, _ = format_choice
    strict = FormatRule(rule="throughput", max_p99_ttft_ms=0.001)
    none_pass = choose(measured.rows, strict, measured.bench, measured.platform)
    assert none_pass.winner is None
    with pytest.raises(GateError) as info:
        release_format(none_pass)
    message = str(info.value)
    assert "no release format passed every check, so nothing is pushed or released" in message, message
    assert "p99 TTFT" in message and "over the limit 0.001 ms" in message
    assert "p99 TTFT <= 0.001 ms" in message  # the rule, stated under the table
    assert release_format(measured) == "community-awq"


def _started_in(proc, run_dir) -> bool:
    try:
        return proc.environ().get("QS_SERVER_LOG", "").startswith(str(run_dir))
    except Exception:  # noqa: BLE001 - it ended while we looked
        return False
