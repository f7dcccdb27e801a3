"""Capacity of the three configurations on the reference model (tiny AWQ recipe), under the
recipe's one memory budget, with the planner's prediction beside each measured figure.

Writes benchmarks/results/capacity/capacity.json. Three real vLLM CPU boots through the project's
capacity stage. Targets: fp8_token_ratio within 2.00 +- 1%; planner error within 3%.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from benchmarks.evidence import measure_boot, write_json_result  # noqa: E402
from benchmarks.harness import ROOT, serving_choice  # noqa: E402
from quantize_serve.capacity.measure import (  # noqa: E402
    CapacityReport,
    boot_log_name,
    summarize_capacity,
)
from quantize_serve.recipe.model import Recipe  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.host import serving_host_gap  # noqa: E402
from quantize_serve.quantize.run import quantize_model  # noqa: E402
from quantize_serve.validate.preflight import resolve_base, validate_recipe  # noqa: E402


def run_capacity_stage(
    recipe: Recipe,
    base_dir: str | Path,
    checkpoint_dir: str | Path,
    *,
    log_dir: Path,
    device_memory_bytes: int | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> CapacityReport:
    """The capacity stage with a boot of its own per configuration (what the flow does while it
    shares those boots with the gates): the three boots in order, then the summary."""
    configs = []
    for boot in Boot:
        configs.append(
            measure_boot(
                recipe,
                boot,
                boot.model_dir(base_dir, checkpoint_dir),
                log_path=Path(log_dir) / boot_log_name(recipe, boot),
                log=log,
            )
        )
        log(f"capacity {boot}: {configs[-1]}")
    base_config = json.loads((Path(base_dir) / "config.json").read_text())
    return summarize_capacity(
        recipe,
        configs,
        base_config,
        device_memory_bytes=device_memory_bytes,
        fp8_kv_unavailable=serving_host_gap(None, "fp8"),
    )


def main(
    recipe_path: Path = ROOT / "recipes/tiny-llama-awq.yaml",
    out: Path = ROOT / "benchmarks/results/capacity/capacity.json",
) -> None:
    overrides, why = serving_choice("capacity.py", recipe_path, as_demo=True)  # what this host serves
    if why:
        print(why, flush=True)
    validated = validate_recipe(recipe_path, overrides)
    recipe = validated.recipe
    base = resolve_base(validated)
    ckpt = quantize_model(
        recipe,
        Path(base.local_dir),
        base_identity=base.identity,
        calibration_fingerprint=validated.calibration_fingerprint,
        log=lambda _: None,
    )
    with tempfile.TemporaryDirectory() as logs:
        report = run_capacity_stage(
            recipe,
            base.local_dir,
            ckpt.checkpoint_dir,
            log_dir=Path(logs),
            log=lambda line: print(line, flush=True),
        )
    result = {
        "recipe": recipe.name,
        "overrides": overrides,  # what this host serves (the demo's choice); empty: the recipe as it is
        "method": report.method,
        "budget_bytes": report.budget_bytes,
        "configs": [c.model_dump(mode="json") for c in report.configs],
        "fp8_token_ratio": report.fp8_token_ratio,
        "freed_weight_bytes": report.freed_weight_bytes,
        "gain_quantized": report.gain_quantized,
        "gain_fp8": report.gain_fp8,
        "planner": {p.name: p.model_dump(exclude={"name"}) for p in report.planner},
        "targets": {
            "fp8_token_ratio_within_1pct": abs(report.fp8_token_ratio - 2) <= 0.02,
            "planner_error_within_3pct": all(abs(p.error_pct) <= 3 for p in report.planner),
        },
    }

    write_json_result(out, result)
    print(report.markdown())
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:3]))  # [recipe [output]]: defaults above
