"""The GPU benchmarks' scenario files and their one runner (benchmarks/run.py): every scenario names a driver
that exists and a result; the runner builds the driver's command, seeds a resumable result from the committed
one, records each start and end, and collects; scripts/gpu/host.sh learns a scenario by its file name alone.
No GPU and no engine here: the drivers run on a GPU host."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from benchmarks import harness
from benchmarks import run as runner
from tests.conftest import ROOT

SCENARIOS = harness.scenario_names()


def test_the_gpu_questions_are_scenario_files():
    assert {"h200", "shapes", "peak", "schemes", "moe", "release-time", "llama3", "shape"} <= set(SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_scenario_names_its_question_a_driver_that_exists_and_a_result(name):
    scenario = harness.load_scenario(name)
    runner.check_scenario(name, scenario)
    argv, env, out = runner.command(scenario, ROOT / "state", ["--resume"], python="python")
    assert argv[:2] == ["python", str(ROOT / scenario["driver"])] and argv[-3:] == [
        "--out",
        str(out),
        "--resume",
    ]
    assert out == ROOT / "state" / scenario["result"] and out.suffix == ".json"
    assert not any("{state}" in a for a in argv) and not any("{state}" in v for v in env.values())


def test_an_unknown_scenario_names_the_known_ones():
    with pytest.raises(SystemExit, match="no scenario 'nope'.*known: .*shapes"):
        harness.load_scenario("nope")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A scenario whose driver writes what it was given to --out; the committed results in tmp_path."""
    scenarios, results = tmp_path / "scenarios", tmp_path / "results"
    scenarios.mkdir()
    results.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import json, os, sys\nout = sys.argv[sys.argv.index('--out') + 1]\n"
        "old = json.load(open(out)) if os.path.exists(out) else {}\n"
        "json.dump({'argv': sys.argv[1:], 'env': os.environ.get('WHERE'), 'before': old}, open(out, 'w'))\n"
        "sys.exit(3 if '--fail' in sys.argv else 0)\n"
    )
    (scenarios / "toy.yaml").write_text(
        json.dumps(
            {
                "question": "does the runner run it",
                "host": "any",
                "driver": str(driver),
                "result": "toy.json",
                "resume": True,
                "job": "toyjob",
                "args": ["--work", "{state}/toy"],
                "env": {"WHERE": "{state}/w"},
            }
        )
    )
    monkeypatch.setattr(harness, "SCENARIOS", scenarios)
    monkeypatch.setattr(runner, "RESULTS", results)
    return tmp_path


def test_a_run_seeds_the_result_records_its_start_and_end_and_passes_the_arguments(fake, capsys):
    state = fake / "state"
    (fake / "results" / "toy.json").write_text(json.dumps({"rows": ["an earlier session's"]}))
    assert runner.main(["toy", "--state", str(state), "--fail"]) == 3
    result = json.loads((state / "toy.json").read_text())
    assert result["before"] == {"rows": ["an earlier session's"]}  # seeded: this session adds to it
    assert result["argv"] == ["--work", f"{state}/toy", "--out", str(state / "toy.json"), "--fail"]
    assert result["env"] == f"{state}/w"
    records = [json.loads(line) for line in (state / "runs.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["started", "finished"] and records[1]["rc"] == 3
    assert "seeded from benchmarks/results/toy.json" in capsys.readouterr().out
    runner.main(["toy", "--state", str(state)])  # a second run does not seed again: it continues the state's
    capsys.readouterr()
    assert json.loads((state / "toy.json").read_text())["before"]["argv"][-1] == "--fail"
    assert runner.main(["toy", "--job"]) == 0 and capsys.readouterr().out.strip() == "toyjob"
    dest = fake / "collected"
    runner.main(["--collect", str(dest), "--state", str(state)])
    assert {p.name for p in dest.iterdir()} == {"toy.json", "runs.jsonl"}


def test_host_sh_learns_a_scenario_by_its_name(tmp_path):
    """An unknown name is refused with the known ones, before any job starts (a known one would start a
    job)."""
    env = {**os.environ, "QS_GPU_STATE": str(tmp_path)}
    done = subprocess.run(
        ["bash", "scripts/gpu/host.sh", "launch-nope"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if not (ROOT / ".venv/bin/python").is_file():
        pytest.skip("host.sh checks for the project's .venv first")
    assert done.returncode == 2 and "no scenario nope" in done.stderr and "shapes" in done.stderr
    assert not list(tmp_path.glob("*.started"))
    job = subprocess.run(
        [sys.executable, "benchmarks/run.py", "release-time", "--job"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert job.stdout.strip() == "release"  # the job name host.sh status knows it by


def test_host_sh_status_lists_every_stage_done_beyond_the_tail(tmp_path):
    """Quantization's per-layer lines push the stages out of the log's tail; status prints them first, so
    each status call's output holds the run's stages even if the host is lost before the next call."""
    stages = [
        "▪ 10:36:50.130 2c5b28a259d6 stage resolve base done in 49 s: the base at f9330787b7c8",
        "▪         .356 2c5b28a259d6 stage quantize done in 221 s: 297,322 calibration tokens",
    ]
    layers = [f"▪ 10:37:{i % 60:02d}.000 6a72888c68f6 Grid search, model.layers.{i}" for i in range(80)]
    lines = [stages[0], *layers[:40], stages[1], *layers[40:]]
    (tmp_path / "release.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "release.rc").write_text("0\n")
    done = subprocess.run(
        ["bash", "scripts/gpu/host.sh", "status", "release"],
        cwd=ROOT,
        env={**os.environ, "QS_GPU_STATE": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    listed = [line for line in done.stdout.splitlines() if line.startswith("  done: ")]
    assert [line.removeprefix("  done: ") for line in listed] == stages
    assert "model.layers.79" in done.stdout  # the tail as before


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_file_validates_and_says_whether_it_is_still_asked(name):
    data = harness.load_scenario(name)
    assert isinstance(harness.Scenario.model_validate(data).asked, bool)


def test_a_scenario_with_an_unknown_key_is_refused_naming_the_key_and_the_file(tmp_path, monkeypatch):
    (tmp_path / "typo.yaml").write_text(
        "question: q\ndriver: benchmarks/plan.py\nhost: cpu\nresult: r.json\nresults: r.json\nresume: maybe\n"
    )
    monkeypatch.setattr(harness, "SCENARIOS", tmp_path)
    with pytest.raises(SystemExit) as refused:
        harness.load_scenario("typo")
    message = str(refused.value)
    assert message.startswith("benchmarks/scenarios/typo.yaml: ")
    assert "results: unknown key" in message and "resume: " in message


def test_a_dry_run_prints_the_command_and_runs_nothing(fake, capsys):
    state = fake / "state"
    (fake / "results" / "toy.json").write_text("{}")
    assert runner.main(["--dry-run", "toy", "--state", str(state), "--fail"]) == 0
    out = capsys.readouterr().out
    command = f"python {fake / 'driver.py'} --work {state}/toy --out {state / 'toy.json'} --fail"
    assert f"would run: {command}" in out
    assert f"with WHERE={state}/w" in out and "(seeded from" in out
    assert not state.exists()  # no result, no seed, no run record


def test_the_shared_settings_validate_and_are_no_scenario():
    """benchmarks/scenarios/shared.yaml holds what more than one driver reads; it is not listed or run."""
    assert harness.SharedSettings.model_validate(harness.shared_settings())
    assert "shared" not in SCENARIOS
    with pytest.raises(SystemExit, match="no scenario 'shared'"):
        harness.load_scenario("shared")


def test_a_shared_setting_with_an_unknown_key_is_refused_naming_it(tmp_path, monkeypatch):
    text = (ROOT / "benchmarks/scenarios/shared.yaml").read_text()
    (tmp_path / "shared.yaml").write_text(text + "typo_key: 1\n")
    monkeypatch.setattr(harness, "SCENARIOS", tmp_path)
    with pytest.raises(SystemExit, match="^benchmarks/scenarios/shared.yaml: typo_key: unknown key"):
        harness.shared_settings()


# a module that is no driver but one driver's own part reads that driver's scenario
OWN_PARTS = {"benchmarks/release_time_manual.py": "benchmarks/h200_release_time.py"}


def test_no_driver_reads_another_drivers_scenario():
    """Each load_scenario("NAME") in benchmarks/ names a scenario of that driver (or of the driver the
    module is part of): what several drivers read is in shared.yaml (harness.shared_settings)."""
    driver_of = {name: harness.load_scenario(name)["driver"] for name in SCENARIOS}
    borrowed = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        module = f"benchmarks/{path.name}"
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "load_scenario"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                name = node.args[0].value
                if driver_of.get(name) != OWN_PARTS.get(module, module):
                    borrowed.append((module, name))
    assert not borrowed, f"read from another driver's scenario (move the setting to shared.yaml): {borrowed}"
