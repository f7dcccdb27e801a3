"""The host's part of an accuracy look: lm-eval building the production task set's requests, and its metrics.

The question: how long does lm-eval keep a look's documents on the host before the first request can go
to the server (and after the last answer), as stock lm-eval does it (each prompt template compiled for
every render, the environment described at the end of every call) and the gate's way
(``gates/lm_eval_host.py``: each template compiled once, the environment described once a run), and are
the prompts the same?

The work: the llama3 recipe's task set as the H200 release-time benchmark runs it (gsm8k 5-shot,
arc_challenge 25-shot, hellaswag 10-shot, mmlu 5-shot at their limits: ``release-time`` scenario) on the
production-shaped rows that benchmark publishes to a local Hub (``localhub/datasets.py``, token-true), the
gate's seeded draw and looks, each look one ``simple_evaluate`` call a lane as the gate makes them
(``evaluate_tasks``, ``per_document_fewshot``, ``gates/lanes.py``: gsm8k's call, then the scored tasks').
The model is lm-eval's ``DummyLM``: no server, so the seconds are lm-eval's host work alone (on a GPU host
that work leaves the device idle; lanes do not hide it, the GIL runs one thread's Python at a time). The two
ways alternate, ``--repeats`` times each; each document's prompt hash is compared between them.

    .venv/bin/python benchmarks/request_building.py      # ~3 min on 2 cores

Writes benchmarks/results/release-time/request_building.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from benchmarks.harness import RESULTS, ROOT, driver_env, load_scenario, logger, now, versions  # noqa: E402

driver_env()

from benchmarks.production_stack import PRODUCTION_RECIPE, production_task_set  # noqa: E402

from quantize_serve.core.portable import write_json_result  # noqa: E402
from quantize_serve.gates.accuracy import evaluate_tasks  # noqa: E402
from quantize_serve.gates.documents import (  # noqa: E402
    look_documents,
    per_document_fewshot,
)
from quantize_serve.gates.lanes import lanes  # noqa: E402
from quantize_serve.gates.lm_eval_host import host_work_once  # noqa: E402

OUT = RESULTS / "release-time/request_building.json"
WAYS = {"stock": contextlib.nullcontext, "host_work_once": host_work_once}


def run_looks(way: str, tasks: list[SimpleNamespace], gate: Any, task_manager: Any) -> dict[str, Any]:
    """Every look, one call a lane as the gate makes them (one after the other here), but for the model:
    seconds a call a look, and each document's prompt hash."""
    from lm_eval.models.dummy import DummyLM

    seconds: dict[str, list[float]] = {}
    hashes: dict[str, str] = {}
    with per_document_fewshot(gate.seed), WAYS[way]():
        for look, end in enumerate(gate.looks):
            for call in [c for calls in lanes(tasks).values() for c in calls]:
                start = gate.looks[look - 1] if look else 0.0
                samples = {m: docs for t in call for m, docs in look_documents(t.order, start, end).items()}
                t0 = time.monotonic()
                results = evaluate_tasks(
                    DummyLM(),
                    [t.spec for t in call],
                    {n: m for t in call for n, m in t.members.items()},
                    "http://127.0.0.1:9",  # never asked: DummyLM answers
                    samples=samples,
                    seed=gate.seed,
                    task_manager=task_manager,
                )
                name = "+".join(t.spec.task.task for t in call)
                seconds.setdefault(name, []).append(round(time.monotonic() - t0, 2))
                for member, rows in results["samples"].items():
                    hashes.update({f"{member}/{r['doc_id']}": r["prompt_hash"] for r in rows})
    per_look = [round(sum(s[i] for s in seconds.values()), 2) for i in range(len(gate.looks))]
    total = round(sum(per_look), 2)
    return {"seconds": seconds, "look_seconds": per_look, "total_s": total, "hashes": hashes}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    log = logger("requests")
    scenario_tasks = load_scenario("release-time")["tasks"]
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    with production_task_set() as (gate, tasks, task_manager):
        for repeat in range(args.repeats):
            for way in WAYS:
                runs[way].append(run_looks(way, tasks, gate, task_manager))
                log(f"{way} run {repeat + 1}: looks {runs[way][-1]['look_seconds']} s")
    reference = runs["stock"][0]["hashes"]
    result = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "measured": now(),
        "recipe": str(PRODUCTION_RECIPE.relative_to(ROOT)),
        "tasks": scenario_tasks,
        "looks": gate.looks,
        "model": "lm-eval's DummyLM (no server: lm-eval's host work alone)",
        "cpu": f"{os.cpu_count()} cores",
        "versions": versions(),
        "documents": len(reference),
        "ways": {
            way: {
                "median_total_s": statistics.median(r["total_s"] for r in rs),
                "runs": [{k: v for k, v in r.items() if k != "hashes"} for r in rs],
                "prompts_differing_from_stock": sum(
                    r["hashes"].get(k) != h for r in rs for k, h in reference.items()
                ),
            }
            for way, rs in runs.items()
        },
    }
    write_json_result(args.out, result, roots=[ROOT])
    log(f"wrote {args.out}: " + ", ".join(f"{w} {v['median_total_s']} s" for w, v in result["ways"].items()))


if __name__ == "__main__":
    main()
