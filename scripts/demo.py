"""The offline demo: the whole release on the tiny model, through a real Prefect server and worker.

Starts a Prefect server, the local Hub endpoint and a process worker; deploys prefect.yaml; runs
`prefect deployment run quantize-serve/tiny-awq --watch` and prints the run's log lines and state
changes as they arrive; prints where the report, the UI and the promoted Hub ref are; stops what it
started. The Prefect database stays in .demo/ so that `make ui` opens the UI on the finished runs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from scripts.local_stack import ROOT, local_stack

HOME = ROOT / ".demo"
DEMO_TOKEN = "hf_demo_local_endpoint_token"  # the local endpoint's own token, not a Hub secret
RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"  # what the tiny-awq deployment runs
# Where this CPU's vLLM serves neither W4A16 nor an fp8 KV cache (quantize_serve/serving/host.py),
# the deployment runs the same recipe as INT8 W8A8 with a 16-bit KV cache, under a name and Hub repo
# that say so; the run's parameters carry the change, so its report lists it.
W8A8_NAMES = {"name": "tiny-llama-w8a8", "hub.repo_id": "quantize-serve/tiny-llama-w8a8"}


def demo_overrides() -> tuple[dict, str | None]:
    """The recipe overrides the demo runs with on this machine, and the one line that says why (None:
    the recipe as it is)."""
    from quantize_serve.serving import gpu
    from quantize_serve.serving.host import servable_overrides

    if gpu.usable_memory_bytes():  # the run drops serve.memory_budget, the CPU host's budget, itself
        return {}, (
            f"demo: {gpu.describe_devices()}: the tiny recipe runs on the GPU, its KV "
            "cache sized by vLLM from gpu_memory_utilization (serve.memory_budget is for CPUs)"
        )
    overrides, why = servable_overrides()
    if not overrides:
        return {}, None
    return {**overrides, **W8A8_NAMES}, (
        f"demo: {why}; so the demo quantizes INT8 W8A8 (SmoothQuant + GPTQ) and serves it with a 16-bit KV "
        "cache"
    )


def latest_report(name: str = "tiny-llama-awq") -> Path | None:
    reports = sorted((ROOT / "runs").glob(f"{name}-*/report.json"), key=lambda p: p.stat().st_mtime)
    return reports[-1] if reports else None


def echo(line: str, width: int = 200) -> None:
    """One line of the watched run, cut to one terminal line."""
    print(line if len(line) <= width else line[: width - 3] + "...", flush=True)


def main() -> int:
    from quantize_serve.cli import render_error
    from quantize_serve.core.errors import RecipeError
    from quantize_serve.recipe.load import load_recipe
    from quantize_serve.validate.preflight import check_quantize_host, check_serving_host

    overrides, switched = demo_overrides()
    if switched:
        print(switched, flush=True)
    source = str(RECIPE.relative_to(ROOT))
    try:  # before any server starts: a host that cannot quantize or serve the recipe says so at once
        recipe = load_recipe(RECIPE, overrides)
        check_quantize_host(recipe, source=source)
        check_serving_host(recipe, source=source)
    except RecipeError as exc:
        print(f"demo: this machine cannot run the demo\n{render_error(exc)}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with local_stack(HOME, hub_token=DEMO_TOKEN) as stack:
        print(f"demo: Prefect API {stack.api_url}, local Hub {stack.hub_endpoint}", flush=True)
        print(
            "demo: prefect deployment run quantize-serve/tiny-awq --watch  (the run's logs as they come)",
            flush=True,
        )
        rc, output, run_id = stack.run_deployment(
            "tiny-awq", echo=echo, params={"overrides": json.dumps(overrides)} if overrides else None
        )
        if rc:
            print(output.split("\n--- worker ---\n", 1)[-1][-4000:])  # the worker's own output
        refs = ""
        report_path = latest_report(recipe.name)
        if report_path:
            report = json.loads(report_path.read_text())
            release = report.get("release") or {}
            if release.get("repo_id"):
                from huggingface_hub import HfApi

                api = HfApi(endpoint=stack.hub_endpoint, token=DEMO_TOKEN)
                tags = {t.name: t.target_commit for t in api.list_repo_refs(release["repo_id"]).tags}
                refs = f"{release['repo_id']} tags: {json.dumps(tags)}"
    wall = time.monotonic() - started
    print("\n=== quantize-serve demo ===")
    print(f"flow run:   {run_id} ({'Completed' if rc == 0 else 'FAILED'}) in {wall:.0f} s")
    if report_path:
        print(
            f"decision:   {'passed' if report['decision']['passed'] else 'failed'}; release: "
            f"{(report.get('release') or {}).get('status')}"
        )
        print(f"report:     {report_path.parent / 'report.md'} (and report.json, capacity.png)")
    print(f"Hub ref:    {refs or 'n/a'} (local endpoint, data in {HOME / 'hub'})")
    print(f"UI:         make ui   (opens the Prefect UI on this run's database, {HOME / 'prefect'})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
