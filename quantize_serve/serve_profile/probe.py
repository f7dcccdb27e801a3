"""The profile search's real probe: one vLLM boot of the production configuration with a candidate's
serve settings, and one stress test against it, per candidate (see profile_search)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path

from quantize_serve.serving.spec import capacity_spec
from quantize_serve.core.errors import ServerBootError
from quantize_serve.gates.stress import run_stress_test
from quantize_serve.recipe.gates import StressGate
from quantize_serve.recipe.model import Recipe, ServeSection
from quantize_serve.serve_profile.search import Probe, SearchPoint
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import vllm_server


def search_stress_profile(profile: StressGate, serve: ServeSection) -> StressGate:
    """The recipe's stress profile at concurrency = the candidate max_num_seqs.

    num_requests is raised to the concurrency where it is lower, so the traffic's peak step (not
    only the bench) really runs max_num_seqs requests at once.
    """
    data = profile.model_dump()
    data.update(concurrency=serve.max_num_seqs, num_requests=max(profile.num_requests, serve.max_num_seqs))
    return StressGate.model_validate(data)


def vllm_probe(
    recipe: Recipe,
    checkpoint_dir: Path,
    *,
    tokenizer_dir: str,
    output_dir: Path,
    log: Callable[[str], None] = print,
) -> Probe:
    """The real probe: boot the production configuration with the candidate serve settings, run the
    stress profile against it, stop it. A boot that fails is a failed point (its reason is the
    boot error), since a setting vLLM refuses or runs out of memory on is not a stable one. Each boot
    names the model as the published profile does (capacity_spec ``as_published``: the repo id at the
    release ref): the found setting's compiled graphs are then the ones the production boot (c), with the
    same settings, reads again."""
    counter = itertools.count(1)

    def probe(serve: ServeSection) -> SearchPoint:
        i = next(counter)
        folder = Path(output_dir) / f"boot-{i:02d}-seqs{serve.max_num_seqs}-len{serve.max_model_len}"
        spec = capacity_spec(
            recipe.model_copy(update={"serve": serve}),
            Boot.PRODUCTION,
            Path(checkpoint_dir),
            as_published=True,
        )
        base = dict(
            max_num_seqs=serve.max_num_seqs,
            max_num_batched_tokens=serve.max_num_batched_tokens,
            max_model_len=serve.max_model_len,
            spec=spec,
            log_path=str(folder / "vllm.log"),
        )
        log(f"profile search: boot {i}: {spec.serve_command()}")
        t0 = time.monotonic()
        try:
            with vllm_server(spec, log_path=folder / "vllm.log") as server:
                boot_s = server.boot_seconds
                result = run_stress_test(
                    server,
                    search_stress_profile(recipe.gates.stress, serve),
                    serve,
                    tokenizer_dir=tokenizer_dir,
                    output_dir=folder / "stress",
                    log=log,
                )
        except ServerBootError as exc:
            point = SearchPoint(
                **base,
                passed=False,
                why=[f"boot failed: {str(exc).splitlines()[0]}"],
                seconds=round(time.monotonic() - t0, 1),
            )
            log(f"profile search: boot {i}: {point.summary()}")
            return point
        t = result.throughput
        point = SearchPoint(
            **base,
            passed=result.passed,
            why=list(result.failures),
            peak_kv_cache_usage=result.peak_kv_cache_usage,
            preemptions=result.preemptions,
            output_throughput=t.output_throughput if t else None,
            request_throughput=t.request_throughput if t else None,
            mean_tpot_ms=t.mean_tpot_ms if t else None,
            boot_seconds=boot_s,
            seconds=round(time.monotonic() - t0, 1),
        )
        log(f"profile search: boot {i}: {point.summary()}")
        return point

    return probe
