"""The accuracy gate without a server: task resolution and data paths, and what an unreachable server
gives (the rule: tests/unit/test_paired_gate.py; lm-eval against real vLLM:
tests/engines/test_accuracy.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from quantize_serve.core.errors import GateError
from quantize_serve.gates.accuracy.run import run_accuracy
from quantize_serve.gates.accuracy.lanes import GENERATE, SCORE, LaneModels, lanes, one_call_each, run_lanes
from quantize_serve.gates.accuracy.task_files import absolute_data_paths, resolve_task
from quantize_serve.recipe.gates import AccuracyGate, AccuracyTask
from quantize_serve.recipe.load import load_recipe
from tests.conftest import ROOT

RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


MODEL_DIR = ROOT / "models" / "tiny-llama"


MC, PPL = "../evals/tasks/qs_facts_mc.yaml", "../evals/tasks/qs_heldout_ppl.yaml"


def gate_of(*tasks: AccuracyTask) -> AccuracyGate:
    return AccuracyGate(tasks=list(tasks))


def test_task_yaml_data_paths_become_absolute_whatever_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(RECIPE)
    for task, data in ((MC, "facts_mc.jsonl"), (PPL, "heldout_ppl.jsonl")):
        spec = resolve_task(AccuracyTask(task=task), Path(recipe.base_dir))
        data_file = Path(spec.load_spec["dataset_kwargs"]["data_files"]["test"])
        assert data_file == ROOT / "data" / "evals" / data and data_file.is_file()
        assert spec.include_path == ROOT / "evals" / "tasks"
    named = resolve_task(AccuracyTask(task="hellaswag"), ROOT)
    assert named.load_spec == "hellaswag" and named.include_path is None


def test_absolute_data_paths_leaves_hub_and_absolute_paths_alone(tmp_path):
    config = {
        "task": "t",
        "dataset_path": "../data",
        "dataset_kwargs": {
            "data_files": {"test": ["a.jsonl", "/abs/b.jsonl", "hf://datasets/x/c.jsonl"]},
            "data_dir": "d",
        },
    }
    out = absolute_data_paths(config, tmp_path / "tasks")
    assert out["dataset_path"] == str(tmp_path / "data")
    assert out["dataset_kwargs"]["data_files"]["test"] == [
        str(tmp_path / "tasks" / "a.jsonl"),
        "/abs/b.jsonl",
        "hf://datasets/x/c.jsonl",
    ]
    assert out["dataset_kwargs"]["data_dir"] == str(tmp_path / "tasks" / "d")
    assert config["dataset_kwargs"]["data_dir"] == "d"  # the input is not modified
    assert absolute_data_paths({"task": "t", "dataset_path": "json"}, tmp_path)["dataset_path"] == "json"


def test_missing_task_file_is_a_gate_error(tmp_path):
    gate = gate_of(AccuracyTask(task="evals/nope.yaml"))
    with pytest.raises(GateError, match="does not exist.*relative to the recipe's folder"):
        run_accuracy(
            "http://127.0.0.1:9",
            gate,
            tokenizer_dir=str(MODEL_DIR),
            max_length=512,
            base_dir=tmp_path,
            output_dir=tmp_path / "out",
        )


def test_unreachable_server_is_a_gate_error_through_the_prefect_task(tmp_path):
    from quantize_serve.serving.server import free_port
    from tasks.accuracy import run_accuracy as run_accuracy_task

    assert run_accuracy_task.name == "run-accuracy" and run_accuracy_task.retries == 0
    gate = load_recipe(RECIPE).gates.accuracy
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GateError, match="did not answer"):
        run_accuracy_task.fn(
            url,
            gate,
            tokenizer_dir=str(MODEL_DIR),
            max_length=512,
            base_dir=RECIPE.parent,
            output_dir=tmp_path,
        )


def test_a_metric_aggregated_over_the_whole_corpus_is_refused_before_any_request():
    """f1, bleu, mcc... cannot be split per document: the paired gate says so instead of leaving the
    metric out of the decision."""
    from quantize_serve.gates.accuracy.run import check_pairable
    from quantize_serve.gates.accuracy.task_files import TaskSpec

    def f1(items):  # lm-eval names its aggregations by their functions
        return 0.0

    def mean(items):
        return 0.0

    class Member:
        def __init__(self, aggregations):
            self._aggregations = aggregations

        def aggregation(self):
            return self._aggregations

        def higher_is_better(self):
            return {m: True for m in self._aggregations}

    spec = TaskSpec(task=AccuracyTask(task="glue_like"), name="glue_like", load_spec="glue_like")
    check_pairable(spec, {"a": Member({"acc": mean})})
    with pytest.raises(GateError, match=r"glue_like.*\{'f1': 'f1'\}.*cannot split per document.*Fix:"):
        check_pairable(spec, {"a": Member({"acc": mean}), "b": Member({"f1": f1})})


def test_a_look_that_holds_no_tasks_documents_makes_no_lm_eval_call():
    """A limit under the looks' count leaves a look without any of a task's documents (the engine test:
    tests/engines/test_accuracy.py); with no task in it, the look calls lm-eval not at all."""
    assert one_call_each([]) == [] and lanes([]) == {}
    run_lanes(
        {}, LaneModels(lambda: pytest.fail("no lane, no model")), lambda tasks, lm: pytest.fail("no call")
    )


class Member:
    def __init__(self, output_type: str) -> None:
        self.OUTPUT_TYPE = output_type


class Looks:
    def __init__(self, name: str, *members: tuple[str, str]) -> None:
        self.name, self.members = name, {n: Member(kind) for n, kind in members}


def test_a_looks_tasks_go_in_two_lanes_by_request_kind_each_lane_one_call_unless_members_are_shared():
    """gates/accuracy/lanes.py: generation tasks in one lane, the rest (scored, or mixing both kinds) in the
    other; within a lane one lm-eval call, or one a task where two tasks share a member."""
    gsm8k = Looks("gsm8k", ("gsm8k", "generate_until"))
    arc = Looks("arc", ("arc_challenge", "multiple_choice"))
    mmlu = Looks("mmlu", ("mmlu_a", "multiple_choice"), ("mmlu_b", "multiple_choice"))
    mixed = Looks("mixed", ("m_gen", "generate_until"), ("m_ll", "loglikelihood"))
    assert lanes([arc, gsm8k, mmlu]) == {SCORE: [[arc, mmlu]], GENERATE: [[gsm8k]]}
    assert lanes([mixed]) == {SCORE: [[mixed]]}
    also_arc = Looks("arc-again", ("arc_challenge", "multiple_choice"))
    assert lanes([arc, also_arc]) == {SCORE: [[arc], [also_arc]]}
    assert lanes([]) == {}


def test_lanes_run_at_the_same_time_each_with_a_model_of_its_own_and_a_failure_is_raised():
    """Two lanes' calls meet at a barrier only if they run at once; each lane's model is made once, in the
    caller's thread, and the scoring counts add up over them; one lane's failure is raised after both end."""
    import threading
    from collections import Counter

    made: list[str] = []

    class Model:
        def __init__(self) -> None:
            made.append(threading.current_thread().name)
            self.stats = Counter(context_requests=2)

    models, barrier, seen = LaneModels(Model), threading.Barrier(2, timeout=10), []

    def call(tasks, lm):
        barrier.wait()  # a BrokenBarrierError after 10 s if the other lane's call is not running
        seen.append((tasks[0].name, lm))

    gen, arc, mmlu = (
        Looks("gsm8k", ("gsm8k", "generate_until")),
        Looks("arc", ("arc", "multiple_choice")),
        Looks("mmlu", ("arc", "multiple_choice")),
    )
    run_lanes({GENERATE: [[gen]], SCORE: [[arc]]}, models, call)
    assert {name for name, _ in seen} == {"gsm8k", "arc"} and len({id(lm) for _, lm in seen}) == 2
    assert made == [threading.current_thread().name] * 2 and models.stats() == {"context_requests": 4}
    run_lanes({SCORE: [[arc], [mmlu]]}, models, lambda tasks, lm: seen.append((tasks[0].name, lm)))
    assert [name for name, _ in seen[2:]] == ["arc", "mmlu"] and len(made) == 2  # one lane: in order

    def fails(tasks, lm):
        if tasks[0].name == "arc":
            raise GateError("arc failed")
        seen.append(("finished", lm))

    with pytest.raises(GateError, match="arc failed"):
        run_lanes({GENERATE: [[gen]], SCORE: [[arc]]}, models, fails)
    assert seen[-1][0] == "finished"


def test_lanes_at_once_share_the_servers_kv_cache_and_one_lane_has_it_all():
    """run_lanes gives each lane's model (one that bounds its requests by it) its part of the server's KV
    cache: half each for two lanes at once, the whole once the other lane has ended, all of it for a look
    with one lane; none without a measure."""

    class Model:
        def __init__(self) -> None:
            self.kv_share = None

    gen, arc = Looks("gsm8k", ("gsm8k", "generate_until")), Looks("arc", ("arc", "multiple_choice"))
    both_in = threading.Barrier(2, timeout=30)
    together = [True]
    seen: dict[str, list[int | None]] = {}

    def call(tasks, lm) -> None:
        name = tasks[0].name
        seen[name] = [lm.kv_share and lm.kv_share.part()]
        if together[0]:
            both_in.wait()  # neither lane ends before both have read their part
            if name == "gsm8k":  # arc's lane ends; its part comes to this one
                deadline = time.monotonic() + 30
                while lm.kv_share.part() < 151_968 and time.monotonic() < deadline:
                    time.sleep(0.01)
                seen[name].append(lm.kv_share.part())

    models = LaneModels(Model, kv_tokens=151_968)
    run_lanes({GENERATE: [[gen]], SCORE: [[arc]]}, models, call)
    assert seen == {"gsm8k": [75_984, 151_968], "arc": [75_984]}
    together[0] = False
    run_lanes({SCORE: [[arc]]}, models, call)
    assert seen["arc"] == [151_968]
    run_lanes({SCORE: [[arc]]}, LaneModels(Model), call)
    assert seen["arc"] == [None]


def test_an_accuracy_runs_imports_and_task_index_are_prepared_ahead_unless_prepared_boots_are_off(
    monkeypatch,
):
    """tasks/accuracy.py prepare_accuracy, which the flow starts as a server's boot starts (flows/boots.py):
    the run's task files resolved and lm-eval's task index built, in a thread; QS_PREPARE_BOOTS=false (the
    H200 driver's baseline) leaves them to the run."""
    from quantize_serve.core.settings import get_settings
    from tasks.accuracy import prepare_accuracy

    recipe = load_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml")
    gate = recipe.gates.accuracy
    prepared = prepare_accuracy(gate, Path(recipe.base_dir)).result(timeout=300)
    assert [spec.task for spec in prepared.specs] == gate.tasks
    assert {spec.name for spec in prepared.specs} <= set(prepared.task_manager.all_tasks)
    monkeypatch.setenv("QS_PREPARE_BOOTS", "false")
    get_settings.cache_clear()
    try:
        assert prepare_accuracy(gate, Path(recipe.base_dir)) is None
    finally:
        monkeypatch.delenv("QS_PREPARE_BOOTS")
        get_settings.cache_clear()
