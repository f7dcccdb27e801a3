"""The order of the context-once path's requests, and the prompt tokens vLLM's prefix cache leaves to compute.

The question: the context-once path (``gates/scoring.py``) sends a group's context request, then its
choices' rows, which read the context's blocks from vLLM's prefix cache. On the H100 and H200 first
releases, the base's one-look pass computed 5.68M and 5.41M of the 13.05M prompt tokens it sent, where the
candidate's four looks computed 3.40M of the same documents' 13.05M: are the base's rows computing their
contexts again, because every context of the call is sent before the first group's rows (the client's
request slots wake in order), and by then the contexts sent since have evicted their blocks? And what does
the path compute when the groups in flight are bounded to the request slots (the gate's way)?

The work: the llama3 recipe's task set as the H200 release-time benchmark runs it (production_stack.py's
``production_task_set``: the production-shaped rows token-true with the reference tokenizer, which the GPU
runs serve with), each look one lm-eval call a lane as the gate makes them, through the gate's own model
(``ContextOnceCompletions``, rows on). The server is a model of vLLM's prefix cache: full 16-token blocks
keyed by their prefix, least recently used evicted beyond the KV cache's size; a context or row request
computes what its leading cached blocks do not cover (at least its last token), and every block it holds is
then cached. Not modelled: the blocks of requests in flight (not evictable in vLLM) and the gsm8k lane's
interleaving (its generation requests run first here, on the same cache); the check against the echo path
(36 requests) is off. The model is checked against the runs it explains: the same counts, computed unbounded,
at each run's KV cache size, beside what vLLM reported (``measured``). Where a run measured the bound too
(``measured_bounded``), what the model leaves out shows: on the H100's 151,968 tokens the base computed 4.70M,
not 3.70M, as the gsm8k lane's 650 prompts in flight held the cache for its first 100 s (the gate's lanes now
keep to a share of the KV cache each, gates/scoring.py within_share: measured on a fresh H100 since, 4.62M).

    .venv/bin/python benchmarks/context_order.py      # ~3 min on 2 cores

Writes benchmarks/results/release-time/context_order.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from benchmarks.harness import RESULTS, ROOT, TOKENIZER, driver_env, logger, now, versions  # noqa: E402

driver_env()

from benchmarks.production_stack import PRODUCTION_RECIPE, production_task_set  # noqa: E402
from quantize_serve.core.portable import write_json_result  # noqa: E402
from quantize_serve.gates.accuracy import evaluate_tasks, lm_eval_concurrency  # noqa: E402
from quantize_serve.gates.documents import look_documents, per_document_fewshot  # noqa: E402
from quantize_serve.gates.lanes import lanes  # noqa: E402
from quantize_serve.gates.lm_eval_host import host_work_once  # noqa: E402
from quantize_serve.gates.scoring import GENERATE_PATH, ContextOnceCompletions  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402

OUT = RESULTS / "release-time/context_order.json"
BLOCK = 16  # vLLM's block size on the GPU (planner.BLOCK_SIZE_GPU)
MAX_LENGTH = 8192  # the llama3 recipe's serve.max_model_len
# The runs the model is checked against (benchmarks/results/release-time/h200_release_time.json): the KV
# cache the
# server scored with, its looks, and the prompt tokens vLLM computed of those sent (both lanes).
RUNS = {
    "base_h100": {
        "kv_tokens": 151_968,
        "looks": "one",
        "measured": {"sent": 13_048_004, "computed": 5_680_260},
        "from": "earlier_sessions.first_release_2026-12-05 (one H100): the base at 0.44",
        "measured_bounded": {"sent": 13_048_004, "computed": 4_704_436},
        "bounded_from": "runs.first_release (2026-12-05, one H100): the same, groups in flight bounded",
    },
    "base_h200": {
        "kv_tokens": 427_728,
        "looks": "one",
        "measured": {"sent": 13_048_004, "computed": 5_407_012},
        "from": "earlier_sessions.first_release_2026-12-04 (one H200): the base at 0.49",
    },
    "candidate_h100": {
        "kv_tokens": 1_060_576,
        "looks": "all",
        "measured": {"sent": 13_046_589, "computed": 3_404_205},
        "from": "runs.re_release_warm (2026-12-05, one H100): the candidate, fp8 KV at 0.90, four looks",
    },
}
ORDERS = {"unbounded": 10**9, "bounded": None}  # groups in flight; None: the gate's (its request slots)


class PrefixCache:
    """Full blocks keyed by their prefix (vLLM's chained block hash), least recently used evicted."""

    def __init__(self, tokens: int) -> None:
        self.capacity = tokens // BLOCK
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.sent = self.computed = 0

    def serve(self, ids: list[int], *, read: bool = True) -> None:
        keys, key = [], 0
        for start in range(0, len(ids) - len(ids) % BLOCK, BLOCK):
            key = hash((key, tuple(ids[start : start + BLOCK])))
            keys.append(key)
        hits = 0
        while read and hits < len(keys) and keys[hits] in self.blocks:
            hits += 1
        self.sent += len(ids)
        self.computed += max(len(ids) - hits * BLOCK, 1)
        for k in keys:
            self.blocks[k] = None
            self.blocks.move_to_end(k)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


class Replay(ContextOnceCompletions):
    """The gate's model with the prefix-cache model for a server."""

    cache: PrefixCache

    def _poster(self, session: Any, sem: asyncio.Semaphore):
        async def post(path: str, payload: dict) -> dict:
            async with sem:
                await asyncio.sleep(0)  # the other requests in flight go on meanwhile
                if path == GENERATE_PATH:
                    ids = payload["token_ids"]
                    self.cache.serve(ids)
                    return {
                        "prompt_logprobs": [None, *({str(t): {"logprob": -1.0, "rank": 1}} for t in ids[1:])]
                    }
                ids = payload["logprob_token_ids"]
                self.cache.serve(payload["prompt"])
                top = {f"token_id:{t}": -1.0 for t in ids}
                return {"choices": [{"logprobs": {"top_logprobs": [top], "tokens": [f"token_id:{ids[0]}"]}}]}

        return post

    def _echo(self, requests: list, indices: list[int], count: str = "echo_requests") -> dict:
        self.stats[count] += len(indices)
        for i in indices:  # prompt logprobs: the cache is written, never read
            _, ctx, cont = requests[i]
            self.cache.serve(ctx + cont, read=False)
        return {i: (-1.0, False) for i in indices}

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        for request in requests:
            self.cache.serve(self.tok_encode(request.args[0]))
        return ["" for _ in requests]


def replay(tasks: list[SimpleNamespace], gate: Any, task_manager: Any, run: dict, groups: int | None):
    """Every call of the run's looks (one look: the base's pass) through one cache: the tokens sent and
    computed, gsm8k's lane apart."""
    lm = Replay(
        base_url="http://127.0.0.1:9/v1/completions",
        model="model",
        tokenizer=str(TOKENIZER),
        tokenizer_backend="huggingface",
        tokenized_requests=True,
        max_length=MAX_LENGTH,
        num_concurrent=lm_eval_concurrency(gate, load_recipe(PRODUCTION_RECIPE).serve),
        reuse_rows=True,
        check_groups=0,
    )
    lm.cache = PrefixCache(run["kv_tokens"])
    lm.groups_in_flight = groups
    looks = [1.0] if run["looks"] == "one" else gate.looks
    lanes_seen: dict[str, dict[str, int]] = {}
    with per_document_fewshot(gate.seed), host_work_once():
        for look, end in enumerate(looks):
            for lane, calls in lanes(tasks).items():
                for call in calls:
                    before = (lm.cache.sent, lm.cache.computed)
                    start = looks[look - 1] if look else 0.0
                    samples = {m: d for t in call for m, d in look_documents(t.order, start, end).items()}
                    members = {n: m for t in call for n, m in t.members.items()}
                    evaluate_tasks(
                        lm,
                        [t.spec for t in call],
                        members,
                        "http://127.0.0.1:9",
                        samples=samples,
                        seed=gate.seed,
                        task_manager=task_manager,
                    )
                    seen = lanes_seen.setdefault(str(lane), {"sent": 0, "computed": 0})
                    seen["sent"] += lm.cache.sent - before[0]
                    seen["computed"] += lm.cache.computed - before[1]
    return {
        "sent": lm.cache.sent,
        "computed": lm.cache.computed,
        "lanes": lanes_seen,
        "counts": dict(lm.stats),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    log = logger("context-order")
    result: dict[str, Any] = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "measured": now(),
        "model": __doc__.split("\n\n")[2].replace("\n", " "),
        "block_tokens": BLOCK,
        "versions": versions(),
        "runs": {},
    }
    with production_task_set() as (gate, tasks, task_manager):
        result["tasks"] = [t.spec.task.model_dump(mode="json", exclude_defaults=True) for t in tasks]
        for name, run in RUNS.items():
            out = result["runs"][name] = dict(run)
            for order, groups in ORDERS.items():
                out[order] = replay(tasks, gate, task_manager, run, groups)
                log(f"{name} {order}: computed {out[order]['computed']:,} of {out[order]['sent']:,}")
            out["saved_tokens"] = out["unbounded"]["computed"] - out["bounded"]["computed"]
            out["saved_share"] = round(out["saved_tokens"] / out["unbounded"]["computed"], 3)
            out["model_vs_measured"] = round(out["unbounded"]["computed"] / run["measured"]["computed"], 3)
    write_json_result(args.out, result, roots=[ROOT])
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
