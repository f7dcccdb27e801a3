"""How long a boot waits for vLLM's engine core: spawned (`vllm serve`'s way) against forked (the flow's way).

The question: `vllm serve` sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn``, so its engine core is a fresh
interpreter that imports vLLM again before its first line; the flow's boots set ``fork`` unless the host
sets the variable (``serving/server.py BOOT_START_DEFAULTS``), so the engine core starts from the server's
process with its imports. How many seconds of a boot is that, and does the forked boot serve?

The work: the recipe's base model (default ``recipes/tiny-llama-awq.yaml``: models/tiny-llama, bf16) booted
as the flow boots it (a prepared process: vLLM's server module imported and the architecture inspected
before the command line, ``prepare_server``; then ``vllm_server`` with the recipe's serve settings and its
warm-up request): first one boot that fills the host's caches (vLLM's compile and model-info caches, the
page cache; left out of the medians), then ``--boots`` boots in the order spawn, fork, fork, spawn, ...
(each method as often first as second). Per boot: the seconds from the command line to a healthy server
(``boot_seconds``) and vLLM's timeline (``serving/vllm_log.py boot_timeline``: from the server's first line
to the engine core's first line, ``engine_process_s``, and on). On CPU vLLM spawns its engine core whatever
the variable says (``platforms/cpu.py``), so a CPU run rehearses the script and shows no difference.

    .venv/bin/python benchmarks/engine_start.py --out /tmp/engine_start.json      # CPU: ~2 min
    bash scripts/gpu/host.sh launch engine-start                                   # the H200

Writes benchmarks/results/release-time/engine_start.json (GPU) by default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from benchmarks.harness import RESULTS, ROOT, boot_logs, driver_env, logger, now, versions  # noqa: E402

driver_env()

from quantize_serve.serving.spec import capacity_spec  # noqa: E402
from benchmarks.evidence import write_json_result  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.server import PREPARED_MARK, prepare_server, vllm_server  # noqa: E402

OUT = RESULTS / "release-time/engine_start.json"
METHOD = "VLLM_WORKER_MULTIPROC_METHOD"


def order(boots: int) -> list[str]:
    """spawn, fork, fork, spawn, ...: each method as often first of a pair as second."""
    pairs = [("spawn", "fork") if i % 2 == 0 else ("fork", "spawn") for i in range((boots + 1) // 2)]
    return [m for pair in pairs for m in pair][:boots]


def boot(spec: Any, log_path: Path, method: str, architectures: list[str], log: Any) -> dict[str, Any]:
    os.environ[METHOD] = method  # the host's setting wins over the flow's default (serving_env)
    prepare_server(log_path, architectures)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the flow's boots find their process prepared
        # the model-info line's words either way: server.INSPECTED, or "not inspected ahead (...)"
        if log_path.exists() and "inspected ahead" in log_path.read_text(errors="replace"):
            break
        time.sleep(1)
    with vllm_server(spec, log_path=log_path) as server:
        seconds = server.boot_seconds
        served = '"object":"list"' in server.get("/v1/models").replace(" ", "")
    row = boot_logs(log_path.parent)[0]
    log(f"{method}: ready in {seconds} s, engine process at {row['timeline_s']['engine_process_s']} s")
    return {"method": method, "boot_seconds": seconds, "served": served, **row}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "tiny-llama-awq.yaml")
    p.add_argument("--boots", type=int, default=4)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    log = logger("engine")
    recipe = load_recipe(args.recipe)
    model_dir = recipe.path(recipe.model.id)  # a local base: the reference models
    spec = capacity_spec(recipe, Boot.BASE, model_dir)
    architectures = json.loads((model_dir / "config.json").read_text())["architectures"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="qs-engine-start-") as tmp:
        for i, method in enumerate(["fork", *order(args.boots)]):
            row = boot(spec, Path(tmp) / f"{i}" / f"vllm-{method}.log", method, architectures, log)
            rows.append({"warm_up": i == 0, **row})
    os.environ.pop(METHOD, None)

    def median(method: str, key: str) -> float | None:
        counted = [r for r in rows if r["method"] == method and not r["warm_up"]]
        values = [r[key] if key in r else r["timeline_s"][key] for r in counted]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    result = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "measured": now(),
        "recipe": str(args.recipe.relative_to(ROOT)),
        "model": recipe.model.id,
        "serve": recipe.serve.model_dump(mode="json"),
        "versions": versions(),
        "prepared_mark": PREPARED_MARK,
        "median": {
            m: {k: median(m, k) for k in ("boot_seconds", "engine_process_s", "server_ready_s")}
            for m in ("spawn", "fork")
        },
        "boots": rows,
    }
    write_json_result(args.out, result, roots=[ROOT])
    log(f"wrote {args.out}: {result['median']}")


if __name__ == "__main__":
    main()
