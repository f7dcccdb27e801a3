"""A look's lm-eval calls in lanes (gates/lanes.py) against one call for every task, on one vLLM server.

The question: how long does an accuracy run take when its generation tasks and its scored tasks go to the
server at the same time (the gate's way since lanes), against lm-eval's own way, one call for every task,
which runs the request kinds one after the other (every generation first, then every log-likelihood), and
does every document keep its outcome?

The work: SmolLM2-135M-Instruct (models/smollm2-135m-instruct), served with recipes/smollm2-135m-awq.yaml's
serve section (16-bit KV), its three real-text tasks (scored: a perplexity, a cloze and a next-sentence
choice) and a generation task made here from the same texts (``continue``: a text's first words, then the
model continues greedily up to GENERATE_TOKENS tokens; lm-eval's ``generate_until``, scored by exact
match), LIMIT documents each, through ``run_accuracy`` as the flow calls it (lm-eval's concurrency the
server's ``max_num_seqs``). One boot; the two ways alternate, ``--repeats`` times each. Per way: the
seconds of each run, and the documents whose outcome differs from the first run of the lanes' way (the
lanes' own repeats give the floor that serving alone makes: batch composition moves a log-likelihood by
bf16 noise).

On the 2-core CPU the server is compute-bound, so the decode steps that the scored requests fill are
no cheaper than those requests alone; on a GPU a decode step leaves most of the device idle, which is
what the lanes fill (the H200's release-time runs measure it: benchmarks/results/h200_release_time.json).

    .venv/bin/python benchmarks/accuracy_lanes.py    # ~8 min on 2 cores (6 runs of ~75 s, one boot)
    .venv/bin/python benchmarks/accuracy_lanes.py --limit 16 --repeats 1 --out /tmp/lanes.json   # smoke

Writes benchmarks/results/accuracy_lanes.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from benchmarks.harness import RESULTS, ROOT, driver_env, logger, now, versions  # noqa: E402

driver_env()

from quantize_serve.core.portable import write_json_result  # noqa: E402
from quantize_serve.gates import lanes  # noqa: E402
from quantize_serve.gates.accuracy import lm_eval_concurrency, prepare_run, run_accuracy  # noqa: E402
from quantize_serve.recipe.gates import AccuracyTask  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serving.server import ServerSpec, vllm_server  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-135m-awq.yaml"
TEXTS = ROOT / "data" / "evals" / "realtext_ppl.jsonl"
LIMIT = 60  # documents a task
GENERATE_TOKENS = 96
PROMPT_WORDS = 12
KV_CACHE_BYTES = 512 * 2**20  # ~22k tokens of 16-bit KV for this model: every lm-eval batch fits
OUT = RESULTS / "accuracy_lanes.json"
log = logger("lanes")

GENERATION_TASK = """\
task: qs_realtext_continue
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
target_delimiter: ""
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: {tokens}
  do_sample: false
  temperature: 0.0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def generation_task(folder: Path) -> Path:
    """The ``continue`` task: each text's first PROMPT_WORDS words, the rest of its first 40 the target."""
    rows = []
    for line in TEXTS.read_text().splitlines():
        words = json.loads(line)["text"].split()
        if len(words) > PROMPT_WORDS + 4:
            rows.append(
                {"prompt": " ".join(words[:PROMPT_WORDS]), "target": " " + " ".join(words[PROMPT_WORDS:40])}
            )
    data = folder / "continue.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = folder / "qs_realtext_continue.yaml"
    path.write_text(GENERATION_TASK.format(data=data, tokens=GENERATE_TOKENS))
    return path


def one_call(task: Any) -> str:
    """lm-eval's own way, for the baseline: every task in the scored lane, so one call holds them all."""
    return lanes.SCORE


def differing(first: dict[str, Any], other: dict[str, Any]) -> dict[str, int]:
    """Per task, the documents whose outcome differs between two runs."""
    return {
        Path(task).stem: sum(1 for key, doc in run.documents.items() if other[task].documents.get(key) != doc)
        for task, run in first.items()
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=LIMIT, help=f"documents a task (default {LIMIT})")
    p.add_argument("--repeats", type=int, default=3, help="runs of each way, alternating (default 3)")
    p.add_argument("--out", type=Path, default=OUT, help=f"default {OUT.relative_to(ROOT)}")
    args = p.parse_args(argv)
    recipe = load_recipe(RECIPE)
    model_dir = Path(recipe.base_dir) / recipe.model.id
    scratch = Path(tempfile.mkdtemp(prefix="qs-lanes-"))
    tasks = [
        *(t.model_copy(update={"limit": args.limit}) for t in recipe.gates.accuracy.tasks),
        AccuracyTask(task=str(generation_task(scratch)), limit=args.limit),
    ]
    gate = recipe.gates.accuracy.model_copy(update={"tasks": tasks})
    spec = ServerSpec(
        model_dir=str(model_dir),
        serve=recipe.serve,
        kv_cache_dtype="auto",
        kv_cache_memory_bytes=KV_CACHE_BYTES,
    )
    concurrency = lm_eval_concurrency(gate, recipe.serve)
    runs: dict[str, list[dict[str, Any]]] = {"lanes": [], "one_call": []}
    first = None
    started = time.monotonic()
    prepared = prepare_run(gate, Path(recipe.base_dir))  # lm-eval's imports and task index, once for all runs
    with vllm_server(spec, log_path=scratch / "vllm.log") as server:
        log(f"vLLM up in {server.boot_seconds} s; {len(tasks)} tasks, {args.limit} documents each")
        for k in range(args.repeats):
            for way in ("lanes", "one_call"):
                with mock.patch.object(lanes, "lane", one_call) if way == "one_call" else nullcontext():
                    run = run_accuracy(
                        server.base_url,
                        gate,
                        tokenizer_dir=str(model_dir),
                        max_length=recipe.serve.max_model_len,
                        base_dir=Path(recipe.base_dir),
                        output_dir=scratch / f"{way}-{k}",
                        num_concurrent=concurrency,
                        log=lambda line: None,
                        prepared=prepared,
                    )
                first = first or run.tasks
                row = {
                    "seconds": run.seconds,
                    "task_seconds": {Path(t).stem: round(r.seconds, 1) for t, r in run.tasks.items()},
                    "documents_differing_from_the_first_lanes_run": differing(first, run.tasks),
                }
                runs[way].append(row)
                differ = row["documents_differing_from_the_first_lanes_run"]
                log(f"{way} #{k + 1}: {run.seconds} s, documents differing {differ}")
    median = {way: statistics.median(r["seconds"] for r in rows) for way, rows in runs.items()}
    result = {
        "question": "an accuracy run's seconds with its generation and scored tasks in lanes at the same "
        "time, against one lm-eval call for every task (lm-eval's own way: its request kinds one after the "
        "other), on one vLLM server; and whether each document keeps its outcome",
        "measured": now(),
        "model": str(model_dir.relative_to(ROOT)),
        "recipe": str(RECIPE.relative_to(ROOT)),
        "serve": {
            "max_model_len": recipe.serve.max_model_len,
            "max_num_seqs": recipe.serve.max_num_seqs,
            "max_num_batched_tokens": recipe.serve.max_num_batched_tokens,
            "kv_cache_dtype": "auto",
            "kv_cache_memory_bytes": KV_CACHE_BYTES,
            "enforce_eager": recipe.serve.enforce_eager,
        },
        "tasks": [Path(t.task).stem for t in tasks],
        "documents_per_task": args.limit,
        "generate_tokens": GENERATE_TOKENS,
        "lm_eval_concurrency": concurrency,
        "runs": runs,
        "median_seconds": median,
        "lanes_over_one_call": round(median["lanes"] / median["one_call"], 3),
        "wall_seconds": round(time.monotonic() - started, 1),
        "versions": versions(),
    }
    write_json_result(args.out, result, roots=[ROOT])
    log(f"lanes {median['lanes']} s against one call {median['one_call']} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
