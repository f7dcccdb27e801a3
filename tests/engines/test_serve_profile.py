"""The serving-profile search's output booted for real: vLLM started from the emitted
serve-profile.yaml gets exactly the found settings (the search logic: tests/unit/test_serve_profile.py)."""

from __future__ import annotations

import ast
import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml

from benchmarks.evidence import ProfileFileSpec
from quantize_serve.capacity.measure import read_cache_info
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.core.errors import GateError
from quantize_serve.recipe.model import ProfileSearch
from quantize_serve.serve_profile import output as po
from quantize_serve.serve_profile import search as ps
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import WARMUP_MIN_PROMPT_TOKENS, vllm_server
from tests.conftest import vllm_processes_of
from tests.unit.test_serve_profile import threshold_probe


def profile_server_spec(found: ps.SearchPoint, config_path: str | Path) -> ProfileFileSpec:
    if found.spec is None:
        raise GateError("this search point carries no ServerSpec; write and boot a real boot's point")
    return ProfileFileSpec(**found.spec.model_dump(), config_path=str(config_path))


NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$", re.M)


@pytest.mark.timeout(600)
@pytest.mark.fp8_kv_serving
def test_emitted_profile_starts_vllm_with_exactly_the_found_settings(awq_recipe, awq_checkpoint, tmp_path):
    ckpt = Path(awq_checkpoint.checkpoint_dir)

    def spec_for(serve):  # what the real probe boots, without booting it here
        return capacity_spec(awq_recipe.model_copy(update={"serve": serve}), Boot.PRODUCTION, ckpt)

    recipe = awq_recipe.model_copy(
        update={
            "serve": awq_recipe.serve.model_copy(
                update={"search": ProfileSearch(min_num_seqs=4, max_num_seqs=32, step=4)}
            )
        }
    )
    result = ps.search_serve_profile(
        recipe, ckpt, probe=threshold_probe(13, [], spec_for=spec_for), log=lambda _: None
    )
    found = result.found
    assert 9 < found.max_num_seqs <= 13 and found.spec is not None
    path, _ = po.write_serve_profile(found, tmp_path / "serve-profile.yaml")
    log = tmp_path / "vllm.log"
    with vllm_server(profile_server_spec(found, path), log_path=log) as server:
        # The first request after the hand-over is a 2-token prompt ("The" + BOS): on vLLM CPU it
        # killed the worker (SIGILL) before the server's warm-up request existed (server.py).
        assert server.warmup_prompt_tokens >= WARMUP_MIN_PROMPT_TOKENS
        body = json.dumps({"model": "model", "prompt": "The", "max_tokens": 4, "ignore_eos": True}).encode()
        req = urllib.request.Request(
            server.base_url + "/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            usage = json.loads(resp.read())["usage"]
        info = read_cache_info(server.get("/metrics"))
    argv = log.read_text().splitlines()[0]
    assert "--config" in argv and "--max-num-seqs" not in argv  # every setting came from the file
    logged = ast.literal_eval(NON_DEFAULT.search(log.read_text()).group(1))
    expected = {
        "model": str(ckpt),
        "served_model_name": ["model"],
        "max_model_len": found.max_model_len,
        "max_num_seqs": found.max_num_seqs,
        "max_num_batched_tokens": found.max_num_batched_tokens,
        "kv_cache_dtype": "fp8",
        "kv_cache_memory_bytes": found.spec.kv_cache_memory_bytes,
        "enforce_eager": True,
    }
    assert {k: logged.get(k) for k in expected} == expected
    profile_keys = {k.replace("-", "_") for k in yaml.safe_load(path.read_text())}
    assert set(logged) - {"host", "port"} <= profile_keys, "vLLM used a setting that is not in the profile"
    assert int(float(info["kv_cache_memory_bytes"])) == found.spec.kv_cache_memory_bytes
    assert info["cache_dtype"] == "fp8" and usage["completion_tokens"] == 4 and usage["prompt_tokens"] == 2
    assert not vllm_processes_of(str(log)), "a vLLM process outlived the profile boot"
