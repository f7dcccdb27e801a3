"""Releases over time on the tiny model, through the real pipeline: two releases and one rollback.

On a local Hub (localhub/, the real huggingface_hub client) and an ephemeral Prefect API:

1. release 1: the whole flow on recipes/tiny-llama-awq.yaml (quantize, the three vLLM boots, the gates;
   no release in production yet, so the regression gate is off) -> promoted;
2. release 2: the same recipe calibrated on another shuffle of the data (a new checkpoint), measured
   against release 1 by the regression gate (release 1's recorded figures: same conditions) ->
   promoted when it is no worse (the JSON says what happened either way);
3. the rollback flow: `production` back to the gated commit before the current one (release 1 when
   release 2 was promoted), with its event and card note;
then `quantize-serve releases REPO`, exactly as the command prints it.

Writes benchmarks/results/release_history.json: each step (decision, regression rows, seconds), the
rollback, and `history_table`: the command's output. Boots vLLM six times (three per release): about
15 minutes on a 2-core CPU.

Run:      .venv/bin/python benchmarks/release_history.py
Dry path: .venv/bin/python benchmarks/release_history.py --dry-run   (checks the steps' recipes and
          prints the plan; starts nothing, writes nothing)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from benchmarks.harness import ROOT, TINY_RECIPE as RECIPE  # noqa: E402
from localhub.client import hub_client_env  # noqa: E402
from localhub.server import start_local_hub  # noqa: E402
from quantize_serve.core.portable import write_json_result  # noqa: E402
from quantize_serve.core.settings import get_settings  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.release.rollback import RollbackRequest  # noqa: E402
from quantize_serve.report.run_report import RunReport, report_of  # noqa: E402
from quantize_serve.serving.host import servable_overrides  # noqa: E402

REPO = "quantize-serve/tiny-llama-releases"
TOKEN = "hf_ReleaseHistoryBenchmarkToken0123456789"  # the local Hub's write token (a throwaway value)
STEPS = (("release 1", {}), ("release 2", {"calibration.shuffle_seed": 7}))
OUT = ROOT / "benchmarks" / "results" / "release_history.json"


def step_overrides(extra: dict) -> dict:
    return {**servable_overrides()[0], "hub.repo_id": REPO, **extra}


def dry_run() -> int:
    """Every step's recipe checked as `quantize-serve validate` checks it; nothing started."""
    for name, extra in STEPS:
        overrides = step_overrides(extra)
        recipe = load_recipe(RECIPE, overrides)
        print(
            f"{name}: {RECIPE.relative_to(ROOT)} with {json.dumps(overrides)} -> {recipe.hub.repo_id}, "
            f"{recipe.hub.release_ref_kind} {recipe.hub.release_ref!r}, regression gate "
            f"{'on' if recipe.gates.regression.enabled else 'off'}"
        )
    print(
        f"rollback: {REPO} (the gated commit before the current one), then `quantize-serve releases {REPO}`"
    )
    print(f"would write {OUT.relative_to(ROOT)}")
    return 0


def release(name: str, extra: dict) -> dict:
    from flows.pipeline import quantize_serve

    overrides = step_overrides(extra)
    started = time.monotonic()
    state = quantize_serve(RECIPE.as_posix(), overrides, return_state=True)
    report = report_of(state.result(raise_on_failure=False))
    if not isinstance(report, RunReport):
        raise SystemExit(f"{name}: the flow failed before its report: {report}")
    rel = report.release
    return {
        "step": name,
        "overrides": overrides,
        "seconds": round(time.monotonic() - started, 1),
        "decision": [
            f"{c.check}: {'off' if c.off else 'pass' if c.passed else 'FAIL'}: {c.reason}"
            for c in report.decision.checks
        ],
        "release": rel.model_dump(include={"status", "ref", "commit_sha", "candidate_sha", "rejection_tag"})
        if rel
        else None,
        "regression": report.regression.model_dump(mode="json") if report.regression else None,
    }


def rollback() -> dict:
    from flows.rollback import rollback_release

    started = time.monotonic()
    state = rollback_release(
        RollbackRequest(repo_id=REPO, reason="benchmark: back to the previous release"), return_state=True
    )
    result = state.result(raise_on_failure=False)
    if isinstance(result, BaseException):
        return {"step": "rollback", "failed": str(result)}
    return {
        "step": "rollback",
        "seconds": round(time.monotonic() - started, 1),
        **result.model_dump(mode="json", include={"moved", "note_commit", "at"}),
        "plan": result.plan.model_dump(mode="json"),
    }


def releases_command(env: dict[str, str]) -> str:
    """`quantize-serve releases REPO`, as a user runs it (its own process)."""
    done = subprocess.run(
        [sys.executable, "-m", "quantize_serve.cli", "releases", REPO],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout.rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="check the steps and print the plan only")
    parser.add_argument(
        "--out", type=Path, default=OUT, help=f"result file (default {OUT.relative_to(ROOT)})"
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run()

    with tempfile.TemporaryDirectory(prefix="qs-release-history-") as tmp:
        root = Path(tmp)
        os.environ["QS_RUNS_DIR"] = str(root / "runs")
        os.environ["HF_TOKEN"] = TOKEN
        get_settings.cache_clear()
        with (
            start_local_hub(root / "hub", tokens=(TOKEN,)) as hub,
            hub_client_env(hub.endpoint, cache_dir=root / "hf-cache"),
        ):
            steps = [release(name, extra) for name, extra in STEPS]
            steps.append(rollback())
            table = releases_command(dict(os.environ))
    result = {
        "what": "two releases and one rollback of the tiny model through the real pipeline (local Hub, "
        "ephemeral Prefect API); history_table is `quantize-serve releases REPO` as printed",
        "repo": REPO,
        "recipe": str(RECIPE.relative_to(ROOT)),
        "steps": steps,
        "history_table": table,
    }
    write_json_result(args.out, result, roots=[ROOT])
    print(table)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
