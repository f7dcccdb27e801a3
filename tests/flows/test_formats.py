"""The format choice in the flow (quantization.candidates): every candidate measured with real
boots, the best that passes released; none passing stops the run before anything is pushed
(the rule and its table without boots: tests/unit/test_formats.py)."""


from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import ROOT, local_hub
from tests.unit.test_formats import recipe_with

RECIPE = ROOT / "recipes" / "tiny-llama-formats.yaml"


AUTOAWQ = ROOT / "tests" / "fixtures" / "tiny-llama-autoawq"


BASE = ROOT / "models" / "tiny-llama"


TOKEN = "hf_FormatsTestToken0123456789abcdefghij"


@pytest.fixture(scope="module")
def formats_hub(tmp_path_factory):
    """A local Hub holding the AutoAWQ checkpoint as a repo; runs go to a temporary folder."""
    from huggingface_hub import HfApi

    with local_hub(tmp_path_factory.mktemp("hub"), tokens=(TOKEN,), online=True) as hub:
        api = HfApi(endpoint=hub.endpoint, token=TOKEN)
        api.create_repo("community/tiny-llama-awq", private=True)
        api.upload_folder(repo_id="community/tiny-llama-awq", folder_path=str(AUTOAWQ))
        yield hub


@pytest.mark.w4a16_serving
@pytest.mark.fp8_kv_serving
@pytest.mark.timeout(1500)
def test_the_flow_compares_formats_and_releases_the_best_one_that_passes(formats_hub, tmp_path):
    from flows.pipeline import quantize_serve

    data = yaml.safe_load(recipe_with(tmp_path, {
        "group_size": 128, "ignore": ["lm_head"], "kv_cache_scales": True,
        "candidates": [{"name": "int8-w8a8", "method": "smoothquant-gptq", "scheme": "W8A8"},
                       {"name": "community-awq", "checkpoint": "community/tiny-llama-awq"}],
        "choose": {"rule": "kv_capacity", "concurrency": 4, "input_tokens": 32, "output_tokens": 16,
                   "num_prompts": 8, "repeats": 2}}).read_text())
    acc = ROOT / "evals" / "tasks"
    data["gates"]["accuracy"] = {"tasks": [{"task": str(acc / "qs_facts_mc.yaml"), "limit": 60},
                                           {"task": str(acc / "qs_heldout_ppl.yaml"), "limit": 20}],
                                 "default_recovery": 0.9}  # the subject is the choice, not a close call
    data["hub"]["repo_id"] = "quantize-serve/tiny-llama-formats-test"
    path = tmp_path / "formats.yaml"
    path.write_text(yaml.safe_dump(data))

    state = quantize_serve(str(path), return_state=True)
    assert state.is_completed(), state.message
    (report_path,) = formats_hub.runs.glob("tiny-llama-formats-*/report.json")
    report = json.loads(report_path.read_text())
    run_dir = report_path.parent
    chosen = report["formats"]
    rows = {r["name"]: r for r in chosen["rows"]}
    assert list(rows) == ["base", "int8-w8a8", "community-awq"]
    assert rows["int8-w8a8"]["kernels"] == ["CPUInt8ScaledMMLinearKernel"]
    assert "CPUWNA16LinearKernel" in rows["community-awq"]["kernels"]
    for name in ("int8-w8a8", "community-awq"):
        r = rows[name]
        assert not r["failures"], r["failures"]
        assert len(r["runs"]) == 2 and all(run["completed"] == 8 for run in r["runs"])
        assert r["kv_cache_tokens"] > r["kv_cache_tokens_16bit"] > 0  # fp8 KV, and the 16-bit boot
        assert r["recovery"] is not None
        assert (run_dir / "formats" / name / "stress").is_dir()  # the stress gate ran on every candidate
    # the rule: most KV tokens (4-bit weights leave more of the same budget to the cache)
    assert rows["community-awq"]["kv_cache_tokens"] > rows["int8-w8a8"]["kv_cache_tokens"]
    assert chosen["winner"] == "community-awq"
    for f in ("formats.json", "formats.md", "formats.png"):
        assert (run_dir / f).is_file()
    assert "**release**" in (run_dir / "formats.md").read_text()
    # the winner ran the whole pipeline as an existing checkpoint: not quantized again, then promoted
    assert report["checkpoint"]["method"] == "existing awq checkpoint"
    assert report["checkpoint"]["source_checkpoint"].startswith("community/tiny-llama-awq@")
    assert report["decision"]["passed"] and report["release"]["status"] == "promoted"
    assert "## Release format" in (run_dir / "report.md").read_text()
    assert "not quantized again" in (run_dir / "release" / "README.md").read_text()


@pytest.mark.w4a16_serving
@pytest.mark.fp8_kv_serving
@pytest.mark.timeout(900)
def test_when_no_candidate_passes_the_run_fails_before_anything_is_pushed(formats_hub, tmp_path):
    """Every candidate measured, none within the recipe's latency limit: the run fails with the table,
    nothing is quantized again, pushed or promoted, and no vLLM is left running."""
    from flows.pipeline import quantize_serve
    from tests.conftest import vllm_processes_of

    data = yaml.safe_load(recipe_with(tmp_path, {
        "candidates": [{"name": "community-awq", "checkpoint": str(AUTOAWQ)}],
        "choose": {"rule": "throughput", "max_p99_ttft_ms": 0.001, "concurrency": 2, "input_tokens": 16,
                   "output_tokens": 4, "num_prompts": 4, "repeats": 1}}).read_text())
    data["gates"]["accuracy"] = {"tasks": [{"task": str(ROOT / "evals" / "tasks" / "qs_heldout_ppl.yaml"),
                                            "limit": 10}], "default_recovery": 0.5}
    data["serve"]["kv_cache_dtype"] = "auto"  # one boot per candidate: the subject is the stop
    data["hub"]["repo_id"] = "quantize-serve/tiny-llama-formats-none"
    path = tmp_path / "none-pass.yaml"
    path.write_text(yaml.safe_dump(data))

    state = quantize_serve(str(path), return_state=True)
    assert state.is_failed()
    message = state.message or ""
    assert "no release format passed every check, so nothing is pushed or released" in message, message
    assert "p99 TTFT" in message and "over the limit 0.001 ms" in message
    (run_dir,) = [p.parent for p in formats_hub.runs.glob("tiny-llama-formats-*/formats.md")
                  if "p99 TTFT <= 0.001 ms" in p.read_text()]
    assert not (run_dir / "report.json").exists() and not (run_dir / "release").exists()
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=formats_hub.endpoint, token=TOKEN).repo_info("quantize-serve/tiny-llama-formats-none")
    def started_here(proc) -> bool:
        try:
            return proc.environ().get("QS_SERVER_LOG", "").startswith(str(run_dir))
        except Exception:  # noqa: BLE001 - it ended while we looked
            return False

    assert not [p for p in vllm_processes_of() if started_here(p)]
