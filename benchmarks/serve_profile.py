"""Serving-profile search vs an exhaustive grid, on the reference model (tiny AWQ recipe).

Setup, chosen so the limit lies inside the searched range: the recipe's production configuration
(AWQ W4A16 checkpoint, fp8 KV, max_model_len 512) under a KV budget of 41 blocks of 128 tokens
(serve.memory_budget = weights + 41 blocks); a stress profile of 256-token outputs (prompts of 16
or 64 tokens, no long prompts): each request ends at 272-320 tokens = 3 blocks, so about
(41 - 1 null block) / 3 = 13 requests fit at once and the 14th forces a preemption. The planner,
which sizes for full 512-token requests, recommends 9 (0.9 x 10.25). Searched range 4..32, step 4.

Each point is a real vLLM CPU boot plus the stress test at concurrency = max_num_seqs. The grid
boots every max_num_seqs in range(4, 33, 4). Targets: found within one step of the grid's best, in
at most half the grid's boots.

Writes benchmarks/results/serve_profile.json, serve-profile.yaml (the found profile, for `vllm serve
--config`) and serve_profile.png (the searched points, the grid's as hollow squares).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from benchmarks.harness import RESULTS, ROOT  # noqa: E402
from quantize_serve.capacity.measure import checkpoint_tensor_bytes, published_model  # noqa: E402
from quantize_serve.capacity.planner import ModelShape, kv_bytes_per_token  # noqa: E402
from quantize_serve.core.portable import write_json_result  # noqa: E402
from quantize_serve.quantize.run import quantize_model  # noqa: E402
from quantize_serve.recipe.load import parse_recipe  # noqa: E402
from quantize_serve.serve_profile import output as profile_output  # noqa: E402
from quantize_serve.serve_profile import search as ps  # noqa: E402
from quantize_serve.serve_profile.probe import vllm_probe  # noqa: E402
from quantize_serve.validate.preflight import resolve_base, validate_recipe  # noqa: E402

KV_BLOCKS = 41
BLOCK_TOKENS = 128  # vLLM CPU
SEARCH = {"min_num_seqs": 4, "max_num_seqs": 32, "step": 4, "max_boots": 6}
PROFILE = {
    "num_requests": 8,
    "max_duration_s": 300,
    "prompt_tokens": [16, 64],
    "output_tokens": [256],
    "long_prompt_share": 0.0,
    "overlong_prompts": 1,
    "max_preemptions": 0,
    "request_timeout_s": 180,
}
# The found settings' figures the JSON keeps, by their own names
FOUND_FIGURES = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "peak_kv_cache_usage",
    "preemptions",
    "output_throughput",
)


def search_recipe(recipe_path: Path, checkpoint_dir: Path):
    """The tiny recipe with the small KV budget, serve.search and the long-output stress profile."""
    import yaml

    data = yaml.safe_load(recipe_path.read_text())
    shape = ModelShape.from_config(checkpoint_dir)
    block_bytes = BLOCK_TOKENS * kv_bytes_per_token(shape, kv_cache_dtype=data["serve"]["kv_cache_dtype"])
    budget = checkpoint_tensor_bytes(checkpoint_dir) + KV_BLOCKS * block_bytes + 1000
    data["serve"] |= {"memory_budget": budget, "search": SEARCH}
    data["gates"]["stress"] = PROFILE
    return parse_recipe(data, source=f"{recipe_path} (+ profile search setup)", base_dir=recipe_path.parent)


def point_row(p, model: str) -> dict:
    return p.model_dump(exclude={"spec"}) | {"command": p.spec.serve_command(model) if p.spec else None}


def main(recipe_path: Path = ROOT / "recipes/tiny-llama-awq.yaml") -> None:
    started = time.monotonic()
    validated = validate_recipe(recipe_path)
    base = resolve_base(validated)
    ckpt = Path(
        quantize_model(
            validated.recipe,
            Path(base.local_dir),
            base_identity=base.identity,
            calibration_fingerprint=validated.calibration_fingerprint,
            log=lambda _: None,
        ).checkpoint_dir
    )
    recipe = search_recipe(recipe_path, ckpt)
    model = published_model(recipe, ckpt)  # what the committed profile and commands name
    work = ROOT / ".cache" / "bench-serve-profile" / time.strftime("%Y%m%d-%H%M%S")
    print(f"checkpoint {ckpt}; KV budget {KV_BLOCKS} blocks; logs under {work}", flush=True)

    t0 = time.monotonic()
    result = ps.search_serve_profile(
        recipe, ckpt, probe=vllm_probe(recipe, ckpt, tokenizer_dir=str(ckpt), output_dir=work / "search")
    )
    search_s = round(time.monotonic() - t0, 1)

    t0 = time.monotonic()
    probe = vllm_probe(recipe, ckpt, tokenizer_dir=str(ckpt), output_dir=work / "grid")
    grid_values = list(range(SEARCH["min_num_seqs"], SEARCH["max_num_seqs"] + 1, SEARCH["step"]))
    grid = [probe(ps.candidate_serve(recipe.serve, max_num_seqs=n)) for n in grid_values]
    grid_s = round(time.monotonic() - t0, 1)
    passing = [p.max_num_seqs for p in grid if p.passed]
    grid_best = max(passing) if passing else None
    first_fail = min((p.max_num_seqs for p in grid if not p.passed), default=None)

    found = result.found
    out: dict = {
        "recipe": recipe.name,
        "setup": {
            "kv_budget_blocks": KV_BLOCKS,
            "block_tokens": BLOCK_TOKENS,
            "memory_budget_bytes": int(recipe.serve.memory_budget),
            "serve": recipe.serve.model_dump(mode="json", exclude={"search"}),
            "search": SEARCH,
            "stress_profile": PROFILE,
            "why": "256-token outputs grow after admission; 3 blocks per request, 40 usable blocks "
            "(one is vLLM's null block): the limit (about 13) lies inside 4..32",
        },
        "found": None
        if found is None
        else {
            **{k: getattr(found, k) for k in FOUND_FIGURES},
            "profile": profile_output.profile_config(found.spec, model=model),
            "command": found.spec.serve_command(model),
        },
        "boots": result.boots,
        "stop_reason": result.stop_reason,
        "planner": {
            "recommended_max_num_seqs": result.planner_recommended,
            "max_concurrency": result.planner_max_concurrency,
            "start": result.planner_start,
        },
        "points": [point_row(p, model) for p in result.points],
        "search_wall_s": search_s,
        "grid_best": grid_best,
        "grid_boots": len(grid),
        "grid_monotonic": first_fail is None or grid_best is None or grid_best < first_fail,
        "grid_points": [point_row(p, model) for p in grid],
        "grid_wall_s": grid_s,
        "total_wall_s": round(time.monotonic() - started, 1),
        "targets": {
            "found_within_one_step_of_grid_best": found is not None
            and grid_best is not None
            and abs(found.max_num_seqs - grid_best) <= SEARCH["step"],
            "at_most_half_the_grid_boots": result.boots <= len(grid) / 2,
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    if found is not None:
        path, command = profile_output.write_serve_profile(found, RESULTS / "serve-profile.yaml", model=model)
        out["found"]["profile_path"] = str(path.relative_to(ROOT))
    profile_output.plot_search(result, RESULTS / "serve_profile.png", grid=grid)

    write_json_result(RESULTS / "serve_profile.json", out)
    print(result.markdown())
    print("grid:", [(p.max_num_seqs, p.passed, p.preemptions) for p in grid])
    print(
        f"found {found and found.max_num_seqs} in {result.boots} boots ({search_s} s); "
        f"grid best {grid_best} in {len(grid)} boots ({grid_s} s); targets {out['targets']}"
    )
    print(f"wrote {RESULTS / 'serve_profile.json'}")


if __name__ == "__main__":
    main()
