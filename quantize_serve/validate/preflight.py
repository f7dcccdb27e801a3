"""Validate stage and base-model resolution: everything checked before anything heavy runs.

``validate_recipe`` loads the recipe (pydantic), checks the calibration data (field, row count)
and, for a local base model, its config.json against the recipe. ``resolve_base`` pins the base
model: a local folder is identified by the sha256 of its files, a Hub repo id is resolved to a
commit sha and that exact revision is downloaded.

``check_recipe`` is the command line's ``quantize-serve validate``: the same recipe and input checks
without `datasets`, torch or Prefect (so it answers in well under a second), every model and
calibration problem reported together, and a note for each input it cannot check offline (a Hub
model's config.json unless asked to fetch it, a Hub dataset's columns and rows).

The recipe as this host applies it (``for_this_host``): ``serve.memory_budget`` is the CPU host's budget;
on a GPU host it is not applied (vLLM sizes each boot's KV cache from ``serve.gpu_memory_utilization``),
and the run says so (``ValidatedRecipe.not_applied``: the validate stage's line, the capacity section).

Two checks of the host, before anything heavy: ``check_serving_host`` (a CPU whose vLLM lacks the
kernels the run's quantized boots need, among them any quantized mixture of experts) and
``check_quantize_host`` (a GPU host whose pipeline environment's torch has no CUDA, so the quantization would
run on the CPU; `validate` and `run` say so too).

``serve.kv_offload`` (a host-memory tier for the prefix cache): a ``host_memory_share`` becomes ``size_gib``
on a GPU host (``resolve_host_tier``, from the memory available then; ``ValidatedRecipe.host_tier_sizing``
says how). What vLLM would refuse at its start is refused here, each with the field and the fix: on the
model or the recipe (``check_kv_offload``: an encoder-decoder, ``--enable-return-routed-experts``), and on
the host that serves (``check_host_tier``, from ``check_serving_host``: vLLM's CPU backend, a tier larger
than the host's available memory less a margin, ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, an
lmcache backend without the lmcache package).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from quantize_serve.capacity.host_tier import HostMemory, HostTierSizing
from quantize_serve.capacity.model_shape import ModelShape
from quantize_serve.capacity.planner import GiB
from quantize_serve.core.errors import HubNotFoundError, RecipeError, RecipeErrors
from quantize_serve.core.model_files import check_model_files, folder_digest, language_model
from quantize_serve.core.settings import get_settings
from quantize_serve.gates.accuracy.task_files import TASK_FILE_SUFFIXES
from quantize_serve.hub.client import resolve_token
from quantize_serve.hub.download import download_base, fetch_model_config, resolve_dataset_commit
from quantize_serve.quantize.calibration import calibration_fingerprint, peek_calibration, pin_calibration
from quantize_serve.quantize.device import quantize_device_gap
from quantize_serve.quantize.existing_checkpoint import check_checkpoint, checkpoint_scheme
from quantize_serve.recipe.inputs import check_model, check_model_config, read_model_config, show_path
from quantize_serve.recipe.load import apply_overrides, load_recipe, parse_recipe
from quantize_serve.recipe.model import Recipe
from quantize_serve.serving import gpu
from quantize_serve.serving.host import moe_serving_gap, serving_host_gap
from quantize_serve.serving.server import serving_env


class ValidatedRecipe(BaseModel):
    recipe: Recipe
    source: str
    recipe_sha256: str
    calibration_fingerprint: str
    overrides: dict[str, Any] = {}  # the run's parameters that changed the recipe file (dotted keys)
    # recipe fields this host does not apply (dotted key -> why): for_this_host
    not_applied: dict[str, str] = {}
    # serve.kv_offload.host_memory_share as this host resolved it to size_gib: resolve_host_tier
    host_tier_sizing: HostTierSizing | None = None

    def host_note(self) -> str | None:
        """One line naming what this host did not apply, or None."""
        return "; ".join(f"{k} not applied: {why}" for k, why in self.not_applied.items()) or None

    def host_tier_note(self) -> str | None:
        """One line saying how the host-memory tier's share became its size here, or None."""
        return self.host_tier_sizing.line() if self.host_tier_sizing else None


class BaseModelRef(BaseModel):
    """The exact base model a run used: where it is on disk and what identifies it."""

    local_dir: str
    repo_id: str | None = None
    revision: str | None = None
    sha: str
    # Its config.json, read once when the base is resolved and carried to every stage that needs it
    # (not written to report.json: the base is identified by its sha).
    config: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @property
    def identity(self) -> str:
        return f"{self.repo_id}@{self.sha}" if self.repo_id else f"local:{self.sha}"


def validate_recipe(
    recipe: Recipe | str | Path | dict, overrides: dict[str, Any] | None = None
) -> ValidatedRecipe:
    """The recipe, with ``overrides`` (dotted keys, recipe.apply_overrides) applied, validated, as this
    host applies it (:func:`for_this_host`; ``recipe_sha256`` is the recipe as written)."""
    overrides = overrides or {}
    if isinstance(recipe, (str, Path)):
        source = str(recipe)
        recipe = load_recipe(recipe, overrides)
    elif isinstance(recipe, dict):
        source = "<parameters>"
        recipe = parse_recipe(
            apply_overrides(recipe, overrides, source=source), source=source, base_dir=Path.cwd()
        )
    else:
        source = f"<recipe {recipe.name}>"
        if overrides:
            data = apply_overrides(recipe.model_dump(mode="json"), overrides, source=source)
            recipe = parse_recipe(data, source=source)
    if recipe.model_is_local:
        config = check_local_model(recipe, source=source)
        check_local_checkpoints(recipe, config, source=source)
        check_kv_offload(recipe, config, source=source)
    else:
        check_kv_offload(recipe, None, source=source)  # the model's side once resolve_base has its config
    recipe_sha256 = recipe.fingerprint()  # the recipe as written (and overridden), before the pin below
    if not recipe.calibration_is_local:
        recipe = pin_calibration_commit(recipe, source=source)
    device = gpu.usable_memory_bytes()
    recipe, sizing = resolve_host_tier(recipe, device)
    recipe, not_applied = for_this_host(recipe, device)
    return ValidatedRecipe(
        recipe=recipe,
        source=source,
        recipe_sha256=recipe_sha256,
        calibration_fingerprint=calibration_fingerprint(recipe, source=source),
        overrides=overrides,
        not_applied=not_applied,
        host_tier_sizing=sizing,
    )


def for_this_host(
    recipe: Recipe, device_memory_bytes: int | None, *, host_memory: HostMemory | None = None
) -> tuple[Recipe, dict[str, str]]:
    """The recipe as a host with ``device_memory_bytes`` of GPU memory (None: no GPU, vLLM serves on the
    CPU) applies it, and each field it does not apply (dotted key -> why). ``serve.memory_budget`` is the
    CPU host's budget for weights and KV cache: on a GPU host it is dropped, and vLLM sizes each boot's KV
    cache from serve.gpu_memory_utilization, as production does. A GPU host resolves
    serve.kv_offload.host_memory_share to size_gib (:func:`resolve_host_tier`, from ``host_memory``, else
    read now)."""
    recipe, _ = resolve_host_tier(recipe, device_memory_bytes, host_memory)
    budget = recipe.serve.memory_budget
    if device_memory_bytes is None or budget is None:
        return recipe, {}
    serve = recipe.serve.model_copy(update={"memory_budget": None})
    why = (
        f"{budget.human_readable(separator=' ')} is the CPU host's budget; on this GPU host "
        f"({device_memory_bytes / 2**30:.2f} GiB) vLLM sizes each boot's KV cache from "
        f"serve.gpu_memory_utilization ({recipe.serve.gpu_memory_utilization:.2f})"
    )
    return recipe.model_copy(update={"serve": serve}), {"serve.memory_budget": why}


def resolve_host_tier(
    recipe: Recipe, device_memory_bytes: int | None, host_memory: HostMemory | None = None
) -> tuple[Recipe, HostTierSizing | None]:
    """serve.kv_offload.host_memory_share as size_gib on a GPU host: that share of the host memory available
    now (``host_memory``, else read), rounded down to 0.1 GiB, and how (None where nothing was resolved: no
    tier, a size given, or no GPU, where vLLM's CPU backend cannot offload and check_host_tier says so)."""
    tier = recipe.serve.kv_offload
    if device_memory_bytes is None or tier is None or tier.host_memory_share is None:
        return recipe, None
    sizing = HostTierSizing.of(tier.host_memory_share, host_memory or HostMemory.read())
    sized = tier.model_copy(update={"size_gib": sizing.size_gib, "host_memory_share": None})
    return recipe.model_copy(update={"serve": recipe.serve.model_copy(update={"kv_offload": sized})}), sizing


def pin_calibration_commit(recipe: Recipe, *, source: str) -> Recipe:
    """A Hub calibration dataset pinned to the commit its revision points at now (as the base model
    is): every load of this run reads that commit, and the card names its sha. Offline it stays as
    written (the datasets cache decides)."""
    c = recipe.calibration
    hub = recipe.hub
    try:
        sha = resolve_dataset_commit(
            c.dataset,
            revision=c.revision,
            token=resolve_token(hub) if hub else None,
            token_env=hub.token_env if hub else "HF_TOKEN",
        )
    except HubNotFoundError as exc:
        field, value = (
            ("calibration.revision", c.revision) if c.revision else ("calibration.dataset", c.dataset)
        )
        raise RecipeError(
            source,
            field,
            value,
            f"the Hub cannot resolve it to a commit ({exc})",
            "give an existing dataset id (owner/name) and revision (branch, tag or full commit "
            "sha), and a token that can read it (HF_TOKEN or hub.token_env)",
        ) from None
    return pin_calibration(recipe, sha) if sha else recipe


def check_local_checkpoints(recipe: Recipe, base_config: dict[str, Any], *, source: str) -> None:
    """Existing checkpoints given as folders (``quantization.checkpoint``, a candidate's ``checkpoint``):
    each a quantized checkpoint of the base model (existing_checkpoint.check_checkpoint), before any
    download, quantization or boot. Hub checkpoints are checked when fetched (flows/formats.py)."""
    q = recipe.quantization
    named = [("quantization.checkpoint", q.checkpoint)] if q.checkpoint else []
    named += [
        (f"quantization.candidates[{i}].checkpoint", c.checkpoint)
        for i, c in enumerate(q.candidates)
        if c.checkpoint
    ]
    for field, value in named:
        if recipe.is_local(value):
            folder = recipe.path(value)
            if not folder.is_dir():
                raise RecipeError(
                    source,
                    field,
                    value,
                    f"no such folder ({show_path(folder)})",
                    "point it at a checkpoint folder (relative paths resolve against the recipe's "
                    "folder) or at a Hub repo id such as org/name",
                )
            check_checkpoint(folder, base_config, source=source, field=field, value=value)


def check_serving_host(recipe: Recipe, *, source: str, base_config: dict[str, Any] | None = None) -> None:
    """A run serves on this machine: with no GPU here, vLLM serves on this CPU, which must have the
    kernels the quantized boots need (quantize_serve/serving/host.py): every checkpoint the run
    serves (the method's, each candidate's) and the production KV cache, and for a mixture of experts
    (``base_config``: the base model's config.json, read here when not given) quantized experts at all.
    Checked before any heavy work; a host-memory tier too (:func:`check_host_tier`)."""
    check_host_tier(recipe, source=source)
    served = served_schemes(recipe)
    # Every checkpoint of an MoE is a quantized MoE: the first one served names the field.
    moe_gap = moe_serving_gap(served[0][1]) if served else None
    if moe_gap and base_is_moe(recipe, base_config):
        where, scheme = served[0]
        raise RecipeError(
            source,
            where,
            f"{scheme or 'a quantized'} mixture of experts ({recipe.model.id})",
            moe_gap,
            "run on a GPU host (the production path; vLLM's GPU kernels serve quantized experts, Marlin "
            "MoE for W4A16); a CPU serves this model only unquantized, so it has no quantized release to "
            "validate here. `quantize-serve validate` and `quantize-serve plan` work on any machine",
        )
    kv = production_kv_dtype(recipe)
    for where, scheme in served:
        gap = serving_host_gap(scheme or "W4A16", kv)
        if not gap:
            continue
        if scheme is None and not serving_host_gap(None, kv):  # only the Hub checkpoint's unknown scheme
            raise RecipeError(
                source,
                where,
                "a Hub checkpoint",
                f"its scheme is read only once it is downloaded, and {gap}",
                "download it and name its folder (its scheme is then "
                "checked here), or run on a GPU host or an x86 CPU with AVX-512",
            )
        raise RecipeError(
            source,
            "serve",
            f"vLLM on this machine's CPU ({scheme or where}, KV {kv})",
            gap,
            "run on a GPU host (the production path: `prefect deployment run quantize-serve/llama3`) "
            "or on an x86 CPU with AVX-512; on this CPU, quantize to what its vLLM serves "
            "(quantization.method smoothquant-gptq with scheme W8A8, or rtn with FP8_DYNAMIC) with "
            "serve.kv_cache_dtype auto and quantization.kv_cache_scales false, as `make demo` does "
            "here by itself; `quantize-serve validate` and `quantize-serve plan` work on any machine",
        )


# vLLM's own words where its CPU backend refuses a host-memory tier at the start (0.26 and 0.32:
# v1/kv_offload/cpu/spec.py)
CPU_OFFLOAD_REFUSAL = "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"
# serve.extra_args that make vLLM allocate through its cumem pool, where expandable segments are off: with
# one, vLLM accepts a KV connector under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
CUMEM_FLAGS = ("--enable-cumem-allocator", "--enable-sleep-mode")


def check_kv_offload(recipe: Recipe, config: dict[str, Any] | None, *, source: str) -> None:
    """A host-memory tier (serve.kv_offload) on a recipe and a model vLLM offloads: vLLM refuses any KV
    connector with ``--enable-return-routed-experts`` and for an encoder-decoder model (``config``: the base
    model's config.json; None: not known yet). Multi-latent attention is not refused (vLLM 0.26 offloads it,
    its latent copied on every TP rank)."""
    tier = recipe.serve.kv_offload
    if tier is None:
        return
    if "--enable-return-routed-experts" in recipe.serve.extra_flags:
        raise RecipeError(
            source,
            "serve.extra_args",
            "--enable-return-routed-experts",
            "vLLM refuses it with a host-memory tier ('--enable-return-routed-experts is incompatible with "
            "KV connectors (PD disaggregation, KV cache offload)')",
            "remove --enable-return-routed-experts from serve.extra_args, or remove serve.kv_offload",
        )
    if config is not None and (
        config.get("is_encoder_decoder") or language_model(config).get("is_encoder_decoder")
    ):
        raise RecipeError(
            source,
            "serve.kv_offload",
            f"{recipe.model.id} (is_encoder_decoder)",
            "vLLM offloads no encoder-decoder model's KV cache ('Encoder-decoder models are not currently "
            "supported with KV connectors')",
            "remove serve.kv_offload for this model",
        )


def check_host_tier(recipe: Recipe, *, source: str, host_memory: HostMemory | None = None) -> None:
    """The host that serves can hold serve.kv_offload's tier: a GPU (vLLM's CPU backend cannot offload), no
    ``expandable_segments:True`` in the serving environment's PYTORCH_CUDA_ALLOC_CONF (unless serve.extra_args
    turns vLLM's cumem allocator on), the lmcache package for backend lmcache, and for a native tier the host
    memory it pins at vLLM's start: at most what is available (``host_memory``, else read now) less
    HostMemory.margin_bytes."""
    tier = recipe.serve.kv_offload
    if tier is None:
        return
    if gpu.usable_memory_bytes() is None:
        raise RecipeError(
            source,
            "serve.kv_offload",
            f"backend {tier.backend}",
            f"vLLM's CPU backend cannot offload (vLLM: '{CPU_OFFLOAD_REFUSAL}'); its KV cache already lives "
            "in host memory",
            "remove serve.kv_offload for a CPU host, or run on a GPU host",
        )
    alloc = serving_env().get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" in alloc and not recipe.serve.extra_flags & set(CUMEM_FLAGS):
        raise RecipeError(
            source,
            "serve.kv_offload",
            f"PYTORCH_CUDA_ALLOC_CONF={alloc}",
            "vLLM refuses any KV connector, a host-memory tier included, when the serving environment's "
            "PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True (its KV cache could move under the tier)",
            "unset PYTORCH_CUDA_ALLOC_CONF (or drop expandable_segments:True from it) before the run, or add "
            "--enable-cumem-allocator to serve.extra_args",
        )
    if tier.backend == "lmcache":
        python = get_settings().serving_python
        if not _has_module(python, "lmcache"):
            raise RecipeError(
                source,
                "serve.kv_offload.backend",
                "lmcache",
                f"the serving environment ({python}) has no lmcache package: vLLM's LMCache connector "
                "imports it at its start",
                f"install it there (`{python} -m pip install lmcache`) and run an LMCache server beside "
                "vLLM, or use backend native",
            )
        return
    memory = host_memory or HostMemory.read()
    share = tier.host_memory_share
    size_gib = tier.size_gib if share is None else memory.share_gib(share)
    if size_gib is None or int(size_gib * 2**30) <= memory.room_bytes:
        return
    room = math.floor(memory.room_bytes / GiB * 10) / 10
    available, total = memory.available_bytes / GiB, memory.total_bytes / GiB
    fix = f"size_gib <= {room:.1f}, or host_memory_share (a share of the available memory, resolved when "
    fix += "the run validates)"
    if share is not None:
        fix = f"host_memory_share <= {room / available:.2f}, or size_gib <= {room:.1f}"
    raise RecipeError(
        source,
        "serve.kv_offload.size_gib" if share is None else "serve.kv_offload.host_memory_share",
        size_gib if share is None else share,
        ("" if share is None else f"{size_gib:.1f} GiB here: ")
        + f"this host has {available:.1f} GiB available ({total:.1f} GiB total); the tier pins all of it at "
        f"vLLM's start, and {memory.margin_bytes / GiB:.1f} GiB must stay free for the serving processes and "
        "the pipeline",
        fix if room >= 0.1 else "free host memory, run on a host with more, or remove serve.kv_offload",
    )


def _has_module(python: Path, name: str) -> bool:
    """Whether the interpreter ``python`` finds the module ``name`` (no import: its spec only)."""
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    try:
        return subprocess.run([str(python), "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def base_config(
    recipe: Recipe, *, token: str | None = None, cache_dir: Path | None = None
) -> dict[str, Any] | None:
    """The base model's config.json before a run resolves the base: the local folder's (None without one:
    check_local_model says so), or only that file of the Hub repo (fetch_model_config, one attempt; with
    ``token``, else the recipe's hub.token_env variable; into ``cache_dir``, else the client's cache)."""
    if recipe.model_is_local:
        folder = recipe.path(recipe.model.id)
        return read_model_config(folder) if (folder / "config.json").is_file() else None
    token_env = recipe.hub.token_env if recipe.hub else "HF_TOKEN"
    return fetch_model_config(
        recipe.model.id,
        revision=recipe.model.revision,
        token=token or os.environ.get(token_env) or None,
        token_env=token_env,
        cache_dir=cache_dir,
    )


def base_is_moe(recipe: Recipe, config: dict[str, Any] | None = None) -> bool:
    """Does the base model route to experts (capacity.model_shape decides, as the planner does)? Reads
    its config.json when not given (:func:`base_config`)."""
    config = config if config is not None else base_config(recipe)
    if config is None:
        return False  # no model there: check_local_model says so
    try:
        return ModelShape.from_config(config).is_moe
    except (RecipeError, RecipeErrors):
        return False  # a config the planner refuses: check_plannable says why


def served_schemes(recipe: Recipe) -> list[tuple[str, str | None]]:
    """(recipe field, scheme) of every quantized checkpoint a run of ``recipe`` serves: the method's
    scheme, each candidate's, an existing local checkpoint's (read from its config.json); None for a
    Hub checkpoint, whose scheme is known once downloaded."""
    q = recipe.quantization
    named = (
        [("quantization", q.method, q.scheme, q.checkpoint)]
        if not q.candidates
        else [
            (f"quantization.candidates.{i}", c.method, c.scheme or q.scheme, c.checkpoint)
            for i, c in enumerate(q.candidates)
        ]
    )
    out: list[tuple[str, str | None]] = []
    for where, method, scheme, checkpoint in named:
        if method or not checkpoint:
            out.append((where, scheme))
        elif not recipe.is_local(checkpoint):
            out.append((f"{where}.checkpoint", None))
        else:
            config = recipe.path(checkpoint) / "config.json"
            try:
                out.append(
                    (
                        f"{where}.checkpoint",
                        checkpoint_scheme(json.loads(config.read_text()).get("quantization_config") or {}),
                    )
                )
            except (OSError, ValueError):
                pass  # not a checkpoint the pipeline serves: check_local_checkpoints says why
    return out


def production_kv_dtype(recipe: Recipe) -> str:
    """The KV dtype of the production boot (Recipe.production_kv_cache_dtype)."""
    return recipe.production_kv_cache_dtype


def check_quantize_host(recipe: Recipe, *, source: str) -> None:
    """A run that quantizes on a host with an NVIDIA GPU quantizes on it: the pipeline environment's
    torch must be a CUDA build (quantize_serve/quantize/device.py). Reads no torch."""
    q = recipe.quantization
    if not (q.method or any(c.method for c in q.candidates)):
        return  # existing checkpoints only: nothing is quantized here
    gap = quantize_device_gap()
    if gap:
        raise RecipeError(
            source,
            "quantization",
            q.method or "candidates",
            gap,
            "run `make setup` on this host: it detects the GPU and installs the CUDA build of torch "
            "that the pinned vLLM uses (`QS_DEVICE=cuda make setup` where it does not detect it), "
            "or point QS_PIPELINE_PYTHON at an environment whose torch has CUDA",
        )


def check_local_model(recipe: Recipe, *, source: str) -> dict[str, Any]:
    """A local base model folder: its files (header reads only), then its config.json against the
    recipe. Returns the config."""
    model_dir = Path(show_path(recipe.path(recipe.model.id)))  # messages show it as a person would
    check_model_files(model_dir, source=source, value=recipe.model.id)  # first: config.json parses
    config = check_model(recipe, model_dir, source=source)
    check_plannable(config, config_source=show_path(model_dir / "config.json"))
    return config


def check_plannable(config: dict[str, Any], *, config_source: str) -> None:
    """The capacity stage plans every boot from config.json (capacity.model_shape). A model the planner
    cannot model (multi-latent attention, a sliding-window cache, an architecture it does not know)
    stops here, naming the config's field, before anything is quantized or booted."""
    ModelShape.from_config(config, source=config_source)


class RecipeCheck(BaseModel):
    """What ``quantize-serve validate`` checked for one recipe, and what it could not check."""

    recipe: Recipe
    source: str
    checked: list[str]
    not_checked: list[str]


def check_recipe(path: str | Path, *, remote: bool = False) -> RecipeCheck:
    """Every recipe and input check that needs no heavy import; all problems raised together.

    Local inputs are read (the model folder's files and config.json, the calibration files' columns
    and rows, accuracy task files). A Hub model's config.json is fetched only with ``remote`` (one
    small download); a Hub dataset is never loaded here. What was not checked is listed, so a
    passing offline check never claims more than it saw.
    """
    source = str(path)
    recipe = load_recipe(path)
    checked = ["recipe: every field and cross-section rule"]
    not_checked: list[str] = []
    errors: list[RecipeError] = []

    def collect(check: Any) -> Any:
        try:
            return check()
        except RecipeErrors as exc:
            errors.extend(exc.errors)
        except RecipeError as exc:
            errors.append(exc)
        return None

    config = None
    if recipe.model_is_local:
        config = collect(lambda: check_local_model(recipe, source=source))
        if config is not None:
            checked.append(f"model {show_path(recipe.path(recipe.model.id))}: files, config.json")
            before = len(errors)
            collect(lambda: check_local_checkpoints(recipe, config, source=source))
            q = recipe.quantization
            if len(errors) == before and (q.checkpoint or any(c.checkpoint for c in q.candidates)):
                checked.append("existing checkpoints: format, scheme, same base model (local folders)")
    elif remote:
        token_env = recipe.hub.token_env if recipe.hub else "HF_TOKEN"
        config = fetch_model_config(
            recipe.model.id,
            revision=recipe.model.revision,
            token=os.environ.get(token_env) or None,
            token_env=token_env,
        )
        before = len(errors)
        collect(lambda: check_model_config(recipe, config, source=source))
        collect(lambda: check_plannable(config, config_source=f"{recipe.model.id}/config.json"))
        if len(errors) == before:
            checked.append(f"model {recipe.model.id}: config.json (fetched from the Hub)")
    else:
        not_checked.append(
            f"model.id {recipe.model.id!r} is a Hub repo: its config.json (group size, max_model_len, "
            "tensor_parallel_size) is checked when a run resolves it, or now with --remote"
        )
    c = recipe.calibration
    if recipe.calibration_is_local:
        peeked = collect(lambda: peek_calibration(recipe, source=source))
        if peeked is not None:
            checked.append(f"calibration data: {peeked[1]} rows, field {c.text_field or c.messages_field!r}")
    else:
        not_checked.append(
            f"calibration.dataset {c.dataset!r} is a Hub dataset: its columns and row count are checked "
            "by the run's validate stage, which loads it"
        )
    for i, task in enumerate(recipe.gates.accuracy.tasks):
        if task.task.endswith(TASK_FILE_SUFFIXES) and not recipe.path(task.task).is_file():
            errors.append(
                RecipeError(
                    source,
                    f"gates.accuracy.tasks.{i}.task",
                    task.task,
                    f"no such task file ({show_path(recipe.path(task.task))})",
                    "give the path of an lm-eval task YAML relative to the recipe's folder, or an lm-eval "
                    "task name",
                )
            )
    collect(lambda: check_quantize_host(recipe, source=source))  # a GPU host quantizes on its GPU
    if recipe.serve.kv_offload is not None:
        before, here = len(errors), gpu.usable_memory_bytes() is not None
        collect(lambda: check_kv_offload(recipe, config, source=source))
        if here:  # a GPU host, likely the one that serves
            collect(lambda: check_host_tier(recipe, source=source))
        else:  # vLLM's CPU backend cannot offload; `run` refuses the tier on a CPU host (check_serving_host)
            not_checked.append(
                "serve.kv_offload: no GPU here (vLLM's CPU backend cannot offload): the host that serves is "
                "checked when the run starts (its GPU, host memory, PYTORCH_CUDA_ALLOC_CONF, lmcache)"
            )
        if len(errors) == before:
            checked.append(
                "serve.kv_offload: the recipe" + (", and this GPU host holds the tier" if here else "")
            )
    if errors:
        raise RecipeErrors(errors) if len(errors) > 1 else errors[0]
    return RecipeCheck(recipe=recipe, source=source, checked=checked, not_checked=not_checked)


def resolve_base(validated: ValidatedRecipe, *, cache_dir: Path | None = None) -> BaseModelRef:
    """Pin the base model. A Hub repo is downloaded (only what quantizing and serving read) into
    ``cache_dir``, by default the work cache's hub/ folder (``QS_WORK_DIR``), with the token from
    the recipe's hub section (``hub.token_env``, then ``hub.token_secret_block``); without a hub
    section, HF_TOKEN or a login on this machine. The token is read here, so it is never a
    parameter a caller (or Prefect) records."""
    recipe = validated.recipe
    if recipe.model_is_local:
        local = recipe.path(recipe.model.id)
        return BaseModelRef(local_dir=str(local), sha=folder_digest(local), config=read_model_config(local))
    resolved = download_base(recipe, cache_dir=cache_dir)
    check_model_files(Path(resolved.local_dir), source=validated.source, value=recipe.model.id)
    config = check_model(recipe, Path(resolved.local_dir), source=validated.source)
    check_plannable(config, config_source=f"{recipe.model.id}/config.json")
    check_kv_offload(recipe, config, source=validated.source)
    return BaseModelRef(
        local_dir=str(resolved.local_dir),
        repo_id=recipe.model.id,
        revision=recipe.model.revision,
        sha=resolved.sha,
        config=config,
    )


def model_shape_dir(recipe: Recipe) -> Path:
    """The base model's config.json and tokenizer without its weights (what a dummy-weights boot
    reads): the local folder, or only those files of the Hub repo."""
    if recipe.model_is_local:
        return recipe.path(recipe.model.id)
    return Path(download_base(recipe, weights=False).local_dir)
