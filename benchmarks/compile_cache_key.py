"""Which vLLM boots share a torch.compile cache entry: vLLM's own key, computed for the flow's boots as the
flow starts them and for production's `vllm serve --config serve-profile.yaml` as production starts it.

vLLM (0.32 CPU here; 0.26 CUDA the same way, vllm/compilation/backends.py and decorators.py) names a
compile-cache entry ``VLLM_CACHE_ROOT/torch_compile_cache/[torch_aot_compile/]<hash>``, the hash over its env
factors (envs.compile_factors: every VLLM_* variable but a few paths and logging switches), the whole config
(VllmConfig.compute_hash: the model's name, revision, dtype, max_model_len, quantization, the KV dtype,
max_num_seqs and max_num_batched_tokens, parallel and compilation settings), the traced code and the
compiler. The last two are the same for every boot on one host with one serving environment; this script
asks the serving environment's vLLM for the first two, no server started:

- the flow's boots: the specs the flow builds (capacity_spec, as tasks/serve.py and the profile search's
  probe call it), in a process started as the flow starts a boot: its environment (server.boot_env:
  HF_HUB_OFFLINE=1, the boot's own Hub cache), the checkpoint laid out in that cache as vllm_server lays it
  out (repo_layout.laid_out_as_hub_cache, at the spec's revision), and the bootstrap's KEEP_MODEL_NAME;
- production: the serve-profile.yaml the flow writes (serve_profile.output.write_profile: the model named
  by its repo id, the revision by the recipe's hub.release_ref), read by a process online against a Hub (a
  local one, localhub/, that holds the pushed checkpoint and the release ref pointing at it, as after
  promotion), with a download cache of its own and the VLLM_* variables the profile names.

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from benchmarks.harness import ROOT  # noqa: E402
from localhub.client import hub_client_env  # noqa: E402
from localhub.server import start_local_hub  # noqa: E402
from quantize_serve.capacity.measure import capacity_spec  # noqa: E402
from quantize_serve.core.portable import write_json_result  # noqa: E402
from quantize_serve.core.settings import get_settings  # noqa: E402
from quantize_serve.hub.publish import promote_revision  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serve_profile.output import write_profile  # noqa: E402
from quantize_serve.serve_profile.search import candidate_serve  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.compile_ahead import compile_log  # noqa: E402
from quantize_serve.serving.repo_layout import KEEP_MODEL_NAME, lay_out_as_hub_cache  # noqa: E402
from quantize_serve.serving.server import BOOT_VLLM_DEFAULTS, boot_env, boot_hub_cache, config_args  # noqa: E402

# Run by the serving environment's Python (after KEEP_MODEL_NAME where the flow's bootstrap runs it):
# for each named command line, the model's name and revision vLLM keys on and the two key parts.
HASHER = """
import json, os, sys
from vllm import envs
from vllm.config.utils import hash_factors
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

def env_hash():
    return hash_factors(envs.compile_factors())[:10]

out = {}
for name, argv in json.loads(sys.argv[1]).items():
    args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(argv)
    config = EngineArgs.from_cli_args(args).create_engine_config()
    model = config.model_config
    revision = None if model.revision is None else str(model.revision)
    out[name] = {"model": str(model.model), "revision": revision, "config_hash": config.compute_hash(),
                 "env_hash": env_hash()}
for variable in json.loads(sys.argv[2]):  # the key without these variables (as a host that never set them)
    os.environ.pop(variable, None)
print("RESULT " + json.dumps({"boots": out, "env_hash_without": env_hash()}))
"""


def hashes(
    serving_python: Path,
    boots: dict[str, list[str]],
    env: dict[str, str],
    *,
    prelude: str = "",
    drop: tuple[str, ...] = (),
) -> dict:
    done = subprocess.run(
        [str(serving_python), "-c", prelude + HASHER, json.dumps(boots), json.dumps(drop)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"the serving environment could not compute the keys:\n{done.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/compile_cache_key.json")
    args = parser.parse_args()

    checkpoint = args.checkpoint.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["QS_WORK_DIR"] = str(Path(tmp) / "work")  # the flow's work dir: boot Hub caches go there
        result = measure(checkpoint, Path(tmp))
        for boot in result["boots"].values():  # paths as the result shows them: the flow's work dir relative
            boot["model"] = "CHECKPOINT" if boot["model"] == str(checkpoint) else boot["model"]
        write_json_result(args.out, result, roots=[Path(tmp)])
    print(args.out.read_text())


def measure(checkpoint: Path, tmp: Path) -> dict:
    from huggingface_hub import HfApi

    get_settings.cache_clear()
    serving_python = get_settings().serving_python
    recipe = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    repo_id = recipe.hub.repo_id

    def with_serve(**update):
        return recipe.model_copy(update={"serve": recipe.serve.model_copy(update=update)})

    def argv(spec_or_config) -> list[str]:
        config = spec_or_config if isinstance(spec_or_config, dict) else spec_or_config.vllm_config()
        rest = {k: v for k, v in config.items() if k != "model"}
        return ["--model", str(config["model"]), *config_args(rest)]

    production_c = capacity_spec(recipe, Boot.PRODUCTION, checkpoint, as_published=True)  # tasks/serve.py
    release_ref = recipe.hub.release_ref
    assert production_c.revision == release_ref, "the flow's (c) is not served at the release ref"
    unnamed_c = production_c.model_copy(update={"revision": None})  # before: the profile named no revision
    probe_at_c = recipe.model_copy(
        update={"serve": candidate_serve(recipe.serve, max_num_seqs=recipe.serve.max_num_seqs)}
    )
    name_c = f"flow (c) production settings, as the flow boots it (repo id at {release_ref})"
    prod = f"production: vllm serve --config serve-profile.yaml (revision: {release_ref})"
    flow = {
        "flow (b) quantized, 16-bit KV": argv(capacity_spec(recipe, Boot.QUANTIZED_16BIT_KV, checkpoint)),
        name_c: argv(production_c),
        "flow (c) served from the checkpoint folder (before)": argv(
            capacity_spec(recipe, Boot.PRODUCTION, checkpoint)
        ),
        "flow (c) under the repo id at no revision (before)": argv(unnamed_c),
        "flow (c), another KV budget (kv-cache-memory-bytes)": argv(
            {**production_c.vllm_config(), "kv-cache-memory-bytes": 1234567}
        ),
        "profile search probe at (c)'s settings": argv(  # as serve_profile/probe.py builds it
            capacity_spec(probe_at_c, Boot.PRODUCTION, checkpoint, as_published=True)
        ),
        "profile search probe, max_num_seqs 13": argv(
            capacity_spec(with_serve(max_num_seqs=13), Boot.PRODUCTION, checkpoint, as_published=True)
        ),
    }
    log = tmp / "run" / "vllm-w4a16-fp8kv.log"  # the flow's (c) boot log; its Hub cache derives from it
    for revision in (None, release_ref):  # what vllm_server lays out for each boot's revision
        lay_out_as_hub_cache(checkpoint, repo_id, boot_hub_cache(log), revision=revision)
    flow_env = boot_env(log)
    found = hashes(serving_python, flow, flow_env, prelude=KEEP_MODEL_NAME)["boots"]
    # the boot that compiles (c) ahead beside the base (serving/compile_ahead.py), as tasks/serve.py starts it
    # on a GPU: at another gpu_memory_utilization (no KV bytes pinned), with a log and Hub cache of its own
    ahead_log = compile_log(log.parent)
    lay_out_as_hub_cache(checkpoint, repo_id, boot_hub_cache(ahead_log), revision=release_ref)
    ahead = "flow (c) compiled ahead beside the base: gpu_memory_utilization 0.53, its own log and Hub cache"
    on_gpu = {k: v for k, v in production_c.vllm_config().items() if k != "kv-cache-memory-bytes"}
    ahead_argv = argv(on_gpu | {"gpu-memory-utilization": 0.53})
    found |= hashes(serving_python, {ahead: ahead_argv}, boot_env(ahead_log), prelude=KEEP_MODEL_NAME)[
        "boots"
    ]
    offline = "flow (c) as the flow boots it, without KEEP_MODEL_NAME (vLLM's offline mode)"
    found[offline] = hashes(serving_python, {offline: flow[name_c]}, flow_env)["boots"][offline]

    with start_local_hub(tmp / "hub") as hub:  # production's Hub: the candidate, the release ref on it
        with hub_client_env(hub.endpoint, cache_dir=tmp / "publish-cache"):
            api = HfApi(endpoint=hub.endpoint)
            api.create_repo(repo_id, private=False, exist_ok=True)
            commit = api.upload_folder(folder_path=str(checkpoint), repo_id=repo_id).oid
            promote_revision(recipe.hub, commit, token=None, endpoint=hub.endpoint)  # as the flow promotes
        profile, _ = write_profile(
            production_c, tmp / "release" / "serve-profile.yaml", model=repo_id, header=[]
        )
        unnamed, _ = write_profile(unnamed_c, tmp / "before" / "serve-profile.yaml", model=repo_id, header=[])
        production = {
            prod: ["--config", str(profile)],
            "production: the profile naming no revision (before)": ["--config", str(unnamed)],
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VLLM_", "QS_"))}
        env |= {
            "HF_ENDPOINT": hub.endpoint,
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_CACHE": str(tmp / "production-hf-cache"),
            **BOOT_VLLM_DEFAULTS,
        }
        online = hashes(serving_python, production, env, drop=tuple(BOOT_VLLM_DEFAULTS))
    found |= online["boots"]
    variables = " ".join(f"{k}={v}" for k, v in BOOT_VLLM_DEFAULTS.items())
    without = f"production without {variables} (vLLM's defaults)"
    found[without] = {**online["boots"][prod], "env_hash": online["env_hash_without"]}

    def key(name: str) -> tuple[str, str]:
        return found[name]["env_hash"], found[name]["config_hash"]

    boots = {
        name: {
            **h,
            "same_entry_as_flow_c": key(name) == key(name_c),
            "same_entry_as_production": key(name) == key(prod),
        }
        for name, h in found.items()
    }
    assert found[prod]["revision"] == release_ref, "production's profile does not name the release ref"
    assert boots[name_c]["same_entry_as_production"], "the flow's (c) does not write production's entry"
    return {
        "vllm": "serving environment (QS_SERVING_PYTHON)",
        "what": "the model's name and revision vLLM keys on, and the two parts of vLLM's compile-cache "
        "key that differ between boots on one host: env_hash (envs.compile_factors, 10 hex) and "
        "config_hash (VllmConfig.compute_hash); the traced code and the compiler are the same for "
        "every boot in one serving environment. Flow rows: the flow's specs in a process started as "
        "the flow starts a boot (boot_env, the boot's Hub-cache layout, KEEP_MODEL_NAME). Production "
        "rows: the serve-profile.yaml the flow writes (revision: the release ref), read online "
        "against a Hub holding the pushed checkpoint with the release ref on it (as after "
        "promotion), with a download cache of its own. CHECKPOINT: the --checkpoint folder; work/: "
        "the flow's work dir",
        "boots": boots,
        "finding": "vLLM keys a compile-cache entry on the model's name (its folder, or its repo id), the "
        "revision as named, max_num_seqs, the KV dtype (not the KV bytes) and every VLLM_* "
        "variable. The flow's (c) served from the checkpoint folder never shared production's "
        "entry. Served under the repo id from a Hub-cache layout it does, but only because the "
        "boot keeps the repo id as the model's name: vLLM's offline mode (HF_HUB_OFFLINE=1) "
        "otherwise replaces it with the layout's snapshot folder and keys on that. Production "
        "online keys on the revision as named: the profile names the release ref, and the flow's "
        "(c) and the search's probes are served at that ref (the layout's refs/<ref> names the "
        "checkpoint's snapshot), so both sides have one entry; a profile naming no revision (as "
        "before) is keyed on main, another entry. Production needs the flow's VLLM_* variables "
        "too (VLLM_USE_FLASHINFER_SAMPLER=0): with vLLM's defaults the env part of the key "
        "differs. The search's probe at (c)'s settings writes (c)'s entry, so (c) reads what "
        "the found probe compiled; so does the boot that compiles (c) ahead beside the base, at another "
        "gpu_memory_utilization with a log and Hub cache of its own.",
    }


if __name__ == "__main__":
    main()
