"""One runner for the GPU benchmarks: each question is a scenario file, ``benchmarks/scenarios/NAME.yaml``,
that says what runs (its ``driver``), with which recipe and settings, and where its ``result`` goes; this runs
any of them, recording as it goes, resumes, and collects.

    .venv/bin/python benchmarks/run.py --list                              # the scenarios and their questions
    .venv/bin/python benchmarks/run.py NAME [--state DIR] [DRIVER ARGS...]  # run one on this host
    .venv/bin/python benchmarks/run.py --dry-run NAME [DRIVER ARGS...]     # what it would run; runs nothing
    .venv/bin/python benchmarks/run.py --collect DEST [--state DIR]        # every result and the run records

On the GPU host, ``bash scripts/gpu/host.sh launch NAME [ARGS]`` starts one detached (job NAME, or the
scenario's ``job``): a new scenario file is a new job, with no edit to host.sh.

A run: the result is ``STATE/<result>`` (STATE: ``--state``, else $QS_GPU_STATE, else /tmp/qs-h200). A
scenario with ``resume: true`` first seeds it from ``benchmarks/results/<result>``, a result measured in an
earlier session that this one adds to. The driver runs as ``python DRIVER ARGS --out STATE/<result> [DRIVER
ARGS...]`` (``{state}`` in the scenario's ``args`` and ``env`` is STATE; arguments given here come last, so
they win), its output passed through; ``STATE/runs.jsonl`` records each start and end (the scenario, the
command, its exit code and seconds), so a session cut short still says what it started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import RESULTS, ROOT, load_scenario, now, scenario_names  # noqa: E402

RECORD = "runs.jsonl"


def default_state() -> Path:
    return Path(os.environ.get("QS_GPU_STATE", "/tmp/qs-h200"))


def scenarios() -> dict[str, dict[str, Any]]:
    return {name: load_scenario(name) for name in scenario_names()}


def job_name(name: str) -> str:
    return load_scenario(name).get("job", name)


def check_scenario(name: str, scenario: dict[str, Any]) -> None:
    """The runner's part of a scenario file: a driver that exists and a result file name."""
    for key in ("question", "driver", "result"):
        if not scenario.get(key):
            raise SystemExit(
                f"benchmarks/scenarios/{name}.yaml: no {key!r}; a scenario names its question, "
                "its driver (a script under benchmarks/) and its result file"
            )
    if not (ROOT / scenario["driver"]).is_file():
        raise SystemExit(f"benchmarks/scenarios/{name}.yaml: driver {scenario['driver']!r} does not exist")


def command(
    scenario: dict[str, Any], state: Path, extra: list[str], *, python: str = sys.executable
) -> tuple[list[str], dict[str, str], Path]:
    """(the driver's argv, the env it adds, its result file) for ``scenario`` run in ``state``."""

    def fill(value: Any) -> str:
        return str(value).replace("{state}", str(state))

    out = state / scenario["result"]
    argv = [
        python,
        str(ROOT / scenario["driver"]),
        *map(fill, scenario.get("args", [])),
        "--out",
        str(out),
        *extra,
    ]
    env = {k: fill(v) for k, v in (scenario.get("env") or {}).items()}
    return argv, env, out


def seed(scenario: dict[str, Any], out: Path) -> bool:
    """A resumable scenario's result, first copied from the checkout's committed one (True when it was)."""
    committed = RESULTS / scenario["result"]
    if scenario.get("resume") and not out.is_file() and committed.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(committed, out)
        return True
    return False


def record(state: Path, **entry: Any) -> None:
    state.mkdir(parents=True, exist_ok=True)
    with (state / RECORD).open("a") as f:
        f.write(json.dumps({"at": now(), **entry}) + "\n")


def dry_run(name: str, state: Path, extra: list[str]) -> int:
    """What ``run`` would do for ``name``, printed: the command, the environment it adds, the result and its
    seed; nothing runs, nothing is written."""
    scenario = load_scenario(name)
    check_scenario(name, scenario)
    argv, env, out = command(scenario, state, extra)
    committed = RESULTS / scenario["result"]
    shown = " ".join(argv[1:]).replace(str(ROOT) + os.sep, "")
    print(f"[dry-run] {name}: {scenario['question']}")
    if not scenario.get("asked", True):
        print(f"[dry-run] {name}: answered; it runs to measure again")
    print(f"[dry-run] would run: python {shown}")
    for k, v in env.items():
        print(f"[dry-run] with {k}={v}")
    seeded = scenario.get("resume") and not out.is_file() and committed.is_file()
    seed_from = str(committed).replace(str(ROOT) + os.sep, "")
    print(f"[dry-run] result: {out}" + (f" (seeded from {seed_from})" if seeded else ""))
    return 0


def run(name: str, state: Path, extra: list[str]) -> int:
    scenario = load_scenario(name)
    check_scenario(name, scenario)
    argv, env, out = command(scenario, state, extra)
    if not scenario.get("asked", True):
        print(f"[run] {name}: answered (asked: false); measuring again", flush=True)
    if seed(scenario, out):
        print(
            f"[run] {out} seeded from benchmarks/results/{scenario['result']} (this session adds to it)",
            flush=True,
        )
    shown = " ".join(argv[1:]).replace(str(ROOT) + os.sep, "")
    print(f"[run] {name}: {scenario['question']}\n[run] {shown}", flush=True)
    record(state, scenario=name, event="started", command=shown, env=env)
    t0 = time.monotonic()
    rc = subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}).returncode
    record(state, scenario=name, event="finished", rc=rc, seconds=round(time.monotonic() - t0, 1))
    print(f"[run] {name}: exit code {rc}; result {out}", flush=True)
    return rc


def collect(dest: Path, state: Path) -> list[str]:
    """Every scenario's result found in ``state``, and the run records, copied to ``dest``; a result in a
    folder of its own (``gpu-smoke/result.json``) comes with the other files of that folder."""
    dest.mkdir(parents=True, exist_ok=True)
    names = sorted({s["result"] for s in scenarios().values()} | {RECORD})
    copied = []
    for name in names:
        if not (state / name).is_file():
            continue
        folder = Path(name).parent
        found = sorted((state / folder).iterdir()) if folder != Path(".") else [state / name]
        for f in (f for f in found if f.is_file()):
            (dest / folder).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest / folder / f.name)
            copied.append((folder / f.name).as_posix())
    return copied


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
        usage="run.py (--list | --collect DEST | [--dry-run] NAME) [--state DIR] [DRIVER ARGS...]",
    )
    p.add_argument("name", nargs="?", help="a scenario: benchmarks/scenarios/NAME.yaml")
    p.add_argument(
        "--state",
        type=Path,
        default=None,
        help="where results and scratch go (default $QS_GPU_STATE, else /tmp/qs-h200)",
    )
    p.add_argument("--list", action="store_true", help="the scenarios and their questions")
    p.add_argument("--job", action="store_true", help="print the scenario's job name (host.sh)")
    p.add_argument("--dry-run", action="store_true", help="print what NAME would run; run nothing")
    p.add_argument(
        "--collect", type=Path, metavar="DEST", help="copy every result and the run records to DEST"
    )
    args, extra = p.parse_known_args(argv)
    state = (args.state or default_state()).resolve()
    if args.list:
        for name, s in scenarios().items():
            asked = "asked" if s.get("asked", True) else "answered"
            print(f"{name:16} {s['host']:15} {asked:9} {s['result']}\n{'':16} {s['question']}")
        return 0
    if args.collect:
        print(f"collected into {args.collect}: {' '.join(collect(args.collect, state))}")
        return 0
    if not args.name:
        p.error("name a scenario (--list shows them)")
    if args.job:
        print(job_name(args.name))
        return 0
    return (dry_run if args.dry_run else run)(args.name, state, extra)


if __name__ == "__main__":
    sys.exit(main())
