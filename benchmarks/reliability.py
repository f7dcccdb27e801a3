"""Reliability figures: the fault matrix's tests, run for real, and the validate command's speed.

Reads the fault matrix (docs/reliability.md: one row per fault, each naming the test that proves
it), runs exactly those tests with pytest, then runs benchmarks/validate_cli.py (seconds per
`quantize-serve validate`, lines printed per recipe error), and writes
benchmarks/results/reliability/reliability.json:

  fault_cases           one entry per row: fault, test id, result (passed / failed / skipped / missing)
  validate_seconds_max  slowest `quantize-serve validate` of one recipe, interpreter start included
  error_lines_max       most lines printed for one recipe error

Run: .venv/bin/python benchmarks/reliability.py   (about 10 minutes on a 2-core CPU: the fault
tests boot vLLM and quantize)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout

from benchmarks.harness import RESULTS, ROOT  # noqa: E402
from benchmarks.evidence import write_json_result  # noqa: E402

MATRIX = ROOT / "docs" / "reliability.md"
ROW = re.compile(r"^\|\s*(\d+)\s*\|(.+?)\|(.+?)\|(.+?)\|\s*`(tests/[\w/]+\.py::[\w\[\]\-.,]+)`\s*\|\s*$")


def fault_rows(text: str | None = None) -> list[dict]:
    """The matrix rows: number, fault, what the user sees, what is left behind, test id."""
    text = MATRIX.read_text() if text is None else text
    return [
        {
            "case": int(m[1]),
            "fault": m[2].strip(),
            "user_sees": m[3].strip(),
            "left_behind": m[4].strip(),
            "test": m[5],
        }
        for m in map(ROW.match, text.splitlines())
        if m
    ]


def run_tests(test_ids: list[str]) -> dict[str, str]:
    """pytest on exactly these ids; the outcome of each (a parametrised id: all its cases)."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}",
                *sorted(set(test_ids)),
            ],
            cwd=ROOT,
            check=False,
        )
        cases = ET.parse(junit).getroot().iter("testcase") if junit.is_file() else []
        outcomes: dict[str, list[str]] = {}
        for case in cases:
            module = case.get("classname", "").split(".")
            path = (
                "/".join(module[: module.index(next(p for p in module if p.startswith("test_"))) + 1]) + ".py"
            )
            result = (
                "failed"
                if case.find("failure") is not None or case.find("error") is not None
                else "skipped"
                if case.find("skipped") is not None
                else "passed"
            )
            outcomes.setdefault(f"{path}::{case.get('name')}", []).append(result)

    def outcome(test_id: str) -> str:
        found = [
            r
            for name, rs in outcomes.items()
            for r in rs
            if name == test_id or (("[" not in test_id) and name.startswith(test_id + "["))
        ]
        if not found:
            return "missing"
        return "failed" if "failed" in found else "skipped" if "skipped" in found else "passed"

    return {t: outcome(t) for t in test_ids}


def main() -> int:
    rows = fault_rows()
    started = time.monotonic()
    results = run_tests([r["test"] for r in rows])
    for row in rows:
        row["result"] = results[row["test"]]
    subprocess.run([sys.executable, "benchmarks/validate_cli.py"], cwd=ROOT, check=True)
    validate = json.loads((RESULTS / "reliability/validate_cli.json").read_text())
    out = {
        "fault_cases": rows,
        "fault_cases_total": len(rows),
        "fault_cases_passed": sum(r["result"] == "passed" for r in rows),
        "fault_tests_seconds": round(time.monotonic() - started, 1),
        "validate_seconds_max": validate["validate_seconds_max"],
        "error_lines_max": validate["error_lines_max"],
        "source": "docs/reliability.md (rows), pytest (results), benchmarks/validate_cli.py (validate "
        "figures)",
    }
    write_json_result(RESULTS / "reliability/reliability.json", out)
    print(
        f"fault cases: {out['fault_cases_passed']}/{len(rows)} passed; validate_seconds_max "
        f"{out['validate_seconds_max']}; error_lines_max {out['error_lines_max']}"
    )
    return 0 if out["fault_cases_passed"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
