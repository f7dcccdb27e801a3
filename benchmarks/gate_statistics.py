"""What the accuracy gate's rule achieves: stated against simulated error rates, documents used with and
without looks, and the flip rates measured on a real pretrained model (docs/gates.md).

    python benchmarks/gate_statistics.py [--trials 2000]

Writes benchmarks/results/gate-statistics/gate_statistics.json:
- ``flip_rates``: per task and metric, the share of documents whose outcome flipped between the real
  reference model (SmolLM2-135M-Instruct) and each of its candidates, read from
  benchmarks/results/flip-rates/flip_rates.json (``python benchmarks/flip_rates.py`` measures them);
- ``real_model_gate``: the implemented rule on those recorded outcomes (the gate's seeded order, its
  looks): per task and candidate, pass or not, recovery with its paired interval, and the documents it
  used with the planned looks and with one look;
- ``llama3``: for each task of the production recipe (its documents, Meta-Llama-3-8B-Instruct's
  published base accuracy, every metric it gates) and each flip rate (the planning values 6% and 10%,
  and the largest one measured on the real model), simulated on synthetic paired outcomes through the
  implemented rule (the task's verdict over its metrics' look_verdict at each look):
  - the pass rate with one metric at the stated bad recovery (the others at good), with every metric at
    good and at 1.00, against the stated rates (the task's share of the release's min_true_pass), with
    looks and with one look, and the mean documents each scored;
  - the rates the report predicts for that run (task_operating_point), and the documents the share needs;
  - the retired point rule (point recovery >= 0.95 on the same documents) at the same recoveries;
- ``release``: per flip rate, the release's true pass (the product of its tasks': disjoint documents),
  simulated and predicted, and its false pass (a release bad on one task passes at most that task's);
- ``perplexity``: the real model's per-document nats and each candidate's, scaled to the bad and good
  points, its 500 documents taken as the split and 100-500 of them drawn as the gate draws a perplexity
  (the longest with certainty, the rest a sample without replacement), one look and with looks;
- ``grouped``: mmlu's shape (57 subjects of 20) at design effects of about 1.2 and 1.6, with the gate's
  clustered variance and with the documents taken as independent;
- ``continuation``: the recipe's tasks that hold more documents than their limit, deciding at the limit
  against continuing an undecided candidate to 1.5 times it (gates.accuracy.continue_to): pass rate and
  documents at the bad point, between the points and at good.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from quantize_serve.gates.accuracy.documents import DocOutcome, aggregate, draw_documents, take_all
from quantize_serve.gates.accuracy.paired import (
    Paired,
    design,
    simulate_gate,
    simulate_task,
    synthetic_pairs,
    synthetic_task,
    task_operating_point,
)
from quantize_serve.gates.accuracy.recovery import compare_accuracy, look_design, task_decided, task_noise
from quantize_serve.gates.accuracy.results import AccuracyRun, MetricResult, TaskRun
from quantize_serve.recipe.gates import AccuracyGate, AccuracyTask, ErrorRates
from quantize_serve.recipe.load import load_recipe

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "gate-statistics" / "gate_statistics.json"
FLIPS = ROOT / "benchmarks" / "results" / "flip-rates" / "flip_rates.json"
SAMPLES = FLIPS.with_name("flip_rates_samples.json")
RECIPE = ROOT / "recipes" / "llama3-8b-instruct-awq.yaml"
# Meta-Llama-3-8B-Instruct on the Neural Magic card (lm-eval + vLLM, OpenLLM v1), in percent: the
# base accuracies the research notes computed today's rule with (shared research, section 3.3).
BASE_ACCURACY = {"gsm8k": 0.7521, "arc_challenge": 0.6263, "hellaswag": 0.7881, "mmlu": 0.6654}
MMLU_SUBJECTS = 57
# the evaluation splits lm-eval scores (test for gsm8k and arc_challenge, validation for hellaswag)
SPLIT_SIZES = {"gsm8k": 1319, "arc_challenge": 1172, "hellaswag": 10042}
PLANNING_FLIP_RATES = (0.06, 0.10)
# The metrics each task of the recipe gates (lm-eval's task configs) and the share of documents on which the
# second one's outcome pair is the first's: 0.7 for acc and acc_norm (measured: 0.70-0.75 over the real
# model's candidates on its cloze task, flip_rates_samples.json), 0.9 for gsm8k's strict and flexible
# match of one answer (assumed: they differ where the answer's format does).
GATED = {"gsm8k": (2, 0.9), "arc_challenge": (2, 0.7), "hellaswag": (2, 0.7), "mmlu": (1, 1.0)}
PERPLEXITY_DOCS = (100, 200, 500)
# mmlu's shape at two design effects: (label, flip rate, half-width of the subjects' uniform recovery shift)
GROUPED = (("design_effect_about_1.2", 0.12, 0.08), ("design_effect_about_1.6", 0.20, 0.2))
RETIRED_POINT_THRESHOLD = 0.95
# continuation cells: a candidate undecided at the limit scored on to 1.5 times it; a point between the two
CONTINUE_TO, BORDERLINE = 1.5, 0.96
DEFAULT_TRIALS = 2000


def task_documents(task) -> int:  # type: ignore[no-untyped-def]
    """The documents the task's limit draws: a subject's share for mmlu, the whole split where unset."""
    if task.task == "mmlu":
        return task.limit * MMLU_SUBJECTS
    return task.limit if task.limit is not None else SPLIT_SIZES[task.task]


def point_rule_pass_rate(
    *, docs: int, base_accuracy: float, flip_rate: float, recovery: float, trials: int, seed: int
) -> float:
    """The retired rule on the same synthetic documents: pass when the point recovery >= 0.95."""
    rng = np.random.default_rng(seed)
    passes = sum(
        synthetic_pairs(
            rng, docs=docs, base_accuracy=base_accuracy, flip_rate=flip_rate, recovery=recovery
        ).recovery
        >= RETIRED_POINT_THRESHOLD
        for _ in range(trials)
    )
    return passes / trials


def measured_flip_rates() -> dict:
    if not FLIPS.is_file():
        return {}
    return json.loads(FLIPS.read_text())


def largest_measured_flip_rate(flips: dict) -> float | None:
    """The largest flip rate of a 4-bit or 8-bit candidate on any 0/1 metric of the real model's tasks."""
    rates = [
        m["flip_rate"]
        for metrics in flips.get("figures", {}).values()
        for candidates in metrics.values()
        for m in candidates.values()
        if isinstance(m, dict) and m.get("flip_rate")
    ]
    return max(rates) if rates else None


def real_task_runs(
    task: str, outcomes: dict, weights: dict | None, candidate: str, order: list[int], certain: list[int]
) -> tuple[TaskRun, TaskRun]:
    """The base's and one candidate's runs of a real-model task, in the gate's seeded order (``certain``:
    a perplexity's documents taken with certainty, the task's size then known, as the gate records it)."""
    runs = []
    for side in (0, 1):
        docs, metrics = {}, {}
        for metric, by_candidate in outcomes.items():
            pairs = by_candidate[candidate]
            name, aggregation, higher = (
                (metric, "mean", True) if weights is None else ("bits_per_byte", "bits_per_byte", False)
            )
            for i in order:
                value = pairs[str(i)][side]
                doc = docs.setdefault(f"{task}/{i}", DocOutcome(prompt_hash=f"{task}/{i}", values={}))
                doc.values[name] = (
                    float(value) if weights is None else (float(value), float(weights[str(i)][1]))
                )
            metrics[name] = MetricResult(
                value=aggregate([d.values[name] for d in docs.values()], aggregation),
                higher_is_better=higher,
                aggregation=aggregation,
            )
        runs.append(
            TaskRun(
                task=task,
                lm_eval_name=task,
                num_fewshot=0,
                limit=None,
                num_docs=len(docs),
                metrics=metrics,
                seconds=0.0,
                results_path="-",
                documents=docs,
                planned_docs=len(docs),
                task_docs=len(docs) if weights else None,
                take_all=[f"{task}/{i}" for i in certain],
            )
        )
    return runs[0], runs[1]


def scored_through(full: TaskRun, look: int, fractions: tuple[float, ...]) -> TaskRun:
    """The candidate's run as scored up to look index ``look`` (the first share of the gate's order)."""
    seen = round(fractions[look] * len(full.documents))
    return full.model_copy(
        update={
            "documents": dict(list(full.documents.items())[:seen]),
            "num_docs": seen,
            "looks_run": look + 1,
            "looks_planned": len(fractions),
        }
    )


def byte_lengths(samples: dict, task: str) -> list[int]:
    """A perplexity task's documents' byte lengths as recorded (bits per byte's weights), by index."""
    weights = samples["weights"][task]
    return [int(weights[str(i)][1]) for i in range(len(weights))]


def gate_on_real_outcomes(looks: tuple[float, ...], seed: int) -> dict:
    """The implemented rule on the real model's recorded outcomes: per task and candidate, the decision,
    recovery and documents used with the planned looks and with one look."""
    if not SAMPLES.is_file():
        return {}
    samples = json.loads(SAMPLES.read_text())
    result: dict = {}
    for task, outcomes in samples["tasks"].items():
        weights = samples.get("weights", {}).get(task)
        candidates = next(iter(outcomes.values()))
        size = len(next(iter(candidates.values())))
        for candidate in candidates:
            row = {}
            for name, fractions in (("with_looks", looks), ("one_look", (1.0,))):
                # a perplexity's longest documents first, for the gate's first look (documents.take_all)
                certain = take_all(byte_lengths(samples, task), round(fractions[0] * size)) if weights else []
                order = draw_documents({task: size}, None, seed, task, {task: certain})[task]
                base, full = real_task_runs(task, outcomes, weights, candidate, order, certain)
                gate = AccuracyGate(tasks=[AccuracyTask(task=task)], looks=list(fractions))
                look, ran = 0, scored_through(full, 0, fractions)
                while look < len(fractions) - 1 and not task_decided(base, ran, gate, gate.tasks[0], look):
                    look += 1
                    ran = scored_through(full, look, fractions)
                checks = compare_accuracy(
                    AccuracyRun(server_base_url="-", tasks={task: base}, seconds=0, lm_eval_version="-"),
                    AccuracyRun(server_base_url="-", tasks={task: ran}, seconds=0, lm_eval_version="-"),
                    gate,
                )
                row[name] = {
                    "passed": all(c.passed for c in checks),
                    "documents": ran.num_docs,
                    "look": look + 1,
                    "checks": {
                        c.metric: {
                            "recovery": round(c.recovery, 4),
                            "interval": [round(x, 4) for x in c.recovery_interval]
                            if c.recovery_interval
                            else None,
                            "flip_rate": c.flip_rate,
                            "passed": c.passed,
                            "true_pass": c.true_pass,
                            "docs_needed": c.docs_needed,
                        }
                        for c in checks
                    },
                }
            result.setdefault(task, {})[candidate] = row
    return result


def rates_row(draw_at, d, rates, trials: int, seed: int, *, bad_possible: bool = True) -> dict:  # type: ignore[no-untyped-def]
    """The implemented rule (paired.simulate_task: every metric's look_verdict at each look, the task's
    verdict over them) on draws at the bad point (the first metric at bad, the others at good) and at
    good (every metric)."""
    cells: dict = {}
    for label, point, offset in (("at_bad", rates.bad_recovery, 1), ("at_good", rates.good_recovery, 2)):
        if label == "at_bad" and not bad_possible:
            cells[label] = {"skipped": "this flip rate cannot give the bad recovery at this accuracy"}
            continue
        sim = simulate_task(
            draw_at(point),
            d,
            bad=rates.bad_recovery,
            good=rates.good_recovery,
            trials=trials,
            seed=seed + offset,
        )
        cells[label] = {"pass_rate": sim.pass_rate, "mean_documents": round(sim.mean_docs, 1)}
    return cells


def simulate_llama3_task(gate, task, flip_rate: float, trials: int) -> dict:  # type: ignore[no-untyped-def]
    """One task of the production recipe at one flip rate, every metric it gates: simulated and as the
    report predicts it (recovery.task_point's operating point), with looks and with one look."""
    rates = gate.rates(task)
    docs, accuracy = task_documents(task), BASE_ACCURACY[task.task]
    metrics, agreement = GATED[task.task]
    groups = MMLU_SUBJECTS if task.task == "mmlu" else 1
    share = gate.true_pass_share(task)
    row: dict = {
        "documents": docs,
        "base_accuracy": accuracy,
        "flip_rate": flip_rate,
        "metrics": metrics,
        "agreement": agreement,
        "stated": {
            "bad": rates.bad_recovery,
            "max_false_pass": rates.max_false_pass,
            "good": rates.good_recovery,
            "task_share_of_min_true_pass": round(share, 4),
        },
    }
    bad_possible = flip_rate >= abs(rates.bad_recovery - 1) * accuracy
    shape = dict(base_accuracy=accuracy, flip_rate=flip_rate, agreement=agreement, groups=groups)

    def draw_at(point: float):  # type: ignore[no-untyped-def]
        recoveries = (point,) + (rates.good_recovery if point == rates.bad_recovery else point,) * (
            metrics - 1
        )
        return lambda rng: synthetic_task(rng, docs=docs, recoveries=recoveries, **shape)

    large = synthetic_task(
        np.random.default_rng(0), docs=57_000, recoveries=(rates.good_recovery,) * metrics, **shape
    )
    noise, corr = task_noise(large, rates.bad_recovery)
    for name, looks in (("with_looks", tuple(gate.looks)), ("one_look", (1.0,))):
        d = look_design(gate, task, looks, metrics)
        cells = rates_row(draw_at, d, rates, trials, seed=10 * len(looks), bad_possible=bad_possible)
        point = task_operating_point(
            d, docs, noise, corr, bad=rates.bad_recovery, good=rates.good_recovery, min_true_pass=share
        )
        cells["predicted"] = {
            "false_pass": point.false_pass,
            "true_pass": point.true_pass,
            "documents_needed": point.docs_needed,
        }
        row[name] = cells
    row["retired_point_rule"] = {
        label: point_rule_pass_rate(
            docs=docs,
            base_accuracy=accuracy,
            flip_rate=flip_rate,
            recovery=recovery,
            trials=trials,
            seed=seed,
        )
        for label, recovery, seed in (("at_0.93", 0.93, 4), ("at_0.99", 0.99, 5))
    }
    return row


def release_row(gate, tasks: dict) -> dict:  # type: ignore[no-untyped-def]
    """The release at one flip rate: it passes when every task passes (disjoint documents, so the true pass
    is the product of the tasks'); a bad release, bad on one task, passes at most that task's false pass."""
    rows = [tasks[t.task] for t in gate.tasks]
    out: dict = {"tasks": len(rows), "stated": {"min_true_pass": gate.error_rates.min_true_pass}}
    for name in ("with_looks", "one_look"):
        bad = [r[name]["at_bad"]["pass_rate"] for r in rows if "pass_rate" in r[name]["at_bad"]]
        out[name] = {
            "true_pass": math.prod(r[name]["at_good"]["pass_rate"] for r in rows),
            "predicted_true_pass": math.prod(r[name]["predicted"]["true_pass"] for r in rows),
            "false_pass": max(bad, default=None),  # over the tasks whose bad point this flip rate gives
            "mean_documents": round(sum(r[name]["at_good"]["mean_documents"] for r in rows), 1),
        }
    return out


def split_draw(base: np.ndarray, cand: np.ndarray, docs: int, first: float, lengths: list[int]):  # type: ignore[no-untyped-def]
    """The gate's draw of ``docs`` documents from a perplexity split whose per-document nats are ``base`` and
    ``cand`` and byte lengths ``lengths`` (documents.take_all's longest first; the rest a random sample
    without replacement), as the gate pairs them: a draw function for paired.simulate_task."""
    certain = take_all(lengths, max(1, round(first * docs)))
    rest = np.setdiff1d(np.arange(len(base)), certain)

    def draw(rng):  # type: ignore[no-untyped-def]
        i = np.concatenate([certain, rng.permutation(rest)[: docs - len(certain)]]).astype(int)
        mask = [True] * len(certain) + [False] * (docs - len(certain))
        return [Paired.of(base[i].tolist(), cand[i].tolist(), certain=mask, population=len(rest))]

    return draw


def perplexity_cells(trials: int, looks: tuple[float, ...]) -> dict:
    """Perplexity from the real model's recorded per-document nats, the 500 documents taken as the split:
    each candidate's nats scaled so its recovery over them is exactly the point, then the gate's draw of
    100-500 of them (split_draw)."""
    if not SAMPLES.is_file():
        return {}
    samples = json.loads(SAMPLES.read_text())
    out: dict = {}
    for task, metrics in samples["tasks"].items():
        for candidates in (v for k, v in metrics.items() if k == "loglikelihood"):
            lengths = byte_lengths(samples, task)
            for candidate, docs in candidates.items():
                pairs = np.array([docs[str(i)] for i in range(len(docs))], dtype=float)
                base, cand = -pairs[:, 0], -pairs[:, 1]
                if base.sum() == cand.sum():
                    continue  # the base run again: no candidate
                for n in PERPLEXITY_DOCS:
                    row = {}
                    for name, fractions in (("with_looks", looks), ("one_look", (1.0,))):

                        def draw_at(point: float, n: int = n, first: float = fractions[0]):  # type: ignore[no-untyped-def]
                            scaled = cand * (base.sum() / cand.sum()) / point
                            return split_draw(base, scaled, n, first, lengths)

                        d = design(fractions, 0.05, 0.95)
                        row[name] = rates_row(draw_at, d, ErrorRates(), trials, seed=n)
                    out.setdefault(task, {}).setdefault(candidate, {})[str(n)] = row
    return out


def continuation_cells(gate, trials: int) -> dict:  # type: ignore[no-untyped-def]
    """gates.accuracy.continue_to on the recipe's tasks that hold more documents than their limit (one metric,
    the gate's default rates, 10% flips): pass rate and documents scored at the bad point, between the two
    points and at good, deciding at the limit against continuing to CONTINUE_TO times it (capped at the
    task's split)."""
    out: dict = {}
    for task in gate.tasks:
        docs, size = task_documents(task), SPLIT_SIZES.get(task.task)
        if task.task == "mmlu" or size is None or size <= docs:
            continue
        planned = tuple(gate.looks)
        continued = gate.model_copy(update={"continue_to": CONTINUE_TO}).task_looks(size / docs)
        rates = ErrorRates()
        row: dict = {"documents": docs, "split": size, "looks": list(continued)}
        for label, looks in (("at_limit", planned), ("continued", continued)):
            row[label] = {}
            for point in (rates.bad_recovery, BORDERLINE, rates.good_recovery):
                sim = simulate_gate(
                    docs=round(docs * looks[-1]),
                    base_accuracy=BASE_ACCURACY[task.task],
                    flip_rate=0.10,
                    recovery=point,
                    fractions=looks,
                    bad=rates.bad_recovery,
                    max_false_pass=rates.max_false_pass,
                    good=rates.good_recovery,
                    min_true_pass=gate.true_pass_share(task),
                    trials=trials,
                    seed=round(point * 1000),
                )
                row[label][str(point)] = {
                    "pass_rate": sim.pass_rate,
                    "mean_documents": round(sim.mean_docs, 1),
                }
        out[task.task] = row
    return out


def grouped_cells(trials: int, looks: tuple[float, ...]) -> dict:
    """mmlu's shape: 57 subjects of 20 documents whose recovery varies by subject, at two design effects;
    the gate's clustered variance against the same documents taken as independent."""
    out = {}
    for label, flip_rate, spread in GROUPED:
        shape = dict(
            docs=1140,
            base_accuracy=BASE_ACCURACY["mmlu"],
            flip_rate=flip_rate,
            groups=57,
            group_spread=spread,
        )
        effects = [
            synthetic_task(np.random.default_rng(s), recoveries=(0.93,), **shape)[0].design_effect(0.93)
            for s in range(200)
        ]
        d = design(looks, 0.05, 0.95)
        row: dict = {
            "flip_rate": flip_rate,
            "group_spread": spread,
            "design_effect": round(float(np.mean(effects)), 3),
        }
        for grouped in (True, False):

            def draw_at(point: float, grouped: bool = grouped):  # type: ignore[no-untyped-def]
                def draw(rng):  # type: ignore[no-untyped-def]
                    pairs = synthetic_task(rng, recoveries=(point,), **shape)
                    return pairs if grouped else [dataclasses.replace(p, groups=None) for p in pairs]

                return draw

            row["clustered" if grouped else "as_independent"] = rates_row(
                draw_at, d, ErrorRates(), trials, seed=7
            )
        out[label] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trials",
        type=int,
        default=DEFAULT_TRIALS,
        help="synthetic runs per cell (default 2000: a "
        "rate near 5%% has a standard error of about 0.5 points)",
    )
    args = parser.parse_args()
    recipe = load_recipe(RECIPE)
    gate = recipe.gates.accuracy
    flips = measured_flip_rates()
    flip_rates = sorted({*PLANNING_FLIP_RATES, *filter(None, [largest_measured_flip_rate(flips)])})
    llama3: dict = {}
    release: dict = {}
    for f in flip_rates:
        tasks = {task.task: simulate_llama3_task(gate, task, f, args.trials) for task in gate.tasks}
        for name, row in tasks.items():
            llama3.setdefault(name, []).append(row)
        release[str(f)] = release_row(gate, tasks)
        print(f, json.dumps(release[str(f)]), flush=True)
    perplexity = perplexity_cells(args.trials, tuple(gate.looks))
    print("perplexity done", flush=True)
    grouped = grouped_cells(args.trials, tuple(gate.looks))
    continuation = continuation_cells(gate, args.trials)
    result = {
        "command": "python benchmarks/gate_statistics.py"
        + (f" --trials {args.trials}" if args.trials != DEFAULT_TRIALS else ""),
        "trials_per_cell": args.trials,
        "standard_error_at_5pct": round(math.sqrt(0.05 * 0.95 / args.trials), 4),
        "looks": gate.looks,
        "flip_rates": flips,
        "real_model_gate": gate_on_real_outcomes(tuple(gate.looks), gate.seed),
        "llama3": llama3,
        "release": release,
        "perplexity": perplexity,
        "grouped": grouped,
        "continuation": continuation,
        "note": (
            "llama3 and release: synthetic paired 0/1 outcomes through the implemented rule, each task "
            "with every metric it gates (GATED: their count and agreement), mmlu's documents labelled by "
            "subject; base accuracies are Meta-Llama-3-8B-Instruct's published scores. perplexity: the "
            "real SmolLM2-135M-Instruct reference model's per-document nats and each candidate's, scaled "
            "to the point, the 500 taken as the split and drawn as the gate draws a perplexity (its longest "
            "documents with certainty, the rest a sample without replacement). grouped: mmlu's shape, "
            "subjects' recoveries shifted uniformly. flip_rates are measured on the real reference model "
            "and its candidates."
        ),
    }
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
