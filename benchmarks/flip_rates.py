"""Flip rates on real text: how many documents change their outcome when the real reference model is
quantized.

The question (issue 41): for SmolLM2-135M-Instruct (models/smollm2-135m-instruct, reference/smollm2.py)
quantized three ways, on the real-text tasks (evals/tasks/qs_realtext_*.yaml, reference/realtext.py),
how often does a document's 0/1 outcome differ between the base and the quantized copy (both
directions counted: n10 = right -> wrong, n01 = wrong -> right), and for perplexity how widely the
per-document log-likelihood differences spread. A paired gate's sample size follows from these.

Steps, with the project's own functions:
1. ``validate_recipe`` + ``resolve_base`` on recipes/smollm2-135m-awq.yaml (base, calibration, serving).
2. ``quantize_model`` per candidate (CANDIDATES: the recipe's quantization section with the candidate's
   method, scheme and group size), cached in the work folder by its inputs like every pipeline run.
3. Per model (the base first, then each candidate): ``vllm_server`` boots it with the recipe's serve
   section and ``--kv-cache-dtype`` (default ``auto``: 16-bit KV for every model, so the flips are the
   weights' alone) and a fixed KV budget; lm-eval (``local-completions`` through
   ``quantize_serve.gates.accuracy.run``'s task loading and model) runs every task with ``log_samples``.
   Each model's per-document outcomes are kept in the scratch folder, so a rerun skips the models it
   has (same checkpoint, tasks and settings).
4. Pairs each candidate with the base per document (same doc id and prompt hash) and writes
   benchmarks/results/flip-rates/flip_rates.json (figures) and flip_rates_samples.json (per document
   [base, candidate] outcomes, re-usable by another script).

    .venv/bin/python benchmarks/flip_rates.py                 # ~50 min on 2 cores (12 quantizing)
    .venv/bin/python benchmarks/flip_rates.py --limit 20      # a smoke run (not written to results/)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.evidence import write_json_result
from benchmarks.harness import servable
from quantize_serve.gates.accuracy.run import check_server, completions_model, index_tasks
from quantize_serve.gates.accuracy.task_files import resolve_task
from quantize_serve.quantize.run import quantize_model
from quantize_serve.recipe.quantization import QuantizationSection
from quantize_serve.serving.server import ServerSpec, vllm_server
from quantize_serve.validate.preflight import resolve_base, validate_recipe

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

RECIPE = ROOT / "recipes" / "smollm2-135m-awq.yaml"
# name -> what the candidate changes in the recipe's quantization section
# "base-rerun": no quantization, the base booted and scored again: the flips that serving alone makes
# (batch composition, threads), the floor under every candidate's.
CANDIDATES: dict[str, dict[str, Any]] = {
    "awq-w4a16-g64": {"method": "awq", "scheme": "W4A16_ASYM", "group_size": 64},
    "int8-w8a8": {"method": "smoothquant-gptq", "scheme": "W8A8"},
    "gptq-w4a16-g64": {"method": "gptq", "scheme": "W4A16", "group_size": 64},
    "base-rerun": {},
}
CONCURRENT = 2  # lm-eval's requests in flight (of 8 prompts each): the 2 cores stay busy
KV_CACHE_BYTES = 512 * 2**20  # every boot: ~22k tokens of 16-bit KV, plenty for lm-eval's batches
OUT = ROOT / "benchmarks" / "results" / "flip-rates" / "flip_rates.json"
SAMPLES_OUT = OUT.with_name("flip_rates_samples.json")
# lm-eval's per-document values: 0/1 for these, (log-likelihood, weight) for the perplexity metrics
BINARY_METRICS = ("acc", "acc_norm")
LOGLIK_METRICS = {"word_perplexity": "words", "byte_perplexity": "bytes", "bits_per_byte": "bytes"}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def log(message: str) -> None:
    print(f"[flip-rates {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


def candidate_recipe(recipe: Any, change: dict[str, Any]) -> Any:

    quantization = QuantizationSection(**{**recipe.quantization.model_dump(), **change})
    name = f"{recipe.name}-{change['method']}"
    return recipe.model_copy(update={"quantization": quantization, "name": name})


def quantize_candidates(validated: Any, base: Any, names: list[str], work: Path) -> dict[str, dict[str, Any]]:

    made = {}
    for name in names:
        if not CANDIDATES[name]:
            made[name] = {
                "checkpoint_dir": None,
                "method": None,
                "scheme": "bf16: the base, booted and scored again",
            }
            continue
        t0 = time.monotonic()
        with (work / f"quantize-{name}.log").open("a") as quantize_log:  # llm-compressor's output
            recipe = candidate_recipe(validated.recipe, CANDIDATES[name])
            result = quantize_model(
                recipe,
                Path(base.local_dir),
                base_identity=base.identity,
                calibration_fingerprint=validated.calibration_fingerprint,
                log=lambda line: print(line, file=quantize_log, flush=True),
            )
        made[name] = {
            "checkpoint_dir": result.checkpoint_dir,
            "method": result.method,
            "scheme": result.scheme,
            "group_size": CANDIDATES[name].get("group_size"),
            "quantize_seconds": result.seconds,
            "cached": result.cached,
            "base_bytes": result.base_bytes,
            "quantized_bytes": result.quantized_bytes,
        }
        how = "reused" if result.cached else f"quantized in {result.seconds:.0f} s:"
        log(
            f"{name}: {how} {result.checkpoint_dir} ({result.quantized_bytes / 1e6:.1f} MB, "
            f"wall {time.monotonic() - t0:.0f} s)"
        )
    return made


# ---------------------------------------------------------------------------
# Per-document outcomes of one model
# ---------------------------------------------------------------------------


def evaluate_model(
    model_dir: str, recipe: Any, *, kv_cache_dtype: str, limit: int | None, log_path: Path
) -> dict[str, Any]:
    """Boot ``model_dir``, run every task of the recipe's gate with log_samples; per task, per doc id:
    the prompt hash and each metric's per-document value."""
    import lm_eval

    gate = recipe.gates.accuracy
    specs = [resolve_task(t, Path(recipe.base_dir)) for t in gate.tasks]
    manager = index_tasks(specs)
    spec = ServerSpec(
        model_dir=model_dir,
        serve=recipe.serve,
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
    )
    out: dict[str, Any] = {"tasks": {}, "seconds": {}}
    t0 = time.monotonic()
    with vllm_server(spec, log_path=log_path) as server:
        out["boot_seconds"] = round(time.monotonic() - t0, 1)
        check_server(server.base_url)
        lm = completions_model(
            server.base_url,
            gate,
            tokenizer_dir=model_dir,
            max_length=recipe.serve.max_model_len,
            num_concurrent=CONCURRENT,
        )
        for task_spec in specs:
            t1 = time.monotonic()
            results = lm_eval.simple_evaluate(
                model=lm, tasks=[task_spec.load_spec], task_manager=manager, limit=limit, log_samples=True
            )
            out["tasks"][task_spec.name] = per_document(results["samples"][task_spec.name])
            seconds = out["seconds"][task_spec.name] = round(time.monotonic() - t1, 1)
            log(f"  {task_spec.name}: {len(out['tasks'][task_spec.name])} docs in {seconds} s")
    return out


def per_document(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    docs = {}
    for s in samples:
        values: dict[str, Any] = {}
        for metric in BINARY_METRICS:
            if metric in s:
                values[metric] = int(round(float(s[metric])))
        for metric in LOGLIK_METRICS:
            if metric in s:
                ll, weight = s[metric]
                values[metric] = [float(ll), int(weight)]
        docs[str(s["doc_id"])] = {"prompt_hash": s.get("prompt_hash"), "values": values}
    return docs


def cache_key(model_dir: str, recipe: Any, kv_cache_dtype: str, limit: int | None) -> str:
    """What determines a model's outcomes: its weights' manifest (or the base folder's SHA256SUMS, less the
    lines of its card and build record, which name the build's seconds), the task files and their data, the
    serving settings."""

    h = hashlib.sha256()
    folder = Path(model_dir)
    if (folder / "quantize_manifest.json").is_file():
        h.update((folder / "quantize_manifest.json").read_bytes())
    elif (folder / "SHA256SUMS").is_file():
        sums = (folder / "SHA256SUMS").read_text().splitlines()
        h.update("\n".join(s for s in sums if not s.endswith(("README.md", "conversion.json"))).encode())
    for task in recipe.gates.accuracy.tasks:
        task_file = (Path(recipe.base_dir) / task.task).resolve()
        h.update(task_file.read_bytes())
        data = yaml.safe_load(task_file.read_text())["dataset_kwargs"]["data_files"]["test"]
        h.update((task_file.parent / data).read_bytes())
    settings = [recipe.serve.model_dump(mode="json"), kv_cache_dtype, limit, KV_CACHE_BYTES]
    h.update(json.dumps(settings).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------
# Pairing (pure)
# ---------------------------------------------------------------------------


def paired_binary(base: dict[str, int], cand: dict[str, int]) -> dict[str, Any]:
    ids = sorted(base, key=int)
    n10 = sum(base[i] == 1 and cand[i] == 0 for i in ids)
    n01 = sum(base[i] == 0 and cand[i] == 1 for i in ids)
    n = len(ids)
    base_acc, cand_acc = sum(base[i] for i in ids) / n, sum(cand[i] for i in ids) / n
    return {
        "n": n,
        "base": round(base_acc, 4),
        "candidate": round(cand_acc, 4),
        "recovery": round(cand_acc / base_acc, 4) if base_acc else None,
        "flip_rate": round((n10 + n01) / n, 4),
        "n10": n10,
        "n01": n01,
        # sd of the per-document difference (candidate - base), the paired test's spread
        "paired_sd": round(_sd([cand[i] - base[i] for i in ids]), 4),
    }


def paired_loglik(metric: str, base: dict[str, list], cand: dict[str, list]) -> dict[str, Any]:
    """Perplexity metrics: the per-document log-likelihood (nats) differences and the corpus figure."""
    ids = sorted(base, key=int)
    diffs = [cand[i][0] - base[i][0] for i in ids]
    weight = sum(base[i][1] for i in ids)
    base_nats, cand_nats = -sum(base[i][0] for i in ids), -sum(cand[i][0] for i in ids)

    def corpus(nats: float) -> float:
        if metric == "bits_per_byte":
            return nats / weight / math.log(2)
        return math.exp(nats / weight)

    base_value, cand_value = corpus(base_nats), corpus(cand_nats)
    per_weight = [d / base[i][1] for d, i in zip(diffs, ids) if base[i][1]]
    return {
        "n": len(ids),
        "base": round(base_value, 4),
        "candidate": round(cand_value, 4),
        "recovery": round(base_value / cand_value, 4),  # lower is better: base / candidate
        "total_nats_base": round(base_nats, 2),
        "total_nats_candidate": round(cand_nats, 2),
        "total_nats_ratio": round(cand_nats / base_nats, 5),
        "mean_loglik_diff": round(sum(diffs) / len(diffs), 4),
        "paired_sd_loglik_diff": round(_sd(diffs), 4),
        f"paired_sd_loglik_diff_per_{LOGLIK_METRICS[metric][:-1]}": round(_sd(per_weight), 5),
        "docs_worse": sum(d < 0 for d in diffs),
        "docs_better": sum(d > 0 for d in diffs),
    }


def _sd(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def compare(base: dict[str, Any], cand: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Figures and per-document pairs, per task and metric, of one candidate against the base."""
    figures: dict[str, Any] = {}
    pairs: dict[str, Any] = {}
    for task, base_docs in base["tasks"].items():
        cand_docs = cand["tasks"][task]
        if set(base_docs) != set(cand_docs):
            raise SystemExit(f"{task}: the base and candidate were scored on different documents")
        mismatched = [d for d in base_docs if base_docs[d]["prompt_hash"] != cand_docs[d]["prompt_hash"]]
        if mismatched:
            raise SystemExit(
                f"{task}: {len(mismatched)} documents had different prompts (e.g. doc {mismatched[0]})"
            )
        for metric in base_docs[next(iter(base_docs))]["values"]:
            b = {d: v["values"][metric] for d, v in base_docs.items()}
            c = {d: v["values"][metric] for d, v in cand_docs.items()}
            if metric in BINARY_METRICS:
                figures.setdefault(task, {})[metric] = paired_binary(b, c)
                pairs.setdefault(task, {})[metric] = {d: [b[d], c[d]] for d in sorted(b, key=int)}
            else:
                figures.setdefault(task, {})[metric] = paired_loglik(metric, b, c)
        if any(m in LOGLIK_METRICS for m in base_docs[next(iter(base_docs))]["values"]):
            metric = next(m for m in LOGLIK_METRICS if m in base_docs[next(iter(base_docs))]["values"])
            pairs.setdefault(task, {})["loglikelihood"] = {
                d: [round(base_docs[d]["values"][metric][0], 4), round(cand_docs[d]["values"][metric][0], 4)]
                for d in sorted(base_docs, key=int)
            }
    return figures, pairs


def doc_weights(base: dict[str, Any]) -> dict[str, Any]:
    """Per perplexity task, per doc id: [words, bytes] (the weights of the perplexities)."""
    out = {}
    for task, docs in base["tasks"].items():
        values = docs[next(iter(docs))]["values"]
        if "word_perplexity" in values and "byte_perplexity" in values:
            out[task] = {
                d: [v["values"]["word_perplexity"][1], v["values"]["byte_perplexity"][1]]
                for d, v in sorted(docs.items(), key=lambda kv: int(kv[0]))
            }
    return out


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--candidates", nargs="*", default=list(CANDIDATES), choices=list(CANDIDATES))
    p.add_argument("--kv-cache-dtype", default="auto", help="every boot's KV cache (default auto: 16-bit)")
    p.add_argument("--limit", type=int, default=None, help="documents per task (a smoke run; default all)")
    p.add_argument("--work", type=Path, default=Path("/tmp/qs-flip-rates"))
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"default {OUT.relative_to(ROOT)} (none with --limit: printed only)",
    )
    p.add_argument("--note", default=None, help="a line for the result (e.g. what else the machine ran)")
    args = p.parse_args(argv)
    # the candidates this host serves with that KV cache (on a CPU without AVX-512: int8-w8a8, the demo's
    # choice, and base-rerun), the others named in one line; none: refused in one line
    schemes = {name: CANDIDATES[name].get("scheme") for name in args.candidates}
    args.candidates, left_out = servable("flip_rates.py", schemes, args.kv_cache_dtype)
    if left_out:
        log(left_out)
    out = args.out or (None if args.limit else OUT)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    validated = validate_recipe(RECIPE)
    recipe = validated.recipe
    base = resolve_base(validated)
    log(f"base {base.local_dir}; candidates {args.candidates}; KV {args.kv_cache_dtype}; limit {args.limit}")
    made = quantize_candidates(validated, base, args.candidates, args.work)

    outcomes: dict[str, Any] = {}
    for name, model_dir in [
        ("base", base.local_dir),
        *((n, m["checkpoint_dir"] or base.local_dir) for n, m in made.items()),
    ]:
        cached = args.work / f"{name}-{cache_key(model_dir, recipe, args.kv_cache_dtype, args.limit)}.json"
        if cached.is_file():
            outcomes[name] = json.loads(cached.read_text())
            log(f"{name}: outcomes reused from {cached}")
            continue
        log(f"{name}: serving {model_dir}")
        outcomes[name] = evaluate_model(
            model_dir,
            recipe,
            kv_cache_dtype=args.kv_cache_dtype,
            limit=args.limit,
            log_path=args.work / f"vllm-{name}.log",
        )
        cached.write_text(json.dumps(outcomes[name]))

    figures: dict[str, Any] = {}
    samples: dict[str, Any] = {
        "about": "tasks[task][metric][candidate][doc id] = [base, candidate]: 0/1 for acc and acc_norm, "
        "the document's log-likelihood in nats for 'loglikelihood' (perplexity tasks); "
        "weights[task][doc id] = [words, bytes] of a perplexity task's document. Figures: "
        "flip_rates.json",
        "weights": doc_weights(outcomes["base"]),
        "tasks": {},
    }
    for name in made:
        per_task, pairs = compare(outcomes["base"], outcomes[name])
        for task, metrics in per_task.items():
            for metric, row in metrics.items():
                figures.setdefault(task, {}).setdefault(metric, {})[name] = row
        for task, metrics in pairs.items():
            for metric, docs in metrics.items():
                samples["tasks"].setdefault(task, {}).setdefault(metric, {})[name] = docs
    for task, metrics in figures.items():
        for metric, rows in metrics.items():
            log(
                f"{task} {metric}: "
                + "; ".join(
                    f"{n} flips {r['flip_rate']} ({r['n10']}/{r['n01']}) acc {r['base']}->{r['candidate']}"
                    if "flip_rate" in r
                    else f"{n} {r['base']}->{r['candidate']} nats x{r['total_nats_ratio']} "
                    f"sd {r['paired_sd_loglik_diff']}"
                    for n, r in rows.items()
                )
            )

    conversion = json.loads((Path(base.local_dir) / "conversion.json").read_text())
    result = {
        "question": "per real-text task and metric, how often a document's outcome differs between the base "
        "model and each quantized copy (flip rate, n10 = base right and candidate wrong, n01 the "
        "reverse), and for perplexity the per-document spread of log-likelihood differences",
        "recipe": str(RECIPE.relative_to(ROOT)),
        "base": {
            "model": os.path.normpath(os.path.relpath(RECIPE.parent / recipe.model.id, ROOT)),
            "parameters": conversion["parameters"],
            "source": conversion["package"],
            "conversion_seconds": conversion["seconds"],
        },
        "candidates": made,
        "serving": {
            "kv_cache_dtype": args.kv_cache_dtype,
            "kv_cache_memory_bytes": KV_CACHE_BYTES,
            "max_model_len": recipe.serve.max_model_len,
            "enforce_eager": recipe.serve.enforce_eager,
            "lm_eval": "local-completions, tokenized requests, batch "
            f"{recipe.gates.accuracy.batch_size}, {CONCURRENT} concurrent",
        },
        "limit": args.limit,
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
        **({"note": args.note} if args.note else {}),
        # each model's boot and tasks as measured when it was scored (a rerun reuses the outcomes)
        "seconds": {name: {"boot": o.get("boot_seconds"), **o["seconds"]} for name, o in outcomes.items()},
        "scoring_seconds_total": round(
            sum(o.get("boot_seconds") or 0 for o in outcomes.values())
            + sum(sum(o["seconds"].values()) for o in outcomes.values()),
            1,
        ),
        "this_invocation_seconds": round(time.monotonic() - started, 1),
        "figures": figures,
    }
    if out is None:
        log(json.dumps(figures, indent=1))
        return 0
    samples_path = SAMPLES_OUT if out == OUT else out.with_name(out.stem + "_samples.json")
    result["samples_file"] = samples_path.name
    write_json_result(out, result, roots=(args.work,))
    samples_path.write_text(json.dumps(samples, separators=(",", ":")) + "\n")
    log(f"wrote {out} and {samples_path} ({samples_path.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
