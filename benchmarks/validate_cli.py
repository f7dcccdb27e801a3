"""How fast `quantize-serve validate` answers, and how long its error screens are.

Writes benchmarks/results/reliability/validate_cli.json. For each recipe: the wall seconds of the installed
console script in a subprocess (interpreter start included: what CI pays per call), the exit
status, and the number of lines it printed. The recipes are the fourteen malformed ones of issue 11
and the recipe-only cross-section rules (tests/unit/malformed_recipes.py, the same cases the tests
check), written under .cache/validate-cli/, and the shipped recipes in recipes/.

Each recipe runs ``--repeats`` times (default 5); a row keeps the median and the slowest run.
``validate_seconds_max`` is the largest median over all recipes (target: at most 1 s on the 2-core
CPU machine of this project), ``validate_seconds_slowest_run`` the single slowest call, and
``error_lines_max`` the most lines printed for any malformed recipe (target: at most 15).
``cpu_seconds`` (user + system time of the child) shows the cost without the other work on a shared
machine; ``machine.load_average_1min`` says how busy it was.

Run from the repository root in the pipeline venv, after `pip install -e .` (which installs the
console script)::

    python benchmarks/validate_cli.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from tests.unit.malformed_recipes import CROSS_SECTION_CASES, ISSUE_CASES, Case, write_case  # noqa: E402

from benchmarks.harness import ROOT  # noqa: E402

SCRIPT = Path(sys.executable).parent / "quantize-serve"
CASES_DIR = ROOT / ".cache" / "validate-cli"
OUT = ROOT / "benchmarks" / "results" / "reliability" / "validate_cli.json"
TARGET_SECONDS, TARGET_LINES = 1.0, 15


def run_validate(recipe: Path, repeats: int) -> tuple[list[float], list[float], subprocess.CompletedProcess]:
    """Wall seconds and CPU seconds (user + system of the child) of each call: the console script
    in a subprocess, from the repository root. CPU time hardly moves with the machine's load."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    seconds, cpu, done = [], [], None
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(
            [str(SCRIPT), "validate", str(recipe.relative_to(ROOT))],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        seconds.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    assert done is not None
    return seconds, cpu, done


def row(name: str, group: str, recipe: Path, repeats: int, case: Case | None = None) -> dict:
    seconds, cpu, done = run_validate(recipe, repeats)
    output = (done.stdout + done.stderr).replace(f"{ROOT}{os.sep}", "")  # paths relative to the repository
    lines = output.splitlines()
    result = {
        "name": name,
        "group": group,
        "recipe": str(recipe.relative_to(ROOT)),
        "exit_code": done.returncode,
        "seconds": round(statistics.median(seconds), 3),
        "seconds_slowest": round(max(seconds), 3),
        "cpu_seconds": round(statistics.median(cpu), 3),
        "lines": len(lines),
    }
    if case is not None:
        result |= {
            "expected_field": case.field,
            "names_field": case.field in output,
            "names_fix": case.fix in output and "fix: " in output,
            "traceback": "Traceback" in output,
        }
    result["output"] = lines
    print(
        f"{name:40s} exit {done.returncode}  {result['seconds']:.3f} s wall  {result['cpu_seconds']:.3f} s "
        f"cpu  {len(lines):2d} lines",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if not SCRIPT.is_file():
        raise SystemExit(f"{SCRIPT} is missing: run `{sys.executable} -m pip install --no-deps -e .` first")

    shutil.rmtree(CASES_DIR, ignore_errors=True)
    load_before = os.getloadavg()[0]
    rows = []
    for group, cases in (("issue", ISSUE_CASES), ("cross-section", CROSS_SECTION_CASES)):
        for case in cases:
            rows.append(row(case.name, group, write_case(case, CASES_DIR), args.repeats, case))
    for recipe in sorted((ROOT / "recipes").glob("*.yaml")):
        rows.append(row(recipe.stem, "shipped", recipe, args.repeats))

    errors = [r for r in rows if r["group"] != "shipped"]
    results = {
        "command": "quantize-serve validate RECIPE (console script, subprocess, from the repository root)",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "system": platform.system(),
            # a shared machine: other work running at the same time slows every call
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        },
        "repeats": args.repeats,
        "targets": {"validate_seconds_max": TARGET_SECONDS, "error_lines_max": TARGET_LINES},
        "validate_seconds_max": max(r["seconds"] for r in rows),
        "validate_seconds_median": round(statistics.median(r["seconds"] for r in rows), 3),
        "validate_seconds_slowest_run": max(r["seconds_slowest"] for r in rows),
        "validate_cpu_seconds_max": max(r["cpu_seconds"] for r in rows),
        "error_lines_max": max(r["lines"] for r in errors),
        "malformed_exit_2": all(r["exit_code"] == 2 for r in errors),
        "malformed_name_field_and_fix": all(r["names_field"] and r["names_fix"] for r in errors),
        "malformed_without_traceback": not any(r["traceback"] for r in errors),
        "shipped_exit_0": all(r["exit_code"] == 0 for r in rows if r["group"] == "shipped"),
        "cases": rows,
    }
    text = json.dumps(results, indent=2) + "\n"
    assert str(ROOT) not in text and str(Path.home()) + os.sep not in text, "an absolute path leaked"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(
        f"validate_seconds_max {results['validate_seconds_max']} s (median of {args.repeats}), "
        f"slowest single run {results['validate_seconds_slowest_run']} s, "
        f"cpu max {results['validate_cpu_seconds_max']} s, "
        f"error_lines_max {results['error_lines_max']}; wrote {args.out.relative_to(ROOT)}"
    )
    ok = (
        results["malformed_exit_2"]
        and results["malformed_name_field_and_fix"]
        and results["malformed_without_traceback"]
        and results["shipped_exit_0"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
