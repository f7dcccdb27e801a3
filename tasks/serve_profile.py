"""The serving profile: the published model name and `vllm serve` command, serve-profile.yaml written for the
boot the gates validated (its KV cache pinned), and the profile search (serve.search; never retried or cached:
it boots vLLM several times and measures live servers; the flow holds the `gpu` slot around it like any
boot)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect.logging import get_run_logger

from quantize_serve.capacity import measure as capacity
from quantize_serve.recipe.model import Recipe
from quantize_serve.serve_profile import output as profile_output
from quantize_serve.serve_profile import probe as profile_probe
from quantize_serve.serve_profile import pinned as serving_profile
from quantize_serve.serve_profile import search as profile_search
from quantize_serve.serving import gpu
from quantize_serve.serving.server import ServerSpec
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe
from tasks.run_log import run_log

PLOT_FILE = "serve-profile-search.png"


def published_model(validated: ValidatedRecipe, checkpoint_dir: str) -> str:
    """The model's name in what is published: the Hub repo id (see capacity.published_model)."""
    return capacity.published_model(validated.recipe, checkpoint_dir)


def published_serve_command(validated: ValidatedRecipe, checkpoint_dir: str) -> str:
    """The published `vllm serve <repo id> ...` of the production boot."""
    return capacity.published_serve_command(validated.recipe, checkpoint_dir)


@task(name="write-serving-profile")
def write_serving_profile(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    spec: ServerSpec,
    config: capacity.CapacityConfig,
    checkpoint_dir: str,
    run_dir: Path,
) -> serving_profile.ServingProfile:
    """serve-profile.yaml for the boot the gates validated, its KV cache pinned (serving_profile.py)."""
    base_config = base.config
    profile = serving_profile.write_serving_profile(
        spec,
        config,
        base_config,
        run_dir / profile_output.PROFILE_FILE,
        model=published_model(validated, checkpoint_dir),
        device_memory_bytes=gpu.usable_memory_bytes(),
    )
    get_run_logger().info("serving profile (KV cache pinned):\n%s", profile.markdown())
    return profile


@task(name="search-serve-profile", cache_policy=NO_CACHE)
def search_serve_profile(
    recipe: Recipe,
    checkpoint_dir: str,
    *,
    output_dir: Path,
    tokenizer_dir: str | None = None,
    model: str | None = None,
    device_memory_bytes: int | None = None,
) -> profile_search.ProfileSearchResult:
    """Find the largest stable max_num_seqs; write serve-profile.yaml and the search chart.

    ``model`` names the model in the profile (e.g. the Hub repo id); default: the checkpoint path.
    The result's ``profile_path``, ``serve_command`` and ``plot_path`` say where they went; when
    nothing passed there is no profile (``found`` is None) and the chart still shows why.
    """
    log = run_log()
    output_dir = Path(output_dir)
    probe = profile_probe.vllm_probe(
        recipe,
        Path(checkpoint_dir),
        tokenizer_dir=tokenizer_dir or checkpoint_dir,
        output_dir=output_dir / "profile-search",
        log=log,
    )
    result = profile_search.search_serve_profile(
        recipe,
        checkpoint_dir,
        probe=probe,
        device_memory_bytes=device_memory_bytes
        if device_memory_bytes is not None
        else gpu.usable_memory_bytes(),
        log=log,
    )
    update: dict = {"plot_path": str(profile_output.plot_search(result, output_dir / PLOT_FILE))}
    if result.found is not None:
        path, command = profile_output.write_serve_profile(
            result.found, output_dir / profile_output.PROFILE_FILE, model=model
        )
        update |= {"profile_path": str(path), "serve_command": command}
    return result.model_copy(update=update)


def with_found_profile(
    validated: ValidatedRecipe, result: profile_search.ProfileSearchResult
) -> ValidatedRecipe:
    """The run's recipe with the found serving settings: what capacity, gates and card then use.

    No passing setting raises (GateError): the release cannot promise any batch size.
    """
    serve = profile_search.found_serve(validated.recipe.serve, result)
    return validated.model_copy(update={"recipe": validated.recipe.model_copy(update={"serve": serve})})
