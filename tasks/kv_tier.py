"""The host-memory KV tier (serve.kv_offload) measured for the flows: the prefix-reuse workload sized to the
production boot (gates/prefix_reuse.py plan_prefix_workload, the tier's tokens by vLLM's block arithmetic:
capacity/host_tier.py), run on the boot with the tier and on the same settings without it, and the decision
whether the serving profile carries it (decide_offload)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from quantize_serve.capacity.host_tier import HostTier, plan_host_tier
from quantize_serve.capacity.measure import CapacityConfig
from quantize_serve.capacity.model_shape import ModelShape
from quantize_serve.core.errors import GateError
from quantize_serve.gates.prefix_reuse import (
    OffloadDecision,
    PrefixFigures,
    PrefixPlan,
    decide_offload,
    plan_prefix_workload,
    run_prefix_repeats,
)
from quantize_serve.serving.server import RunningServer
from quantize_serve.validate.preflight import ValidatedRecipe
from tasks.run_log import run_log

# The workload's seed: repeat i of either side sends the prompts of seed PREFIX_SEED + i (the same on both)
PREFIX_SEED = 1000


class TierSide(BaseModel):
    """One side's runs (tier on or off), or why it has none."""

    tier: bool
    runs: list[PrefixFigures] = []
    error: str | None = None


def tier_plan(
    validated: ValidatedRecipe, checkpoint_dir: str, capacity: CapacityConfig
) -> tuple[PrefixPlan, HostTier | None]:
    """The prefix-reuse workload of serve.kv_offload sized to the production boot's GPU KV cache, capped at
    what the tier holds; and the tier by vLLM's block arithmetic beside that cache (None: LMCache sizes its
    own)."""
    r = validated.recipe
    tier = r.serve.kv_offload
    assert tier is not None, "tier_plan: serve.kv_offload is unset"
    host = None
    if tier.backend == "native" and tier.size_bytes is not None:
        shape = ModelShape.from_config(Path(checkpoint_dir) / "config.json")
        dtype = capacity.kv_cache_dtype if capacity.kv_cache_dtype.startswith("fp8") else "auto"
        host = plan_host_tier(
            tier,
            shape,
            kv_cache_dtype=dtype,  # type: ignore[arg-type]  # fp8* or a 16-bit cache
            tensor_parallel_size=capacity.tensor_parallel_size,
            gpu_tokens=capacity.kv_cache_tokens,
            block_size=capacity.block_size,
        )
    plan = plan_prefix_workload(
        tier.workload,
        capacity.kv_cache_tokens,
        host.tokens if host else None,
        r.serve.concurrency(None),
        max_model_len=r.serve.max_model_len,
    )
    return plan, host


@task(name="prefix-reuse", cache_policy=NO_CACHE)
def measure_prefix_reuse(
    validated: ValidatedRecipe,
    server: RunningServer,
    plan: PrefixPlan,
    *,
    tier: bool,
    tokenizer_dir: str,
    output_dir: Path,
) -> TierSide:
    """serve.kv_offload.workload's repeats on a live boot (``tier``: whether it carries the tier); a run the
    server could not finish leaves the side without runs, and says why."""
    r = validated.recipe
    assert r.serve.kv_offload is not None
    side = "on" if tier else "off"
    try:
        runs = run_prefix_repeats(
            server,
            plan,
            r.serve.kv_offload.workload.repeats,
            tokenizer_dir=tokenizer_dir,
            output_dir=Path(output_dir) / f"tier-{side}",
            seed=PREFIX_SEED,
            timeout_s=r.gates.stress.max_duration_s,
        )
    except GateError as e:
        run_log()(f"prefix reuse with the tier {side}: {e}")
        return TierSide(tier=tier, error=str(e))
    return TierSide(tier=tier, runs=runs)


@task(name="decide-kv-tier", cache_policy=NO_CACHE)
def decide_kv_tier(
    validated: ValidatedRecipe, plan: PrefixPlan, on: TierSide, off: TierSide
) -> OffloadDecision:
    """Whether serve-profile.yaml carries the tier (gates/prefix_reuse.py decide_offload), a side that failed
    named in the reason."""
    tier = validated.recipe.serve.kv_offload
    assert tier is not None
    decision = decide_offload(on.runs, off.runs, tier.ship, plan=plan)
    failed = "; ".join(f"tier {'on' if s.tier else 'off'}: {s.error}" for s in (on, off) if s.error)
    if failed:
        decision = decision.model_copy(update={"why": f"{decision.why} ({failed})"})
    run_log()(f"host-memory KV tier: {decision.why}")
    return decision
