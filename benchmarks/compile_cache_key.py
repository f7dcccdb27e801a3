"""Which vLLM boots share a torch.compile cache entry: vLLM's own key, computed for the flow's boots and
for production's `vllm serve --config serve-profile.yaml`.

vLLM (0.32 CPU here; 0.26 CUDA the same way, vllm/compilation/backends.py) names a compile-cache entry
``VLLM_CACHE_ROOT/torch_compile_cache/<hash>``, the hash over its env factors (envs.compile_factors), the
whole config (VllmConfig.compute_hash: the model's path or repo id, revision, dtype, max_model_len,
quantization, the KV dtype, max_num_seqs and max_num_batched_tokens, parallel and compilation settings),
the traced code and the compiler. This script builds each boot's vLLM command line with the project's
own code (capacity_spec, ServerSpec.published_config) and asks the serving environment's vLLM for the
config part of that key (EngineArgs(...).create_engine_config().compute_hash()), no server started.

    .venv/bin/python benchmarks/compile_cache_key.py --checkpoint DIR   # a W4A16 checkpoint of the tiny model

Writes benchmarks/results/compile_cache_key.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HASHER = """
import json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = {}
for name, argv in json.loads(sys.argv[1]).items():
    args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(argv)
    config = EngineArgs.from_cli_args(args).create_engine_config()
    out[name] = {"config_hash": config.compute_hash(), "model_hash": config.model_config.compute_hash()[:16],
                 "scheduler_hash": config.scheduler_config.compute_hash()[:16],
                 "cache_hash": config.cache_config.compute_hash()[:16]}
print("RESULT " + json.dumps(out))
"""


def hub_cache_layout(checkpoint: Path, repo_id: str, cache: Path) -> None:
    """The checkpoint as the Hub client's cache holds a downloaded repo (what production's node has after
    `vllm serve <repo id>` downloaded it), so the repo id resolves offline."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in checkpoint.iterdir():
        (snapshot / f.name).symlink_to(f.resolve())


def main() -> None:
    from quantize_serve.capacity.measure import capacity_spec, published_model
    from quantize_serve.core.portable import write_json_result
    from quantize_serve.core.settings import get_settings
    from quantize_serve.recipe.load import load_recipe
    from quantize_serve.serving.boot import Boot
    from quantize_serve.serving.server import config_args

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/compile_cache_key.json")
    args = parser.parse_args()
    recipe = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    checkpoint = args.checkpoint.resolve()
    repo_id = published_model(recipe, checkpoint)
    searched = recipe.model_copy(update={"serve": recipe.serve.model_copy(update={"max_num_seqs": 13})})

    def argv(config: dict) -> list[str]:
        return ["--model", str(config["model"]), *config_args({k: v for k, v in config.items() if k != "model"})]

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "same-checkpoint-elsewhere"
        copy.mkdir()
        for f in checkpoint.iterdir():
            (copy / f.name).symlink_to(f.resolve())
        hub_cache_layout(checkpoint, repo_id, Path(tmp) / "hub")
        production = capacity_spec(recipe, Boot.PRODUCTION, checkpoint)
        boots = {
            "flow (b) quantized, 16-bit KV": argv(capacity_spec(recipe, Boot.QUANTIZED_16BIT_KV, checkpoint).vllm_config()),
            "flow (c) production settings": argv(production.vllm_config()),
            "flow (c), the same files in another folder": argv({**production.vllm_config(), "model": str(copy)}),
            "flow (c), another KV budget (kv-cache-memory-bytes)": argv(
                {**production.vllm_config(), "kv-cache-memory-bytes": 1234567}),
            "profile search probe, max_num_seqs 13": argv(capacity_spec(searched, Boot.PRODUCTION, checkpoint).vllm_config()),
            "production: vllm serve --config serve-profile.yaml (repo id)": argv(production.published_config(repo_id)),
            "flow (c) served under the repo id from a local Hub-cache layout": argv(
                {**production.vllm_config(), "model": repo_id}),
        }
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(Path(tmp) / "hub")}
        done = subprocess.run([str(get_settings().serving_python), "-c", HASHER, json.dumps(boots)], env=env,
                              capture_output=True, text=True, timeout=600)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"the serving environment could not compute the keys:\n{done.stderr[-3000:]}")
        hashes = json.loads(line.removeprefix("RESULT "))
    flow_c = hashes["flow (c) production settings"]["config_hash"]
    production_hash = hashes["production: vllm serve --config serve-profile.yaml (repo id)"]["config_hash"]
    result = {
        "vllm": "serving environment (QS_SERVING_PYTHON)",
        "what": "the config part of vLLM's compile-cache key (VllmConfig.compute_hash, 10 hex); the rest of the "
                "key (env factors, traced code, compiler) is the same for every boot on one host with one "
                "environment (VLLM_* variables included: production needs the flow's, e.g. "
                "VLLM_USE_FLASHINFER_SAMPLER)",
        "boots": {name: {**h, "same_entry_as_flow_c": h["config_hash"] == flow_c,
                         "same_entry_as_production": h["config_hash"] == production_hash}
                  for name, h in hashes.items()},
        "finding": "vLLM keys a compile-cache entry on the model's path or repo id, max_num_seqs and the KV dtype "
                   "(not on the KV bytes): production's `vllm serve <repo id> --config serve-profile.yaml` never "
                   "shares an entry with the flow's boot of the local checkpoint folder; the flow's (c) booted "
                   "under the repo id (the checkpoint laid out as the Hub client's cache) would.",
    }
    write_json_result(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
