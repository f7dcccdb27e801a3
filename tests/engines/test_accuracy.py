"""The accuracy gate against the real vLLM CPU server: lm-eval's tasks on the base and the quantized
model, served as production serves them (the arithmetic: tests/unit/test_accuracy.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from quantize_serve.core.errors import GateError
from quantize_serve.gates.accuracy.run import AccuracyRun, run_accuracy
from quantize_serve.gates.accuracy.recovery import compare_accuracy
from quantize_serve.recipe.gates import AccuracyGate, AccuracyTask
from quantize_serve.recipe.load import load_recipe
from tests.conftest import ROOT

RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


MC, PPL = "../evals/tasks/qs_facts_mc.yaml", "../evals/tasks/qs_heldout_ppl.yaml"


PASSKEY = [f"../evals/tasks/qs_passkey_{n}.yaml" for n in (128, 268, 478)]


# 76 s on an AVX-512 CPU, 461-507 s on an AVX2 one (2026-12-04: vLLM's oneDNN there has no bf16 matmul
# and falls back to torch's), so the net sits above the slower
@pytest.mark.timeout(900)
def test_lm_eval_on_the_served_base_model(base_server, awq_recipe, base_model_dir, tmp_path, monkeypatch):
    """conftest's session boot of the base model (16-bit KV, the recipe's budget), shared with capacity."""
    server, spec = base_server
    recipe = awq_recipe
    monkeypatch.chdir(tmp_path)  # data paths must not depend on the working directory
    out = tmp_path / "accuracy"
    run = run_accuracy(
        server.base_url,
        recipe.gates.accuracy,
        tokenizer_dir=str(base_model_dir),
        max_length=spec.serve.max_model_len,
        base_dir=Path(recipe.base_dir),
        output_dir=out,
    )

    assert set(run.tasks) == {MC, PPL, *PASSKEY}
    for task in PASSKEY:  # the model retrieves the key up to max_model_len (4 choices)
        assert run.tasks[task].num_docs == 100 and run.tasks[task].metrics["acc"].value >= 0.8, task
    mc, ppl = run.tasks[MC], run.tasks[PPL]
    print(
        f"\nfacts_mc: {mc.metrics} ({mc.num_docs} docs, {mc.seconds} s)\n"
        f"heldout_ppl: {ppl.metrics} ({ppl.num_docs} docs, {ppl.seconds} s)"
    )
    rows = {
        name: sum(1 for line in (ROOT / "data/evals" / name).open() if line.strip())
        for name in ("facts_mc.jsonl", "heldout_ppl.jsonl")
    }
    assert (
        mc.num_docs == mc.planned_docs == rows["facts_mc.jsonl"] and ppl.num_docs == rows["heldout_ppl.jsonl"]
    )
    assert len(mc.documents) == mc.num_docs and mc.looks_run == 1  # the base: every document, one look
    assert set(mc.metrics) == {"acc", "acc_norm"}
    assert mc.metrics["acc"].value >= 0.5, "2x chance (4 choices): the tiny model knows its facts"
    assert mc.metrics["acc"].higher_is_better is True and mc.metrics["acc"].stderr is not None
    assert set(ppl.metrics) == {"word_perplexity", "byte_perplexity", "bits_per_byte"}
    assert all(m.higher_is_better is False for m in ppl.metrics.values())
    word, byte = ppl.metrics["word_perplexity"].value, ppl.metrics["byte_perplexity"].value
    assert 1.0 < word < 50.0, "word perplexity of a model trained on this corpus"
    assert 1.0 < byte < word
    assert ppl.metrics["bits_per_byte"].value == pytest.approx(math.log2(byte), rel=1e-6)

    raw = json.loads(Path(mc.results_path).read_text())  # lm-eval's own JSON is kept
    assert raw["results"]["qs_facts_mc"]["acc,none"] == pytest.approx(mc.metrics["acc"].value)
    assert Path(raw["configs"]["qs_facts_mc"]["dataset_kwargs"]["data_files"]["test"]).is_absolute()
    assert AccuracyRun.model_validate_json((out / "accuracy_run.json").read_text()) == run

    # the same server scored again as the candidate, paired with the base run: every task stops at the
    # first look whose decision is clear, on documents whose prompts match the base's. lm-eval's task index
    # is built once for the run, not by simple_evaluate on each task's each look (4-5 s a call here)
    from lm_eval.tasks import TaskManager

    built = []
    index = TaskManager.__init__
    monkeypatch.setattr(
        TaskManager, "__init__", lambda self, *a, **k: built.append(1) or index(self, *a, **k)
    )
    again = run_accuracy(
        server.base_url,
        recipe.gates.accuracy,
        tokenizer_dir=str(base_model_dir),
        max_length=spec.serve.max_model_len,
        base_dir=Path(recipe.base_dir),
        output_dir=tmp_path / "candidate",
        paired_with=run,
    )
    checks = compare_accuracy(run, again, recipe.gates.accuracy)
    print("\n".join(f"{c.task} {c.metric}: {c.recovery_text} {c.docs_text}" for c in checks))
    assert {(c.task, c.metric) for c in checks} == {
        (MC, "acc"),
        (MC, "acc_norm"),
        (PPL, "bits_per_byte"),
        *((t, "acc") for t in PASSKEY),
    }
    assert all(c.passed and c.recovery == pytest.approx(1.0, abs=0.02) for c in checks), checks
    assert all(c.recovery_interval and c.recovery_interval[0] < 1.0 + 1e-9 for c in checks)
    assert sum(t.num_docs for t in again.tasks.values()) < sum(t.num_docs for t in run.tasks.values())
    assert all(again.tasks[t].looks_planned == 4 for t in run.tasks)
    assert sum(t.looks_run for t in again.tasks.values()) > len(again.tasks) and len(built) == 1, built
    fewest = min(mc.num_docs, ppl.num_docs)
    strict = recipe.gates.accuracy.model_copy(update={"min_samples": fewest + 1})
    samples = [c for c in compare_accuracy(run, again, strict) if c.metric == "samples"]
    assert samples and not any(c.passed for c in samples)
    assert any(f"{fewest} documents" in c.reason for c in samples)


@pytest.mark.timeout(300)
def test_a_task_with_fewer_documents_than_looks_waits_for_the_look_that_holds_them(
    base_server, awq_recipe, base_model_dir, tmp_path
):
    """A limit of 2 over 4 looks (as mmlu at one question a subject, which the H200 driver's warm-up and
    CPU smoke run): look 1 holds none of the task's documents, looks 2 and 3 one each, look 4 none. The
    candidate's task waits for its documents (it failed for want of a metric before) and is judged at the
    look it ends on, every document scored."""
    server, spec = base_server
    gate = awq_recipe.gates.accuracy.model_copy(update={"tasks": [AccuracyTask(task=MC, limit=2)]})
    served = {
        "tokenizer_dir": str(base_model_dir),
        "max_length": spec.serve.max_model_len,
        "base_dir": Path(awq_recipe.base_dir),
    }
    base = run_accuracy(server.base_url, gate, output_dir=tmp_path / "base", **served)
    said = []
    candidate = run_accuracy(
        server.base_url, gate, output_dir=tmp_path / "candidate", paired_with=base, log=said.append, **served
    )
    assert [line.split(" against ")[0] for line in said][:1] == [f"lm-eval: {MC} look 2 of 4: 1 documents"]
    run = candidate.tasks[MC]
    assert list(run.documents) == list(base.tasks[MC].documents)[: run.num_docs]
    assert run.looks_run in (2, 3, 4)
    assert all(
        c.reason != "the task has no results in the quantized run"
        for c in compare_accuracy(base, candidate, gate)
    )


def test_a_candidate_undecided_at_its_limit_is_scored_on_past_it(
    base_server, awq_recipe, base_model_dir, tmp_path
):
    """gates.accuracy.continue_to 2.0 on a limit of 4: the base scores the 8 documents the draw holds, and a
    candidate (the same model: no flip, too few documents to show it) undecided at its limit's look goes on
    at the same spacing to the draw's end, its documents the base's in the same order."""
    server, spec = base_server
    gate = awq_recipe.gates.accuracy.model_copy(
        update={"tasks": [AccuracyTask(task=MC, limit=4)], "continue_to": 2.0}
    )
    served = {
        "tokenizer_dir": str(base_model_dir),
        "max_length": spec.serve.max_model_len,
        "base_dir": Path(awq_recipe.base_dir),
    }
    base = run_accuracy(server.base_url, gate, output_dir=tmp_path / "base", **served)
    assert base.tasks[MC].num_docs == 8 and base.tasks[MC].looks == [2.0]
    candidate = run_accuracy(
        server.base_url, gate, output_dir=tmp_path / "candidate", paired_with=base, **served
    )
    run = candidate.tasks[MC]
    assert run.looks == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0] and run.looks_run == 8
    assert list(run.documents) == list(base.tasks[MC].documents)
    checks = compare_accuracy(base, candidate, gate)
    assert {(c.docs, c.planned_docs, c.look, c.looks) for c in checks} == {(8, 8, 8, 8)}


PRODUCTION = ROOT / "recipes" / "llama3-8b-instruct-awq.yaml"


def production_gsm8k_gate(limit: int) -> AccuracyGate:
    """The production recipe's gsm8k entry as written (name, 5-shot, recovery override) with a
    smaller limit, at the tiny recipe's batch size and concurrency (a 2-core CPU server)."""
    gsm8k = next(t for t in load_recipe(PRODUCTION).gates.accuracy.tasks if t.task == "gsm8k")
    assert gsm8k.num_fewshot == 5 and gsm8k.limit == 850
    tiny = load_recipe(RECIPE).gates.accuracy
    return AccuracyGate(
        tasks=[gsm8k.model_copy(update={"limit": limit})],
        batch_size=tiny.batch_size,
        num_concurrent=tiny.num_concurrent,
    )


@pytest.mark.timeout(600)
def test_gsm8k_by_name_reads_its_data_from_the_hub(base_server, base_model_dir, hub_env, tmp_path):
    """The real lm-eval runs its built-in gsm8k against the served base model; the 20 rows it reads
    (train 12 for the few-shot examples, test 8) are the project's, published on the local hub as
    openai/gsm8k / main (conftest's datasets_hub). The tiny model scores about 0: that is not gated.
    Scored again look by look (2 documents each), every document gets the same 5-shot prompt as in
    the base's single pass: the few-shot draw is seeded per document (gates/accuracy/documents.py)."""
    server, spec = base_server
    gate = production_gsm8k_gate(limit=8)
    run = run_accuracy(
        server.base_url,
        gate,
        tokenizer_dir=str(base_model_dir),
        max_length=spec.serve.max_model_len,
        base_dir=PRODUCTION.parent,
        output_dir=tmp_path / "accuracy",
    )
    gsm8k = run.tasks["gsm8k"]
    print(f"\ngsm8k: {gsm8k.metrics} ({gsm8k.num_docs} docs, {gsm8k.seconds} s)")
    assert gsm8k.lm_eval_name == "gsm8k" and gsm8k.num_fewshot == 5 and gsm8k.num_docs == 8
    assert set(gsm8k.metrics) == {"exact_match,strict-match", "exact_match,flexible-extract"}
    assert all(0.0 <= m.value <= 1.0 and m.higher_is_better is True for m in gsm8k.metrics.values())

    raw = json.loads(Path(gsm8k.results_path).read_text())
    assert raw["configs"]["gsm8k"]["dataset_path"] == "openai/gsm8k"
    assert raw["configs"]["gsm8k"]["dataset_name"] == "main"
    assert raw["n-samples"]["gsm8k"]["original"] == 8  # our test split, not gsm8k's 1,319

    said = []  # the flow's task passes its run's log: a line as each look starts, for a person following it
    looked = run_accuracy(
        server.base_url,
        gate,
        tokenizer_dir=str(base_model_dir),
        max_length=spec.serve.max_model_len,
        base_dir=PRODUCTION.parent,
        output_dir=tmp_path / "looks",
        paired_with=run,
        log=said.append,
    ).tasks["gsm8k"]
    assert looked.looks_run == 4 and list(looked.documents) == list(
        gsm8k.documents
    )  # 8 documents: no early stop
    assert [line for line in said if not line.endswith(" s")] == [
        f"lm-eval: gsm8k look {k} of 4: 2 documents against {server.base_url}" for k in (1, 2, 3, 4)
    ]
    assert [line.split(" done in ")[0] for line in said if " done in " in line] == [
        f"lm-eval: gsm8k look {k} of 4" for k in (1, 2, 3, 4)
    ]  # and a line as each ends, with its seconds
    assert all(looked.documents[k].prompt_hash == d.prompt_hash for k, d in gsm8k.documents.items())
    fetched = {
        r.path.rsplit("/", 1)[-1]
        for r in hub_env.requests
        if r.method == "GET" and "/datasets/openai/gsm8k/resolve/" in r.path
    }
    assert {"train-00000-of-00001.parquet", "test-00000-of-00001.parquet"} <= fetched

    # Each look is one lm-eval call per lane for every task (gates/accuracy/run.py run_tasks,
    # gates/accuracy/lanes.py):
    # gsm8k 5-shot (the generation lane) beside a 0-shot task (the scoring lane), the two calls at once, gets
    # the prompts and outcomes it gets alone, so a base scored task by task (an earlier release's reference)
    # pairs with a candidate scored in lanes; each task keeps its own raw results. Here the lanes also keep
    # to a KV cache far smaller than the server's (gates/accuracy/scoring.py within_share): fewer requests
    # in flight, the same outcomes
    facts = AccuracyTask(task=MC, limit=40)
    alone = run_accuracy(
        server.base_url,
        gate.model_copy(update={"tasks": [facts]}),
        tokenizer_dir=str(base_model_dir),
        max_length=spec.serve.max_model_len,
        base_dir=PRODUCTION.parent,
        output_dir=tmp_path / "facts",
    ).tasks[MC]
    together = run_accuracy(
        server.base_url,
        gate.model_copy(update={"tasks": [*gate.tasks, facts]}),
        tokenizer_dir=str(base_model_dir),
        max_length=spec.serve.max_model_len,
        base_dir=PRODUCTION.parent,
        output_dir=tmp_path / "together",
        kv_cache_tokens=64,
        log=said.append,
    ).tasks
    bounded = [line.split(": ")[1].split(" (")[0] for line in said if " in flight at once " in line]
    # the two lanes log from threads of their own, in whichever order they get there
    prompts = [line for line in bounded if line.split()[1] == "prompts"]
    assert prompts == ["1 prompts in flight at once"], said  # 5-shot prompts: one fills the share
    groups = [line for line in bounded if line not in prompts]
    assert groups and {line.split()[1] for line in groups} == {"groups"}, said  # the check's, then the rest
    assert together["gsm8k"].num_fewshot == 5 and together[MC].num_fewshot == 0
    assert together["gsm8k"].documents == gsm8k.documents and together[MC].documents == alone.documents
    for task, member in (("gsm8k", "gsm8k"), (MC, "qs_facts_mc")):
        raw = json.loads(Path(together[task].results_path).read_text())
        assert set(raw["configs"]) == set(raw["n-shot"]) == {member}, raw["configs"].keys()
    assert json.loads(Path(together["gsm8k"].results_path).read_text())["n-shot"] == {"gsm8k": 5}


@pytest.mark.timeout(300)
def test_a_task_whose_data_cannot_be_fetched_says_which_hub_and_how(
    base_server, base_model_dir, hub_env, tmp_path, monkeypatch
):
    """Offline mode with nothing cached (what HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1 set): a
    GateError naming the endpoint and the switches, raised before any request reaches the server."""
    import datasets.config
    from huggingface_hub import constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    server, spec = base_server
    with pytest.raises(GateError) as err:
        run_accuracy(
            server.base_url,
            production_gsm8k_gate(limit=2),
            tokenizer_dir=str(base_model_dir),
            max_length=spec.serve.max_model_len,
            base_dir=PRODUCTION.parent,
            output_dir=tmp_path,
        )
    message = str(err.value)
    assert "could not load the data of task 'gsm8k'" in message and hub_env.endpoint in message
    assert "HF_HUB_OFFLINE" in message and "Fix: set HF_ENDPOINT" in message
    assert "openai/gsm8k" in message  # datasets' own words name the dataset
