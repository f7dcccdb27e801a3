"""The prompt tokens the production recipe's accuracy gate scores a model: what its time depends on.

Builds lm-eval's own requests for the recipe's task set (gsm8k 5-shot, arc_challenge 25-shot, hellaswag
10-shot, mmlu 5-shot at their limits, ``benchmarks/h200_release_time.py``'s TASKS) from the production-shaped
rows the H200 benchmark publishes (``localhub/datasets.py``), on a local Hub, and counts each request's
tokens with the served tokenizer (the reference model's, the one the H200 benchmark serves): requests,
tokens, and the tokens left if each distinct context were scored once (the share a multiple-choice task
scores again for each answer choice: vLLM skips its prefix cache for requests that ask for prompt logprobs).
Both data sets: ``unscaled`` (the rows as first published, the real datasets' word counts) and
``token_true`` (scaled to Llama-3's tokens a word, as the H200 benchmark now publishes them). CPU only,
~2 min.

    .venv/bin/python benchmarks/scored_tokens.py        # -> benchmarks/results/scored_tokens.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from benchmarks.harness import ROOT, load_scenario  # noqa: E402
from localhub.client import hub_client_env  # noqa: E402
from localhub.datasets import TOKENS_PER_WORD, publish_production_tasks, tokens_per_word  # noqa: E402
from localhub.server import start_local_hub  # noqa: E402
from quantize_serve.core.portable import write_json_result  # noqa: E402

OUT = ROOT / "benchmarks/results/scored_tokens.json"
TOKENIZER = ROOT / "models/tiny-llama"
TASKS = load_scenario("release-time")[
    "tasks"
]  # the production recipe's task set, as the H200 benchmark runs it
TOKEN = "hf_scored_tokens"
FEWSHOT_SEED = 1234  # lm_eval.simple_evaluate's fewshot_random_seed default, which the accuracy gate keeps


def count(tasks: list[dict[str, Any]], tokenizer: Any) -> dict[str, Any]:
    """Requests and tokens per task, as lm-eval builds them against the Hub the environment names."""
    from lm_eval.tasks import TaskManager, get_task_dict

    def leaves(d: dict[str, Any]) -> Any:
        for v in d.values():
            yield from (leaves(v) if isinstance(v, dict) else [v])

    manager, out = TaskManager(), {}
    for spec in tasks:
        requests = tokens = distinct = 0
        request_type = None
        for task in leaves(get_task_dict([spec["task"]], manager)):
            task.set_config(key="num_fewshot", value=spec["num_fewshot"])
            task.set_fewshot_seed(seed=FEWSHOT_SEED)  # as simple_evaluate seeds it: the flow's few-shot draws
            task.build_all_requests(limit=spec["limit"], rank=0, world_size=1)
            seen: set[str] = set()
            for instance in task.instances:
                request_type = instance.request_type
                context, rest = instance.args[0], instance.args[1]
                n_context = len(tokenizer(context)["input_ids"])
                n_all = len(tokenizer(context + rest)["input_ids"]) if isinstance(rest, str) else n_context
                requests += 1
                tokens += n_all
                distinct += n_all - (n_context if context in seen else 0)
                seen.add(context)
        out[spec["task"]] = {
            "requests": requests,
            "tokens": tokens,
            "distinct_context_tokens": distinct,
            "request_type": request_type,
        }
    scored = [v for v in out.values() if v["request_type"] == "loglikelihood"]
    out["loglikelihood_total"] = {
        "tokens": sum(v["tokens"] for v in scored),
        "distinct_context_tokens": sum(v["distinct_context_tokens"] for v in scored),
    }
    total = out["loglikelihood_total"]
    total["repeated_share"] = round(1 - total["distinct_context_tokens"] / total["tokens"], 3)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)

    from huggingface_hub import HfApi
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    result: dict[str, Any] = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "tasks": TASKS,
        "tokenizer": str(TOKENIZER.relative_to(ROOT)),
        "tokens_per_word": {
            "served_tokenizer": round(tokens_per_word(tokenizer), 3),
            "llama3": TOKENS_PER_WORD,
        },
    }
    for name, publish_with in (("unscaled", None), ("token_true", tokenizer)):
        with (
            tempfile.TemporaryDirectory(prefix="qs-scored-tokens-") as tmp,
            start_local_hub(Path(tmp) / "hub", tokens=(TOKEN,)) as hub,
            hub_client_env(hub.endpoint, cache_dir=Path(tmp) / "cache"),
        ):
            publish_production_tasks(HfApi(endpoint=hub.endpoint, token=TOKEN), tokenizer=publish_with)
            result[name] = count(TASKS, tokenizer)
        print(name, result[name]["loglikelihood_total"], flush=True)
    write_json_result(args.out, result, roots=[ROOT])


if __name__ == "__main__":
    main()
