"""Context-once scoring against lm-eval's echo path on a real model, by KV dtype (issue 72, item 5).

On an H100 (vLLM 0.26) the SmolLM2-135M AWQ candidate served with an fp8 KV cache had its context-once
check disagree with the echo path (2 of 32 one-token scores, the first 0.29 nats apart); the base, with a
16-bit KV cache, agreed. vLLM's FlashAttention backend writes a pass's K/V into the (fp8) cache and reads
every key back from it, cached or computed in that pass, with Q quantized to fp8 too: the two paths compute
the same quantity, and differ only by numerics that depend on the batch. This measures that on the card:
the same cloze and next-sentence requests (data/evals/realtext_*.jsonl) scored three ways on each boot,

- ``echo``: lm-eval's echo path as the gate sends it (``batch_size`` prompts a request, ``num_concurrent``);
- ``echo_alone``: the same requests again, one prompt a request, one at a time (gates/scoring.py
  ``_echo_one_at_a_time``, the check's second look);
- ``ours``: the context-once path (one-token choices from the context request; multi-token ones through the
  generate route when the boot runs the V2 model runner),

and reports, per boot, how far ``echo_alone`` and ``ours`` land from ``echo`` (nats a token). Expected if
the diagnosis holds: on the fp8 boot ``echo_alone`` moves about as far as ``ours`` does, and both stay
within bf16 noise on the 16-bit KV boot; ``ours`` far beyond ``echo_alone`` on fp8 would mean a real path
difference instead.

    .venv/bin/python benchmarks/context_once_fp8.py [--checkpoint DIR] [--docs 64]   # ~2 min on an H100

Without ``--checkpoint`` the recipe's AWQ checkpoint is made first (recipes/smollm2-135m-awq.yaml). Writes
benchmarks/results/context_once_fp8.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from benchmarks.harness import RESULTS, ROOT, driver_env, logger, now, quantize_once, versions  # noqa: E402

driver_env()

from quantize_serve.capacity.measure import capacity_spec  # noqa: E402
from quantize_serve.core.settings import get_settings  # noqa: E402
from quantize_serve.core.portable import write_json_result  # noqa: E402
from quantize_serve.gates.accuracy import completions_model  # noqa: E402
from quantize_serve.gates.scoring import agrees, group_by_context  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.gpu import describe_devices  # noqa: E402
from quantize_serve.serving.server import vllm_server  # noqa: E402
from quantize_serve.serving.vllm_log import read_log, v2_model_runner  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-135m-awq.yaml"
OUT = RESULTS / "context_once_fp8.json"
DATA = [ROOT / "data/evals/realtext_cloze.jsonl", ROOT / "data/evals/realtext_next_sentence.jsonl"]
log = logger("context-once")


def documents(docs: int) -> list[tuple[str, str]]:
    """The first ``docs`` rows of each task as lm-eval's (context, continuation) pairs (no delimiter)."""
    pairs = []
    for path in DATA:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:docs]
        pairs += [(row["query"], choice) for row in rows for choice in row["choices"]]
    return pairs


def spread(
    scores: dict[int, tuple[float, bool]], echo: dict, requests: list, kind: str | None = None
) -> dict:
    """How far ``scores`` land from ``echo``: nats a token (max, p99, median) and how many are over the
    check's bf16 tolerance (scoring.agrees), over the requests of ``kind`` (first / rows; None: all)."""
    ids = [i for i in scores if kind is None or (len(requests[i][2]) > 1) == (kind == "rows")]
    per_token = sorted(abs(scores[i][0] - echo[i][0]) / len(requests[i][2]) for i in ids)
    if not per_token:
        return {"requests": 0}
    return {
        "requests": len(ids),
        "max": round(per_token[-1], 4),
        "p99": round(per_token[min(len(ids) - 1, int(0.99 * len(ids)))], 4),
        "median": round(statistics.median(per_token), 4),
        "over_tolerance": sum(not agrees(scores[i], echo[i], len(requests[i][2])) for i in ids),
        "greedy_differs": sum(scores[i][1] != echo[i][1] for i in ids),
    }


def measure(recipe, boot: Boot, model_dir: Path, pairs: list[tuple[str, str]], run_dir: Path) -> dict:
    spec = capacity_spec(recipe, boot, model_dir)
    log_path = run_dir / f"vllm-{boot.value}.log"
    with vllm_server(spec, log_path=log_path) as server:
        v2 = v2_model_runner(read_log(log_path))
        lm = completions_model(
            server.base_url,
            recipe.gates.accuracy,
            tokenizer_dir=str(model_dir),
            max_length=spec.serve.max_model_len,
            num_concurrent=recipe.serve.max_num_seqs,
            reuse_rows=v2,
        )
        requests = [("k", *lm._encode_pair(context, cont)) for context, cont in pairs]
        indices = list(range(len(requests)))
        echo = lm._echo(requests, indices)
        alone = lm._echo_one_at_a_time(requests, indices)
        groups, _ = group_by_context(requests, lm.max_length)
        ours_groups = [
            (ctx, members)
            for ctx, members in groups.items()
            if v2 or all(len(requests[i][2]) == 1 for i in members)
        ]
        ours, failed = asyncio.run(lm._score_groups(requests, ours_groups))
    row = {
        "boot": boot.value,
        "kv_cache_dtype": spec.effective_kv_dtype,
        "v2_model_runner": v2,
        "requests": len(requests),
        "echo_alone_vs_echo": spread(alone, echo, requests),
        "ours_vs_echo": {kind: spread(ours, echo, requests, kind) for kind in ("first", "rows")},
        "ours_vs_echo_alone": {kind: spread(ours, alone, requests, kind) for kind in ("first", "rows")},
        "not_lined_up": len(failed),
        "scoring_counts": dict(lm.stats),
    }
    log(json.dumps(row))
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="the AWQ checkpoint (default: quantize it first)")
    parser.add_argument("--docs", type=int, default=64, help="documents of each task (4 requests each)")
    parser.add_argument(
        "--recipe", type=Path, default=RECIPE, help="(a CPU rehearsal: the tiny-llama recipe)"
    )
    parser.add_argument("--boots", nargs="+", default=[Boot.PRODUCTION.value, Boot.QUANTIZED_16BIT_KV.value])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    # on a GPU, the KV cache from gpu_memory_utilization (the recipe's budget is its CPU hosts')
    overrides = {"serve.memory_budget": None} if describe_devices() else {}
    recipe = load_recipe(args.recipe, overrides)
    checkpoint = args.checkpoint
    if checkpoint is None:  # quantized as the flow's stage does, into the work dir's cache
        checkpoint = Path(quantize_once(args.recipe, overrides, get_settings().work_dir)["checkpoint_dir"])
    run_dir = Path(tempfile.mkdtemp(prefix="context-once-fp8-"))  # the boots' vLLM logs
    log(f"vLLM logs in {run_dir}")
    pairs = documents(args.docs)
    rows = [measure(recipe, Boot(boot), checkpoint, pairs, run_dir) for boot in args.boots]
    result = {"when": now(), "device": describe_devices(), "versions": versions(), "docs_per_task": args.docs}
    write_json_result(args.out, result | {"boots": rows})
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
