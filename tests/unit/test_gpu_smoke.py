"""The GPU smoke's plumbing on a CPU (benchmarks/gpu_smoke.py): the dry run's skeleton, the commit it records,
a whole smoke with stand-in commands for its parts (the result after every part, the report read and copied,
the tier's duplicate of the demo deselected), set-up's seconds from host.sh's records, and the result folder
collected whole. The GPU work itself runs on a GPU host (scripts/gpu/README.md, "The GPU smoke")."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_smoke
from benchmarks import run as runner
from tests.conftest import ROOT
from tests.unit.test_results_portable import machine_leaks

FIXTURE_REPORT = ROOT / "tests/fixtures/reports/tiny-llama-awq-cpu.json"


def smoke(tmp_path: Path, *args: str) -> int:
    return gpu_smoke.main(
        ["--out", str(tmp_path / "results/gpu-smoke/result.json"), "--state", str(tmp_path / "state"), *args]
    )


def result(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "results/gpu-smoke/result.json").read_text())


def test_the_dry_run_writes_the_skeleton_with_the_commit_portably(tmp_path):
    assert smoke(tmp_path, "--dry-run", "--commit", "0123abc") == 0
    r = result(tmp_path)
    assert r["commit"] == "0123abc" and r["commit_from"] == "--commit" and r["status"] == "dry-run"
    assert r["parts_selected"] == ["demo", "real-model", "gpu-tier"]
    assert {p["outcome"] for p in r["parts"].values()} == {"planned"}
    assert r["parts"]["demo"]["command"] == "make demo"
    assert r["parts"]["real-model"]["command"].endswith("quantize-serve run recipes/smollm2-135m-awq.yaml")
    assert f"--deselect {gpu_smoke.TIER_DUPLICATE}" in r["parts"]["gpu-tier"]["command"]
    assert r["ready"]["tier_duplicate_found"] is True  # the scenario names a test the tier still has
    assert {"hostname", "cpus"} <= set(r["host"]) and "card" in r and "setup" in r
    text = (tmp_path / "results/gpu-smoke/result.json").read_text()
    assert not machine_leaks(text), machine_leaks(text)


def test_without_the_demo_the_tier_runs_whole_and_without_commit_git_says(tmp_path):
    smoke(tmp_path, "--dry-run", "--parts", "real-model,gpu-tier")
    r = result(tmp_path)
    assert r["parts"]["demo"]["outcome"] == "not selected"
    assert "--deselect" not in r["parts"]["gpu-tier"]["command"]
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        assert r["commit"] == "unknown" and r["tree_dirty"] is None
        return
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert r["commit"] == head and r["commit_from"] == "git rev-parse HEAD"
    assert isinstance(r["tree_dirty"], bool)


def test_without_a_gpu_the_smoke_is_refused_in_one_line_before_any_part(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_smoke.gpu, "usable_memory_bytes", lambda index=0: None)  # NVML sees none
    with pytest.raises(SystemExit) as refused:
        smoke(tmp_path, "--commit", "x")
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1
    assert err.startswith("gpu_smoke.py: no NVIDIA GPU seen") and "--dry-run writes the skeleton here" in err
    assert not (tmp_path / "results").exists()


def test_unknown_parts_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        smoke(tmp_path, "--dry-run", "--parts", "demo,everything")
    assert "parts are demo, real-model, gpu-tier" in capsys.readouterr().err


def test_setup_seconds_come_from_host_sh_records(tmp_path):
    assert gpu_smoke.setup_record(tmp_path, None)["seconds"] is None
    (tmp_path / "setup.times").write_text("2026-12-07T10:00:00Z 131 0\n2026-12-07T10:20:00Z 1 0\n")
    times = gpu_smoke.setup_record(tmp_path, None)
    assert times["seconds"] == 131 and len(times["runs"]) == 2  # the first is the real set-up
    assert gpu_smoke.setup_record(tmp_path, 52.0) == {"seconds": 52.0, "from": "--setup-seconds"}


def test_paths_outside_the_project_keep_their_last_two_parts():
    text = (
        'File "/opt/torch/.venv/lib/python3.12/site-packages/transformers/__init__.py", line 3 at /v1/x '
        "on http://0.0.0.0:8000"
    )
    scrubbed = gpu_smoke.scrub(text, ())
    assert ".../transformers/__init__.py" in scrubbed and "/v1/x" in scrubbed
    assert not machine_leaks(scrubbed)
    assert gpu_smoke.scrub(f"{ROOT}/runs/x/report.md", ()) == "runs/x/report.md"


# What each boot's vLLM log said (the fp8-KV boot's differs from its row's 14,464 tokens)
LOGGED = {"base": "6,016", "w4a16": "7,168", "w4a16-fp8kv": "14,000"}


def current_report() -> dict:
    """The fixture as the flow writes a report now: each capacity row with its source and what its boot held
    (capacity/measure.py)."""
    report = json.loads(FIXTURE_REPORT.read_text())
    for row in report["capacity"]["configs"]:
        said = f"GPU KV cache size: {LOGGED[row['name']]} tokens"
        row.update(source="measured", held={"kv_cache_tokens": row["kv_cache_tokens"], "vllm_said": said})
        row["held"]["log"] = f"vllm-{row['name']}.log"
    return report


def report_dir(tmp_path: Path, name: str = "tiny-llama-awq-1") -> Path:
    """A run folder as the flow leaves it: report.json, report.md, the boots' vLLM logs."""
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(current_report()))
    (folder / "report.md").write_text(f"# report\nlog: {folder}/run.log\n")
    for row, tokens in LOGGED.items():
        (folder / f"vllm-{row}.log").write_text(f"INFO GPU KV cache size: {tokens} tokens\n")
    return folder


def test_a_report_is_summarized_with_gates_capacity_as_vllm_logged_it_and_stress(tmp_path):
    folder = report_dir(tmp_path)
    s = gpu_smoke.summarize_report(json.loads((folder / "report.json").read_text()), folder)
    assert s["decision"] == "passed" and s["release"]["status"] == "promoted"
    assert not s["stages_that_could_not_run"] and all(c["result"] in ("pass", "off") for c in s["checks"])
    gate = s["gates"][0]
    assert gate["recovery_interval"] and gate["task"].endswith("qs_facts_mc.yaml")
    rows = {r["name"]: r for r in s["capacity"]["rows"]}
    assert all(r["how"] == "measured" for r in rows.values())
    assert rows["base"]["vllm_log_kv_tokens"] == 6016 and rows["base"]["matches_its_log"] is True
    assert rows["w4a16-fp8kv"]["matches_its_log"] is False  # 14,464 in the report, 14,000 in the log
    assert s["stress"]["completed"] == 48 and "bench_output_throughput" in s["stress"]
    report = json.loads((folder / "report.json").read_text())  # a row derived from another boot
    production_held = report["capacity"]["configs"][2]["held"]
    report["capacity"]["configs"][1].update(
        source="derived", derived="derived from the w4a16-fp8kv boot", held=production_held
    )
    row = gpu_smoke.summarize_report(report, folder)["capacity"]["rows"][1]
    assert row["how"] == "derived" and row["vllm_log"] == "vllm-w4a16-fp8kv.log"
    assert row["vllm_log_kv_tokens"] == 14000 and row["matches_its_log"] is None
    checks = gpu_smoke.whole_flow_checks(json.loads((folder / "report.json").read_text()), folder)
    assert checks["promoted"] and checks["planner_within_1_pct"]
    assert checks["rows_say_what_their_boot_held"] and checks["production_log_says_gpu_kv_cache"]
    assert (
        not checks["quantized_on_the_gpu"] and not checks["capacity_under_vllm_gpu_accounting"]
    )  # a CPU run


STAND_IN = """
import json, os, shutil, sys, time
kind = sys.argv[1]
if kind == "demo":
    folder = os.path.join(os.environ["SMOKE_DEMO_RUNS"], f"tiny-llama-awq-{time.time_ns()}")
    os.makedirs(folder)
    shutil.copyfile(os.environ["SMOKE_FIXTURE"], os.path.join(folder, "report.json"))
    print("flow run:   abc (Completed) in 12 s")
    print("decision:   passed; release: promoted")
elif kind == "real-model":
    assert os.environ["HF_ENDPOINT"].startswith("http://127.0.0.1:"), os.environ["HF_ENDPOINT"]
    folder = os.path.join(os.environ["QS_RUNS_DIR"], "smollm2-135m-awq-1")
    os.makedirs(folder)
    shutil.copyfile(os.environ["SMOKE_FIXTURE"], os.path.join(folder, "report.json"))
    open(os.path.join(folder, "report.md"), "w").write("# smollm2\\nfolder " + folder + "\\n")
    print("quantize-serve run recipes/smollm2-135m-awq.yaml")
    print("decision: passed; release: promoted")
else:
    xml = sys.argv[sys.argv.index("--junitxml") + 1]
    os.makedirs(os.path.dirname(xml), exist_ok=True)
    open(xml, "w").write('<testsuites><testsuite><testcase classname="tests.gpu.test_gpu" '
                         'name="test_llama3_8b_shape" time="2.5"/></testsuite></testsuites>')
    print("1 passed", " ".join(sys.argv[2:]))
"""


def test_a_whole_smoke_with_stand_in_parts_records_each_part(tmp_path, monkeypatch):
    """Each part's command replaced by a stand-in that behaves as it does (prints the demo's last lines,
    writes a report where the flow would, writes the tier's JUnit XML): the result, the report's copy, the
    tier's deselection and the whole-flow checks read from the demo's report. On a CPU those checks fail (no
    GPU figures), so the tier part and the smoke fail."""
    monkeypatch.setattr(gpu_smoke, "require_gpu", lambda *args, **kwargs: None)  # a GPU host, but for NVML
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    demo_runs = tmp_path / "demo-runs"
    demo_runs.mkdir()
    monkeypatch.setenv("SMOKE_DEMO_RUNS", str(demo_runs))
    fixture = tmp_path / "report.json"
    fixture.write_text(json.dumps(current_report()))
    monkeypatch.setenv("SMOKE_FIXTURE", str(fixture))
    monkeypatch.setattr(gpu_smoke, "MODEL_DIR", "models/tiny-llama")  # a model that is there
    py = [sys.executable, str(script)]
    monkeypatch.setattr(gpu_smoke, "DEMO_COMMAND", [*py, "demo"])
    monkeypatch.setattr(gpu_smoke, "REAL_MODEL_COMMAND", [*py, "real-model"])
    monkeypatch.setattr(gpu_smoke, "TIER_COMMAND", [*py, "tier", *gpu_smoke.TIER_COMMAND[1:]])
    monkeypatch.setattr(gpu_smoke, "DEMO_RUNS", demo_runs)
    rc = smoke(tmp_path, "--commit", "feedbee", "--demo-runs", "2", "--setup-seconds", "100")
    r = result(tmp_path)
    assert r["commit"] == "feedbee" and r["status"] == "finished" and r["setup"]["seconds"] == 100
    demo = r["parts"]["demo"]
    assert demo["outcome"] == "passed" and demo["promoted_runs"] == 2 and len(demo["runs"]) == 2
    assert demo["runs"][0]["flow_seconds"] == 12 and demo["runs"][0]["whole_flow_checks"]["promoted"]
    real = r["parts"]["real-model"]
    assert (
        real["outcome"] == "passed" and real["decision"] == "passed" and real["report"] == "smollm2-report.md"
    )
    assert real["gates"] and real["capacity"]["rows"][0]["matches_its_log"] is True and real["stress"]
    assert "RepositoryNotFound" in str(real["hub_tags"])  # the local Hub answered; nothing pushed
    copied = (tmp_path / "results/gpu-smoke/smollm2-report.md").read_text()
    assert copied.startswith("# smollm2") and not machine_leaks(copied)
    tier_part = r["parts"]["gpu-tier"]
    assert tier_part["deselected"] == [gpu_smoke.TIER_DUPLICATE]
    assert tier_part["tests"]["tests/gpu/test_gpu.py::test_llama3_8b_shape"]["outcome"] == "passed"
    assert tier_part["whole_flow_checks_on_the_demo"]["quantized_on_the_gpu"] is False
    assert tier_part["outcome"] == "failed" and r["passed"] is False and rc == 1
    assert r["seconds_with_setup"] >= 100
    text = (tmp_path / "results/gpu-smoke/result.json").read_text()
    assert not machine_leaks(text), machine_leaks(text)


def test_a_missing_reference_model_fails_its_part_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_smoke, "MODEL_DIR", "models/not-built")
    monkeypatch.setattr(gpu_smoke, "require_gpu", lambda *args, **kwargs: None)  # a GPU host, but for NVML
    assert smoke(tmp_path, "--parts", "real-model", "--commit", "x") == 1
    real = result(tmp_path)["parts"]["real-model"]
    assert real["outcome"] == "failed" and "requirements/reference-models.txt" in real["error"]


def test_the_scenario_is_wired_and_its_result_folder_is_collected(tmp_path):
    scenario = runner.load_scenario("gpu-smoke")
    runner.check_scenario("gpu-smoke", scenario)
    assert scenario["result"] == "gpu-smoke/result.json" and scenario["setup"] == "first"
    argv, _, out = runner.command(scenario, tmp_path, [], python="python")
    assert argv[2:6] == ["--state", str(tmp_path), "--work", f"{tmp_path}/gpu-smoke-work"]
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps({"commit": "x"}))
    (out.parent / "smollm2-report.md").write_text("# report\n")
    copied = runner.collect(tmp_path / "dest", tmp_path)
    assert {"gpu-smoke/result.json", "gpu-smoke/smollm2-report.md"} <= set(copied)
    assert (tmp_path / "dest/gpu-smoke/smollm2-report.md").is_file()


def test_a_part_is_stopped_at_its_limit_and_what_it_leaves_holding_its_output_is_stopped(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    slow, lines = gpu_smoke.run_streamed(["sh", "-c", "echo started; sleep 30"], env, tmp_path / "a.log", 1)
    assert slow["timed_out"] and lines == ["started"] and slow["seconds"] < 20
    left, _ = gpu_smoke.run_streamed(
        ["sh", "-c", "sleep 30 & echo done"], env, tmp_path / "b.log", 20, linger_s=1
    )
    assert left["rc"] == 0 and not left["timed_out"] and left["left_processes_holding_its_output"]
    assert left["seconds"] < 15 and (tmp_path / "b.log").read_text() == "done\n"
