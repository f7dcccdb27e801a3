"""The production boot (c) after its graphs were compiled ahead (serving/compile_ahead.py), against (c) from
an empty compile cache: does (c) read what the boot beside the base wrote, and what that saves on this CPU.

A round is two fresh work dirs (each its own VLLM_CACHE_ROOT), in alternating order:
- ``cold``: (c) booted as the flow boots it (capacity_spec, the repo id at the release ref), its cache empty;
- ``ahead``: first the boot that compiles ahead as the flow starts it (compile_ahead with the run's Until told
  the base is scored: it stops once its graphs are saved), in another KV budget (half of (c)'s; on a GPU it is
  another gpu_memory_utilization, compile_cache_key.json) with its own log and Hub cache; then (c).
Both compile (``enforce_eager: false``, as the GPU recipes: the tiny recipe's profile runs eager and compiles
nothing). Figures: (c)'s seconds to /health and vLLM's engine init in it (where it compiles), whether (c)
found the entry the ahead boot wrote, and the ahead boot's own seconds. On a GPU, vLLM 0.26 loads the graphs
(the 8B's (c) on an H100: 50.5 s with them cached, 90.0 s cold, h200_release_time.json); vLLM CPU 0.32
cannot load its own AOT artifact and traces again, reusing Inductor's cache in the entry
(production_first_boot.json): that part is what this CPU shows.

    .venv/bin/python benchmarks/compile_ahead.py --checkpoint DIR --rounds 3   # DIR: a tiny W4A16 checkpoint

Writes benchmarks/results/compile_ahead.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from benchmarks.harness import ROOT  # noqa: E402
from quantize_serve.capacity.measure import capacity_spec  # noqa: E402
from quantize_serve.core.portable import write_json_result  # noqa: E402
from quantize_serve.core.settings import get_settings  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.compile_ahead import Until, compile_ahead, compile_log  # noqa: E402
from quantize_serve.serving.server import vllm_server  # noqa: E402
from quantize_serve.serving.vllm_log import boot_timeline, compile_facts, read_log  # noqa: E402


def measure(recipe, checkpoint: Path, folder: Path, *, ahead: bool) -> dict:
    os.environ["QS_WORK_DIR"] = str(folder / "work")  # a fresh work dir: a fresh compile cache
    get_settings.cache_clear()
    spec = capacity_spec(recipe, Boot.PRODUCTION, checkpoint, as_published=True)
    row: dict = {"compiled_ahead": ahead}
    written: set[str] = set()
    if ahead:
        until = Until()
        until.base_scored()  # the base's run ended first (the flow's case): stop once the graphs are saved
        budget = spec.model_copy(update={"kv_cache_memory_bytes": spec.kv_cache_memory_bytes // 2})
        done = compile_ahead(budget, compile_log(folder), until, log=lambda line: None)
        written = set(compile_facts(read_log(compile_log(folder)), set())["compile_entries"])
        row |= {"ahead_outcome": done.outcome, "ahead_s": done.seconds}
    log = folder / f"vllm-{Boot.PRODUCTION}.log"
    with vllm_server(spec, log_path=log) as server:
        row["c_boot_s"] = server.boot_seconds
    text = read_log(log)
    facts = compile_facts(text, written)
    return row | {
        # seconds to vLLM's "Resolved architecture": its model-info cache, which a fresh work dir lacks and
        # any earlier boot of the architecture in it fills (the flow's prepared boots do, README)
        "c_config_resolved_s": boot_timeline(text)["config_resolved_s"],
        "c_init_engine_s": facts["init_engine_s"],
        "c_read_the_ahead_entry": facts["entry_existed_before"] if ahead else None,
        "vllm_load_failure_recompiled": facts["vllm_load_failure_recompiled"],
    }


def summary(rows: list[dict]) -> dict:
    def mean(key: str, ahead: bool) -> float:
        return round(statistics.mean(r[key] for r in rows if r["compiled_ahead"] is ahead), 1)

    out = {
        key: {"cold_mean": mean(key, False), "ahead_mean": mean(key, True)}
        for key in ("c_boot_s", "c_config_resolved_s", "c_init_engine_s")
    }
    ahead = [r for r in rows if r["compiled_ahead"]]
    read = all(r["c_read_the_ahead_entry"] for r in ahead)
    stopped = (
        "once its graphs were saved" if all(r["ahead_outcome"] == "compiled" for r in ahead) else "otherwise"
    )
    boot = out["c_boot_s"]
    out["finding"] = (
        f"(c) booted in {boot['ahead_mean']} s after the compile ahead against {boot['cold_mean']} s cold "
        f"(vLLM's engine init {out['c_init_engine_s']['ahead_mean']} s against "
        f"{out['c_init_engine_s']['cold_mean']} s); "
        + ("every (c) read the entry the boot ahead wrote" if read else "NOT every (c) read the entry")
        + f"; of the boot's difference, {out['c_config_resolved_s']['cold_mean']} s against "
        f"{out['c_config_resolved_s']['ahead_mean']} s to vLLM's resolved architecture is its model-info "
        "cache, which the flow's prepared boots fill anyway: the compile's part is the engine init's"
        + f"; the boot ahead took {statistics.mean(r['ahead_s'] for r in ahead):.1f} s, stopped {stopped}"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a W4A16 checkpoint of the tiny model")
    parser.add_argument("--rounds", type=int, default=3, help="cold/ahead pairs")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/compile_ahead.json")
    args = parser.parse_args()

    recipe = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    compiling = recipe.model_copy(update={"serve": recipe.serve.model_copy(update={"enforce_eager": False})})
    rows, load = [], [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for ahead in (
                i % 2 == 1,
                i % 2 == 0,
            ):  # alternate which goes first: a shared host's drift on both
                folder = Path(tmp) / f"{i}-{'ahead' if ahead else 'cold'}"
                rows.append(measure(compiling, args.checkpoint.resolve(), folder, ahead=ahead))
                load.append(os.getloadavg()[0])
                print(rows[-1], flush=True)
        result = {
            "what": "the flow's production boot (c) from an empty compile cache (cold) and after the boot "
            "that compiles it ahead beside the base (ahead: another KV budget, its own log and Hub cache, "
            "stopped once its graphs were saved), each pair in fresh work dirs, alternating which goes "
            "first; the tiny recipe's serve settings with enforce_eager false",
            "host": {"cpus": os.cpu_count(), "load_average_1min": {"min": min(load), "max": max(load)}},
            "checkpoint": "tiny-llama W4A16 (AWQ)",
            "rows": rows,
            **summary(rows),
        }
        write_json_result(args.out, result, roots=[Path(tmp)])
    print(args.out.read_text())


if __name__ == "__main__":
    main()
