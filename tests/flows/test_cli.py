"""`quantize-serve run`: a user error inside the flow fails the run and prints one screen; a run prints a
line per stage and the decision, and keeps the full log in its folder; the first run on a machine that never
ran Prefect starts Prefect's API and database itself, telemetry off."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from quantize_serve.cli import main
from quantize_serve.recipe.load import apply_overrides
from tests import first_release_guide as guide
from tests.conftest import ROOT, SERVING_OVERRIDES, local_hub_server
from tests.unit.malformed_recipes import recipe_data


def test_run_a_user_error_inside_the_flow_fails_the_run_and_prints_one_screen(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    # Every row's text is empty: `validate` (columns, rows) passes, the flow's validate stage (which
    # reads the selected samples) raises a RecipeError inside the Prefect run. The serving-host check
    # (which stops `run` earlier on a CPU without AVX-512, tests/unit/test_cpu_support.py) is set aside.
    from quantize_serve.serving import host as cpu_support

    monkeypatch.setattr(cpu_support, "cpu_serving_gap", lambda *a, **k: None)
    calibration = tmp_path / "blank.jsonl"
    calibration.write_text("\n".join(json.dumps({"text": ""}) for _ in range(64)) + "\n")
    data = recipe_data(tmp_path)
    data["calibration"]["dataset"] = calibration.name
    path = tmp_path / "blank-texts.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", str(path)]) == 0
    capsys.readouterr()
    rc = main(["run", str(path)])
    out = capsys.readouterr()
    assert rc == 2, out.err
    assert "calibration.text_field" in out.err and "fix: " in out.err
    assert "Traceback" not in out.out + out.err
    # printed once: Prefect's copies of the error (the task's, the flow's) went to the run's log only
    assert out.err.count("fix: ") == 1 and " | ERROR " not in out.out + out.err, out.out + out.err


DEMO = ROOT / "recipes" / "tiny-llama-awq.yaml"
TOKEN = "hf_CliRunTestToken0123456789abcdefghij"


@pytest.mark.timeout(1800)
def test_run_shows_a_line_per_stage_and_the_decision_and_keeps_the_full_log_in_the_run_folder(
    tmp_path, capsys, monkeypatch
):
    """`quantize-serve run` on the demo recipe (as this CPU serves it, tests/conftest.py), its paths given
    absolute as a generated recipe gives them: under 60 lines on stdout (not a terminal here: no live
    bar), nothing on stderr, every decision row names its task by lm-eval's name (no path), and the
    full log (Prefect's task logs, lm-eval's lines) in run.log in the run's folder. It takes a GPU host's
    work-ahead paths (QS_AHEAD_AS_ON_GPU; its base booted, not reused, so the run decides beside_base): the
    calibration count started ahead and the count in the flow's thread, which raced on a GPU host. The command
    line is the first-release guide's (docs/getting-started/first-release.md, step 6), its recipe this one."""
    from quantize_serve.core.settings import get_settings

    monkeypatch.setenv("QS_AHEAD_AS_ON_GPU", "true")
    monkeypatch.setenv("QS_REUSE_BASE_REFERENCE", "false")
    get_settings.cache_clear()
    data = apply_overrides(yaml.safe_load(DEMO.read_text()), SERVING_OVERRIDES, source="demo")
    data["model"]["id"] = str(ROOT / "models" / "tiny-llama")
    data["calibration"]["dataset"] = str(ROOT / "data" / "calibration" / "tiny_calibration.jsonl")
    for task in data["gates"]["accuracy"]["tasks"]:
        task["task"] = str((DEMO.parent / task["task"]).resolve())
    path = tmp_path / DEMO.name
    path.write_text(yaml.safe_dump(data))
    try:
        with local_hub_server(tmp_path, tokens=(TOKEN,), online=True) as hub:
            rc = main(guide.run_argv(path))
            out = capsys.readouterr()
            (report_path,) = hub.runs.glob("*/report.json")
    finally:
        get_settings.cache_clear()  # the environment's settings again once monkeypatch undoes the variables
    lines = out.out.splitlines()
    print(f"`quantize-serve run` printed {len(lines)} lines:\n{out.out}")  # the figure the issue asks for
    assert rc == 0 and out.err == "", out.out + out.err
    assert len(lines) < 60
    stages = [line.split()[1] for line in lines if line.startswith(("✓", "✗"))]
    # the run's steps decided (report/steps.py) once the base is resolved, before anything boots
    assert stages[:4] == ["validate", "resolve", "decide", "quantize"] and "stress" in stages
    assert stages[-1] == "report" and any(line.startswith("✓ decide steps") for line in lines)
    report = json.loads(report_path.read_text())
    checks = [c["check"] for c in report["decision"]["checks"]]
    assert [c for c in checks if c.startswith("accuracy ")] and all(str(ROOT) not in c for c in checks)
    assert all(f"  {c} " in out.out for c in checks)  # the decision table, a line per check
    assert "accuracy qs_facts_mc acc" in checks and str(ROOT) not in "".join(
        lines[lines.index(next(line for line in lines if line.startswith("decision: "))) :]
    )
    log = (report_path.parent / "run.log").read_text()
    assert (
        "Task run 'quantize-model" in log and "lm-eval qs_passkey_478" in log and "Finished in state" in log
    )
    assert "stage done: quantized" in log and "stage quantize done in" in log  # the marks benchmarks/ time by
    # an accuracy run's lm-eval imports and task index were done while its server booted (accuracy_ahead),
    # and a line said as each of the candidate's looks started
    assert "lm-eval's imports and task index prepared while the server booted" in log
    # the count a GPU host makes before the base boots, after its work ahead (core/ahead.py)
    counted = r"quantize beside the base's accuracy run: \w+ \(.*\(\d[\d,]* calibration tokens\)\)"
    assert re.search(counted, log), log[-3000:]
    assert "look 1 of 4:" in log


@pytest.mark.timeout(900)
def test_the_first_run_on_a_machine_that_never_ran_prefect_starts_its_api_and_database(tmp_path) -> None:
    """The console script in a fresh process with a PREFECT_HOME that does not exist yet, no
    PREFECT_API_URL and no other Prefect setting in its environment (issue 72: a fresh home ended in "Timed
    out while attempting to connect to ephemeral Prefect API server" after 31.5 s). The run starts Prefect's
    API and creates its database, runs the flow (its validate stage stops it on the recipe's own error:
    one screen, exit 2) and records it there; Prefect's telemetry never ran and printed nothing."""
    calibration = tmp_path / "blank.jsonl"
    calibration.write_text("\n".join(json.dumps({"text": ""}) for _ in range(64)) + "\n")
    data = apply_overrides(recipe_data(tmp_path), SERVING_OVERRIDES, source="test")
    data["calibration"]["dataset"] = calibration.name
    recipe = tmp_path / "blank-texts.yaml"
    recipe.write_text(yaml.safe_dump(data))
    home = tmp_path / "never-ran-prefect"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    # Prefect's start timeout set shorter than any first start, as its 20 s default is on a slow host: the
    # run allows a first start longer (local_api.FIRST_START_S)
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1",
        QS_RUNS_DIR=str(tmp_path / "runs"),
    )
    started = time.monotonic()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "quantize-serve"), "run", str(recipe)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    seconds = time.monotonic() - started
    text = done.stdout + done.stderr
    print(f"first run from an empty Prefect home: exit {done.returncode} in {seconds:.1f} s\n{text}")
    assert done.returncode == 2 and "calibration.text_field" in done.stderr, text
    assert "Prefect's first start here: it creates its database" in done.stdout, text
    for unwanted in ("Traceback", "Timed out", "database is locked", "telemetry"):
        assert unwanted not in text, text
    with sqlite3.connect(home / "prefect.db") as db:
        assert db.execute("select state_type from flow_run").fetchall() == [("FAILED",)]
        assert db.execute("select key from configuration where key = 'TELEMETRY_SESSION'").fetchall() == []
