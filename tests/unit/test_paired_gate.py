"""The accuracy gate's rule without a server (docs/gates.md): paired recovery per document, the score
test and its interval, the sequential design and the error rates it keeps (Monte Carlo on synthetic
paired outcomes), the documents' draw, and the checks, report and card built from them."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from quantize_serve.gates.decision import accuracy_rows
from quantize_serve.gates.accuracy.documents import (
    DocOutcome,
    aggregate,
    draw_documents,
    look_documents,
    outcomes,
    per_document_fewshot,
    take_all,
)
from quantize_serve.gates.accuracy.lm_eval_host import host_work_once, templates_compiled_once
from quantize_serve.gates.accuracy.paired import Paired, design, operating_point, simulate_gate, simulate_task
from quantize_serve.gates.accuracy.recovery import compare_accuracy, task_decided
from quantize_serve.gates.accuracy.results import AccuracyRun, MetricResult, TaskRun
from quantize_serve.recipe.gates import AccuracyGate, AccuracyTask, ErrorRates
from benchmarks.gate_statistics import byte_lengths, split_draw
from tests.conftest import ROOT

LOOKS = (0.25, 0.5, 0.75, 1.0)


def task_run(
    values: dict[str, list],
    *,
    task: str = "mc",
    higher: bool = True,
    aggregation: str = "mean",
    hashes: list[str] | None = None,
    planned: int | None = None,
    looks_run: int = 1,
    looks_planned: int = 1,
) -> TaskRun:
    """A task's run from per-document values {metric: [value per document]}."""
    n = len(next(iter(values.values())))
    docs = {
        f"{task}/{i}": DocOutcome(
            prompt_hash=hashes[i] if hashes else f"h{i}", values={m: v[i] for m, v in values.items()}
        )
        for i in range(n)
    }
    metrics = {
        m: MetricResult(value=aggregate(v, aggregation), higher_is_better=higher, aggregation=aggregation)
        for m, v in values.items()
    }
    return TaskRun(
        task=task,
        lm_eval_name=task,
        num_fewshot=0,
        limit=None,
        num_docs=n,
        metrics=metrics,
        seconds=0.0,
        results_path="lm_eval_mc.json",
        documents=docs,
        planned_docs=planned or n,
        looks_run=looks_run,
        looks_planned=looks_planned,
    )


def run_of(*tasks: TaskRun) -> AccuracyRun:
    return AccuracyRun(
        server_base_url="http://test", tasks={t.task: t for t in tasks}, seconds=0.0, lm_eval_version="test"
    )


def gate_of(*names: str, **fields) -> AccuracyGate:
    return AccuracyGate(tasks=[AccuracyTask(task=n) for n in names or ("mc",)], **fields)


def outcomes_with_flips(n: int, accuracy: float, flips_down: int, flips_up: int, seed: int = 0):
    rng = random.Random(seed)
    base = [1.0 if rng.random() < accuracy else 0.0 for _ in range(n)]
    right, wrong = [i for i, b in enumerate(base) if b], [i for i, b in enumerate(base) if not b]
    cand = list(base)
    for i in right[:flips_down]:
        cand[i] = 0.0
    for i in wrong[:flips_up]:
        cand[i] = 1.0
    return base, cand


# --- the paired statistics -------------------------------------------------------------------------


def test_recovery_is_a_ratio_of_means_over_the_same_documents():
    base, cand = outcomes_with_flips(400, 0.7, flips_down=20, flips_up=8)
    pair = Paired.of(cand, base)
    assert pair.binary and pair.docs == 400
    assert pair.recovery == pytest.approx(sum(cand) / sum(base))
    assert pair.flip_rate == pytest.approx(28 / 400)
    low, high = pair.interval()
    assert low < pair.recovery < high
    # the paired interval is far narrower than treating base and candidate as independent samples
    p = sum(base) / 400
    unpaired_half_width = 1.96 * pair.recovery * math.sqrt(2 * p * (1 - p) / 400) / p
    assert (high - low) / 2 < unpaired_half_width / 2


def test_no_flip_is_not_proof_that_none_can_happen():
    """100 documents that all agree: a finite interval (half a flipped document each way), not [1, 1]."""
    pair = Paired.of([1.0] * 100, [1.0] * 100)
    low, high = pair.interval()
    assert 0.95 < low < 1.0 < high
    assert math.isfinite(pair.z(0.93)) and pair.z(0.93) > 1.645  # passes the fixed one-sided test


def test_the_score_statistic_falls_as_the_tested_recovery_rises():
    base, cand = outcomes_with_flips(500, 0.65, flips_down=25, flips_up=10)
    pair = Paired.of(cand, base)
    zs = [pair.z(r) for r in (0.85, 0.9, 0.95, pair.recovery, 1.0, 1.05)]
    assert all(a > b for a, b in zip(zs, zs[1:]))
    assert abs(zs[3]) < 0.05  # ~0 at the point (the smoothing documents move it a little)


def test_continuous_per_document_values_pair_too():
    rng = np.random.default_rng(3)
    base = rng.uniform(50, 150, 200)
    cand = base * rng.normal(1.02, 0.01, 200)  # the candidate spends 2% more nats
    pair = Paired.of(list(base), list(cand))  # lower is better: base / candidate
    assert not pair.binary and pair.flip_rate is None
    low, high = pair.interval()
    assert low < 1 / 1.02 < high and high < 0.99


def test_one_look_is_the_fixed_one_sided_test_and_more_looks_start_strict():
    fixed = design((1.0,), 0.05, 0.95)
    assert fixed.pass_bounds == (pytest.approx(1.6449, abs=1e-4),) and fixed.stop_bounds == (math.inf,)
    looks = design(LOOKS, 0.05, 0.95)
    assert list(looks.pass_bounds) == sorted(looks.pass_bounds, reverse=True)  # O'Brien-Fleming shape
    assert looks.pass_bounds[0] > 3 and 1.6449 < looks.pass_bounds[-1] < 1.9
    assert looks.stop_bounds[-1] == math.inf and design(LOOKS, 0.05, 0.95) is looks  # cached, deterministic


@pytest.mark.parametrize("flip_rate", [0.06, 0.10])
def test_the_implemented_rule_keeps_the_stated_error_rates(flip_rate):
    """Monte Carlo on synthetic paired outcomes, through look_verdict at each look: a candidate at the
    bad recovery passes at most 5% of the time; given the documents operating_point says it needs, one
    at the good recovery passes at least 95%; the looks save documents on a good candidate.
    (2,000 trials: a rate's standard error is about 0.5 points, hence the 1.5-point slack.)"""
    rates = dict(bad=0.93, max_false_pass=0.05, good=0.99, min_true_pass=0.95)
    accuracy = 0.6263  # Llama-3-8B-Instruct's arc_challenge
    base, cand = outcomes_with_flips(10_000, accuracy, round(5000 * flip_rate), round(5000 * flip_rate))
    noise = Paired.of(cand, base).score_sd(0.93)  # as the check plans with it
    point = operating_point(
        design(LOOKS, 0.05, 0.95), 500, sd=noise, mean_den=accuracy, bad=0.93, good=0.99, min_true_pass=0.95
    )
    docs = point.docs_needed
    common = dict(
        docs=docs, base_accuracy=accuracy, flip_rate=flip_rate, fractions=LOOKS, trials=2000, **rates
    )
    bad = simulate_gate(recovery=0.93, seed=1, **common)
    good = simulate_gate(recovery=0.99, seed=2, **common)
    assert bad.pass_rate <= 0.05 + 0.015, bad
    assert good.pass_rate >= 0.95 - 0.015, good
    assert good.mean_docs < 0.9 * docs  # looks stop early for a good candidate


def real_nats(candidate: str = "gptq-w4a16-g64") -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The real reference model's per-document nats on its 500-document perplexity task, a 4-bit
    candidate's, and the documents' byte lengths (benchmarks/results/flip-rates/flip_rates_samples.json)."""
    samples = json.loads((ROOT / "benchmarks/results/flip-rates/flip_rates_samples.json").read_text())
    docs = samples["tasks"]["qs_realtext_ppl"]["loglikelihood"][candidate]
    pairs = -np.array([docs[str(i)] for i in range(len(docs))], dtype=float)
    return pairs[:, 0], pairs[:, 1], byte_lengths(samples, "qs_realtext_ppl")


@pytest.mark.parametrize("docs, fractions", [(100, (1.0,)), (200, (1.0,)), (100, LOOKS), (500, (1.0,))])
def test_a_perplexity_keeps_its_level_on_the_real_models_skewed_nats(docs, fractions):
    """Monte Carlo from the real model's per-document nats (one document of the 500 holds 40% of the GPTQ
    candidate's paired variance), the 500 taken as the split, drawn as the gate draws a perplexity: a
    candidate at 0.93 passes at most 5% (with one look the sample-of-the-task rule passed it 7.7% at 100
    documents), one at 0.99 passes; a census of the split is exact. (2,000 trials: 1.5 points of slack.)"""
    base, cand, lengths = real_nats()
    d = design(fractions, 0.05, 0.95)

    def at(point: float, seed: int):  # type: ignore[no-untyped-def]
        draw = split_draw(base, cand * (base.sum() / cand.sum()) / point, docs, fractions[0], lengths)
        return simulate_task(draw, d, bad=0.93, good=0.99, trials=2000 if docs < 500 else 50, seed=seed)

    bad, good = at(0.93, 1), at(0.99, 2)
    assert bad.pass_rate <= (0.05 + 0.015 if docs < 500 else 0.0), bad
    assert good.pass_rate >= 0.95, good


def test_a_perplexitys_longest_documents_are_drawn_first_and_scored_at_every_look():
    lengths = [10] * 98 + [4000, 900]  # two documents far longer than the others
    certain = take_all(lengths, 25)
    assert certain == [98, 99]  # each longer than what is left over the documents left to draw
    assert take_all(lengths, 100) == sorted(range(100), key=lambda i: (-lengths[i], i))  # a census
    order = draw_documents({"t": 100}, 40, 3, "ppl", {"t": certain})["t"]
    assert order[:2] == [98, 99] and len(order) == 40 == len(set(order))
    assert 98 in look_documents({"t": order}, 0.0, 0.25)["t"]
    plain = draw_documents({"t": 100}, 40, 3, "ppl")["t"]  # a task without certain documents draws as before
    assert plain == random.Random("3:ppl:t").sample(range(100), 40)
    split = Paired.of([1.0, 2.0, 3.0], [1.0, 2.0, 2.0], certain=[True, False, False], population=4)
    # the certain document counts once, the two sampled stand for the four others
    assert split.recovery == pytest.approx((1 + 2 * (2 + 3)) / (1 + 2 * (2 + 2)))
    assert split.head(1).z(1.0) == 0.0  # nothing yet of the others: undecided


def test_operating_point_says_when_the_documents_fall_short():
    d = design(LOOKS, 0.05, 0.95)
    few = operating_point(d, 200, sd=math.sqrt(0.1), mean_den=0.63, bad=0.93, good=0.99, min_true_pass=0.95)
    many = operating_point(d, 2000, sd=math.sqrt(0.1), mean_den=0.63, bad=0.93, good=0.99, min_true_pass=0.95)
    assert few.true_pass < 0.95 <= many.true_pass and few.docs_needed == many.docs_needed
    assert 200 < few.docs_needed < 2000
    assert few.false_pass <= 0.05 + 1e-9


# --- which documents ----------------------------------------------------------------------------


def test_the_draw_is_seeded_random_and_stratified_by_member_task():
    sizes = {"mmlu_anatomy": 135, "mmlu_virology": 166}
    order = draw_documents(sizes, 20, seed=1234, task="mmlu")
    assert {m: len(d) for m, d in order.items()} == {"mmlu_anatomy": 20, "mmlu_virology": 20}
    assert order == draw_documents(sizes, 20, seed=1234, task="mmlu")
    assert order != draw_documents(sizes, 20, seed=1, task="mmlu")
    assert order["mmlu_anatomy"] != list(range(20))  # not the first rows, as --limit would take
    assert len(draw_documents({"t": 10}, 0.25, 0, "t")["t"]) == 3
    assert sorted(draw_documents({"t": 10}, None, 0, "t")["t"]) == list(range(10))


def test_looks_add_disjoint_sorted_chunks_that_cover_the_draw():
    order = draw_documents({"a": 100, "b": 40}, None, 7, "g")
    chunks = [look_documents(order, s, e) for s, e in zip((0.0, *LOOKS), LOOKS)]
    for member, docs in order.items():
        seen = [d for c in chunks for d in c.get(member, [])]
        assert sorted(seen) == sorted(docs) and len(seen) == len(set(seen))
        assert all(c[member] == sorted(c[member]) for c in chunks if member in c)
    assert len(chunks[0]["a"]) == 25 and len(chunks[0]["b"]) == 10  # each stratum at each look


@pytest.mark.parametrize("fewshot_split", ["train", "test"])
def test_a_document_gets_the_same_few_shot_examples_in_any_subset(tmp_path, fewshot_split):
    """lm-eval draws few-shot examples from one stream in document order; inside per_document_fewshot a
    document's draw depends on the document alone, from another split (gsm8k) or its own (arc)."""
    import json

    from lm_eval.api.task import ConfigurableTask

    for split, n in (("train", 30), ("test", 30)):
        (tmp_path / f"{split}.jsonl").write_text(
            "".join(json.dumps({"q": f"{split} question {i}", "a": str(i)}) + "\n" for i in range(n))
        )
    task = ConfigurableTask(
        config={
            "task": "toy",
            "dataset_path": "json",
            "output_type": "generate_until",
            "dataset_kwargs": {"data_files": {s: str(tmp_path / f"{s}.jsonl") for s in ("train", "test")}},
            "training_split": "train",
            "test_split": "test",
            "fewshot_split": fewshot_split,
            "doc_to_text": "{{q}}",
            "doc_to_target": "{{a}}",
            "generation_kwargs": {"until": ["\n"]},
        }
    )
    task.set_fewshot_seed(1234)
    docs = list(task.test_docs())
    with per_document_fewshot(1234):
        alone = task.fewshot_context(docs[7], 3)
        for other in docs[:20]:
            task.fewshot_context(other, 3)
        after_others = task.fewshot_context(docs[7], 3)
    assert alone == after_others and alone.count("question") == 4
    stock = task.fewshot_context(docs[7], 3)  # outside: lm-eval's own stream again
    assert ConfigurableTask.fewshot_context.__name__ == "fewshot_context" and isinstance(stock, str)


def test_templates_compiled_once_render_the_same_prompts(tmp_path, monkeypatch):
    """Each template string compiled once by lm-eval's own environment; every prompt the same string."""
    import json

    from lm_eval import utils
    from lm_eval.api.task import ConfigurableTask

    (tmp_path / "test.jsonl").write_text(
        "".join(json.dumps({"q": f"question {i}", "c": ["x", "y"], "a": i % 2}) + "\n" for i in range(30))
    )
    task = ConfigurableTask(
        config={
            "task": "toy",
            "dataset_path": "json",
            "output_type": "multiple_choice",
            "dataset_kwargs": {"data_files": {"test": str(tmp_path / "test.jsonl")}},
            "test_split": "test",
            "fewshot_split": "test",
            "doc_to_text": "Q: {{q | regex_replace('question', 'item')}}\nA:",
            "doc_to_choice": "{{c}}",
            "doc_to_target": "{{a}}",
        }
    )
    docs = list(task.test_docs())

    def prompts():
        with per_document_fewshot(1234):
            return [task.fewshot_context(d, 5) for d in docs] + [task.doc_to_choice(d) for d in docs]

    stock = prompts()
    compiles = []
    original = utils.env.from_string
    monkeypatch.setattr(utils.env, "from_string", lambda t: compiles.append(t) or original(t))
    with templates_compiled_once():
        once = prompts()
    assert once == stock and "item 3" in "".join(map(str, once))
    assert sorted(compiles) == sorted(set(compiles)) and len(compiles) == 3  # text, target, choice
    assert utils.apply_template.__module__ == "lm_eval.utils"  # lm-eval's own again afterwards


def test_the_environment_is_described_once_a_run(monkeypatch):
    """simple_evaluate describes the environment at the end of every call (subprocesses); inside a run the
    first call's description is every call's, from any lane's thread."""
    import threading

    from lm_eval import evaluator

    described = []

    def add_env_info(storage):
        described.append(1)
        storage.update(env=len(described))

    monkeypatch.setattr(evaluator, "add_env_info", add_env_info)
    results = [{} for _ in range(4)]
    with host_work_once():
        threads = [threading.Thread(target=evaluator.add_env_info, args=(r,)) for r in results]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert described == [1] and all(r == {"env": 1} for r in results)
    evaluator.add_env_info(results[0])  # lm-eval's own again afterwards
    assert described == [1, 1]


def test_outcomes_merge_filters_and_keep_log_likelihood_pairs():
    samples = {
        "gsm8k": [
            {
                "doc_id": 3,
                "prompt_hash": "p3",
                "filter": "strict-match",
                "metrics": ["exact_match"],
                "exact_match": 1.0,
            },
            {
                "doc_id": 3,
                "prompt_hash": "p3",
                "filter": "flexible-extract",
                "metrics": ["exact_match"],
                "exact_match": 0.0,
            },
        ],
        "ppl": [
            {
                "doc_id": 0,
                "prompt_hash": "q0",
                "filter": "none",
                "metrics": ["bits_per_byte"],
                "bits_per_byte": [-120.0, 400],
            }
        ],
    }
    docs = outcomes(samples)
    assert docs["gsm8k/3"].values == {"exact_match,strict-match": 1.0, "exact_match,flexible-extract": 0.0}
    assert docs["ppl/0"].values == {"bits_per_byte": (-120.0, 400.0)}


def test_aggregate_is_lm_evals():
    pairs = [(-100.0, 50.0), (-60.0, 30.0)]
    assert aggregate(pairs, "weighted_perplexity") == pytest.approx(math.exp(160 / 80))
    assert aggregate(pairs, "bits_per_byte") == pytest.approx(160 / 80 / math.log(2))
    assert aggregate([1.0, 0.0, 1.0, 1.0], "mean") == 0.75
    with pytest.raises(ValueError, match="f1"):
        aggregate([1.0], "f1")


# --- the checks -----------------------------------------------------------------------------------


def test_a_good_candidate_passes_with_its_paired_figures():
    base, cand = outcomes_with_flips(1000, 0.7, flips_down=15, flips_up=12)
    [check] = compare_accuracy(run_of(task_run({"acc": base})), run_of(task_run({"acc": cand})), gate_of())
    assert check.passed and check.metric == "acc" and check.docs == 1000
    assert check.recovery == pytest.approx(sum(cand) / sum(base))
    assert check.flip_rate == pytest.approx(0.027) and check.threshold == 0.93 and check.good_recovery == 0.99
    assert check.false_pass <= 0.05 + 0.002 and check.true_pass > 0.95 and not check.warning  # (simulated)
    [row] = accuracy_rows([check])
    assert "shown above 0.93 at 5% false pass" in row.reason and "2.7% flipped" in row.reason


def test_a_bad_candidate_fails():
    base, cand = outcomes_with_flips(1000, 0.7, flips_down=70, flips_up=10)  # recovery ~0.914
    [check] = compare_accuracy(run_of(task_run({"acc": base})), run_of(task_run({"acc": cand})), gate_of())
    assert not check.passed and check.recovery < 0.93
    assert "not shown above 0.93" in check.reason


def test_too_few_documents_warn_with_the_count_needed():
    base, cand = outcomes_with_flips(120, 0.6, flips_down=6, flips_up=6)
    [check] = compare_accuracy(run_of(task_run({"acc": base})), run_of(task_run({"acc": cand})), gate_of())
    assert check.true_pass < 0.95 and check.docs_needed > 120
    assert f"raise the task's limit to {check.docs_needed} documents" in check.warning


def test_perplexities_gate_once_on_the_log_scale():
    """word and byte perplexity and bits per byte are one measurement: one check, on nats, base over
    candidate; on the word-perplexity scale the same loss reads as a far larger one."""
    rng = np.random.default_rng(0)
    words = rng.integers(50, 150, 100)
    nats_base = words * 3.0  # a 135M model: word perplexity about e^3
    nats_cand = nats_base * 1.03
    run_b = task_run(
        {
            "word_perplexity": [(-x, int(w)) for x, w in zip(nats_base, words)],
            "bits_per_byte": [(-x, int(w) * 5) for x, w in zip(nats_base, words)],
        },
        task="ppl",
        higher=False,
        aggregation="weighted_perplexity",
    )
    run_b.metrics["bits_per_byte"] = run_b.metrics["bits_per_byte"].model_copy(
        update={"aggregation": "bits_per_byte"}
    )
    run_c = task_run(
        {
            "word_perplexity": [(-x, int(w)) for x, w in zip(nats_cand, words)],
            "bits_per_byte": [(-x, int(w) * 5) for x, w in zip(nats_cand, words)],
        },
        task="ppl",
        higher=False,
        aggregation="weighted_perplexity",
    )
    run_c.metrics["bits_per_byte"] = run_c.metrics["bits_per_byte"].model_copy(
        update={"aggregation": "bits_per_byte"}
    )
    [check] = compare_accuracy(run_of(run_b), run_of(run_c), gate_of("ppl"))
    assert check.metric == "bits_per_byte" and check.passed
    assert (
        check.recovery == pytest.approx(1 / 1.03) and "word_perplexity: the same measurement" in check.reason
    )
    low, high = check.recovery_interval
    assert low <= 1 / 1.03 <= high
    word_ratio = run_b.metrics["word_perplexity"].value / run_c.metrics["word_perplexity"].value
    assert word_ratio < check.recovery  # the amplified scale the gate does not decide on


def test_documents_scored_with_other_prompts_are_not_paired():
    base, cand = outcomes_with_flips(50, 0.7, 1, 1)
    hashes = [f"h{i}" for i in range(50)]
    other = [*hashes[:-1], "changed"]
    [check] = compare_accuracy(
        run_of(task_run({"acc": base}, hashes=hashes)),
        run_of(task_run({"acc": cand}, hashes=other)),
        gate_of(),
    )
    assert not check.passed and "1 of 50 documents were scored with different prompts" in check.reason


def test_documents_the_base_did_not_score_fail_the_task():
    base, cand = outcomes_with_flips(50, 0.7, 1, 1)
    b = task_run({"acc": base[:40]})
    [check] = compare_accuracy(run_of(b), run_of(task_run({"acc": cand})), gate_of())
    assert not check.passed and "not in the base run" in check.reason


def test_a_corpus_level_metric_and_a_missing_task_fail_with_reasons():
    b = task_run({"f1": [0.5] * 10})
    b.metrics["f1"] = b.metrics["f1"].model_copy(update={"aggregation": "f1"})
    checks = compare_accuracy(run_of(b), run_of(b), gate_of("mc", "absent"))
    reasons = {c.task: c.reason for c in checks}
    assert (
        "aggregates it as 'f1'" in reasons["mc"]
        and "no results in the base and quantized run" in reasons["absent"]
    )
    assert not any(c.passed for c in checks)


def test_a_good_candidate_is_decided_at_an_early_look():
    base, cand = outcomes_with_flips(2000, 0.7, flips_down=10, flips_up=10)
    gate = gate_of()
    b = task_run({"acc": base}, planned=2000)
    first_look = task_run({"acc": cand[:500]}, planned=2000, looks_planned=4)
    assert task_decided(b, first_look, gate, gate.tasks[0], 0)
    [check] = compare_accuracy(run_of(b), run_of(first_look), gate)
    assert check.passed and check.docs == 500 and (check.look, check.looks) == (1, 4)
    assert check.base == pytest.approx(sum(base[:500]) / 500)  # over the paired documents only
    assert "500 of 2000 docs, look 1 of 4" in accuracy_rows([check])[0].reason


def test_a_borderline_candidate_is_not_decided_early():
    base, cand = outcomes_with_flips(400, 0.7, flips_down=14, flips_up=0)  # recovery 0.95
    gate = gate_of()
    b = task_run({"acc": base}, planned=400)
    assert not task_decided(
        b, task_run({"acc": cand[:100]}, planned=400, looks_planned=4), gate, gate.tasks[0], 0
    )


def test_a_borderline_candidate_is_scored_past_the_limit_not_decided_by_chance_there():
    """gates.accuracy.continue_to: the looks go on past a task's limit where it holds more documents. At the
    limit a borderline candidate is not forced to a decision; past it the rates still hold at every look
    (Monte Carlo on gsm8k's shape at 10% flips, 850 documents, continued to 1,275), a clear candidate
    stops where it did, a borderline one is scored on more documents, and a good one passes more often."""
    gate = gate_of(continue_to=1.5)
    assert gate.task_looks(10.0) == (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
    assert gate.task_looks(1.3) == (0.25, 0.5, 0.75, 1.0, 1.25, 1.3)  # capped at what the task holds
    assert gate_of().task_looks(10.0) == (0.25, 0.5, 0.75, 1.0)  # continue_to 1.0: decide at the limit
    assert (
        design(LOOKS + (1.25, 1.5), 0.05, 0.95).pass_bounds[:3] == design(LOOKS, 0.05, 0.95).pass_bounds[:3]
    )

    base, cand = outcomes_with_flips(600, 0.7, flips_down=21, flips_up=0)  # recovery 0.95
    b = task_run({"acc": base}, planned=600)
    at_limit = task_run({"acc": cand[:400]}, planned=600, looks_run=4, looks_planned=6).model_copy(
        update={"looks": [0.25, 0.5, 0.75, 1.0, 1.25, 1.5]}
    )
    assert not task_decided(b, at_limit, gate, gate.tasks[0], 3)  # look 4 of 6: the limit, not the end
    [check] = compare_accuracy(run_of(b), run_of(at_limit), gate)
    assert not check.passed and (check.look, check.looks, check.planned_docs) == (4, 6, 600)

    rates = dict(bad=0.93, max_false_pass=0.05, good=0.99, min_true_pass=0.987)
    shape = dict(base_accuracy=0.79, flip_rate=0.10, trials=2000, **rates)
    runs = {
        (looks, point): simulate_gate(docs=docs, recovery=point, fractions=looks, seed=seed, **shape)
        for looks, docs in ((LOOKS, 850), (LOOKS + (1.25, 1.5), 1275))
        for point, seed in ((0.93, 1), (0.96, 2), (0.99, 3))
    }
    planned, continued = LOOKS, LOOKS + (1.25, 1.5)
    assert runs[continued, 0.93].pass_rate <= 0.05 + 0.015
    assert runs[continued, 0.99].pass_rate >= runs[planned, 0.99].pass_rate - 0.005
    assert runs[continued, 0.99].mean_docs <= 1.05 * runs[planned, 0.99].mean_docs  # a clear one: no more
    assert runs[continued, 0.96].mean_docs >= 1.08 * runs[planned, 0.96].mean_docs  # a borderline one: more


def test_min_samples_counts_the_planned_documents():
    base, cand = outcomes_with_flips(400, 0.7, 2, 2)
    b = task_run({"acc": base}, planned=400)
    early = task_run({"acc": cand[:100]}, planned=400, looks_planned=4)
    checks = compare_accuracy(run_of(b), run_of(early), gate_of(min_samples=300))
    assert [c.metric for c in checks] == ["acc"]
    checks = compare_accuracy(run_of(b), run_of(early), gate_of(min_samples=500))
    [samples] = [c for c in checks if c.metric == "samples"]
    assert not samples.passed and "evaluated on 400 documents" in samples.reason


def test_a_task_states_its_own_error_rates():
    gate = AccuracyGate(
        tasks=[AccuracyTask(task="gsm8k", error_rates={"bad_recovery": 0.91}), AccuracyTask(task="arc")]
    )
    assert gate.rates(gate.tasks[0]) == ErrorRates(bad_recovery=0.91)
    assert gate.rates(gate.tasks[1]) == ErrorRates()


def test_report_and_card_show_the_paired_figures():
    from quantize_serve.gates.decision import Decision
    from quantize_serve.release.card import AccuracyRow, ModelCardInputs, Provenance, render_model_card
    from quantize_serve.report.run_report import render_markdown
    from tests.unit.test_report import report_with_capacity

    base, cand = outcomes_with_flips(1000, 0.7, flips_down=15, flips_up=12)
    [check] = compare_accuracy(run_of(task_run({"acc": base})), run_of(task_run({"acc": cand})), gate_of())
    report = report_with_capacity().model_copy(
        update={"accuracy": [check], "decision": Decision(passed=True, checks=accuracy_rows([check]))}
    )
    text = render_markdown(report)
    assert f"| {check.recovery_text} | 1000 of 1000 docs | 2.7% |" in text
    assert "## Accuracy (paired per document)" in text

    row = AccuracyRow(
        task="mc",
        dataset="local:mc",
        metric="acc",
        base=0.7,
        quantized=0.697,
        recovery=check.recovery,
        recovery_interval=check.recovery_interval,
        threshold=0.93,
        documents=check.docs_text,
        false_pass=check.false_pass,
        true_pass=check.true_pass,
        passed=True,
    )
    card = str(
        render_model_card(
            ModelCardInputs(
                repo_id="org/m",
                base_model="org/base",
                method="awq",
                scheme="W4A16",
                group_size=128,
                accuracy=[row],
                provenance=Provenance(recipe_sha256="0" * 64),
            )
        )
    )
    assert f"| {check.recovery_text} | 0.93 | 1000 of 1000 docs |" in card and "paired" in card


def test_a_remedy_the_task_cannot_meet_is_named_as_such():
    """A 300-document task whose paired noise needs more documents than it holds: the warning says the task
    cannot show the rate, and names the indifference zone that these documents reach."""
    base, cand = outcomes_with_flips(300, 0.5, flips_down=20, flips_up=18)
    runs = [task_run({"acc": v}).model_copy(update={"task_docs": 300}) for v in (base, cand)]
    [check] = compare_accuracy(run_of(runs[0]), run_of(runs[1]), gate_of())
    assert check.docs_needed > 300 and "raise the task's limit" not in check.warning
    assert "the task cannot show this rate" in check.warning and "300 documents are too few" in check.warning
    widest = float(check.warning.split("bad_recovery ")[1].split(" ")[0])
    assert 0.5 < widest < 0.93
    wider = gate_of(error_rates=ErrorRates(bad_recovery=widest))
    [again] = compare_accuracy(run_of(runs[0]), run_of(runs[1]), wider)
    assert again.task_true_pass >= 0.95 and not again.warning


def test_a_run_outside_a_git_checkout_prints_nothing_for_lm_evals_commit(tmp_path, monkeypatch, capfd):
    """lm-eval records the working folder's commit with `git describe`, whose 'fatal: not a git repository'
    reached the run's screen from a checkout without .git (seen on a GPU host): asked once, quietly."""
    from lm_eval import evaluator

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    with host_work_once():
        assert evaluator.get_git_commit_hash() is None
        assert evaluator.get_git_commit_hash() is None
    assert capfd.readouterr().err == ""
    evaluator.get_git_commit_hash()  # lm-eval's own again afterwards: it speaks
    assert "not a git repository" in capfd.readouterr().err
