"""The recipe: one typed description of a release, loaded and validated once, before heavy work.

A YAML file becomes a pydantic ``Recipe`` with ``extra="forbid"`` everywhere, so a misspelled key
fails at load time (llm-compressor's own recipes work the same way). Every rule that needs only the
recipe runs at load: rules inside one section in that section's validators, rules that span sections
in ONE model validator on ``Recipe`` (:func:`cross_section_problems`). The sections live beside this
module (``quantization``, ``gates``; the smaller ones here); loading and error translation in
``recipe.load``; checks that look at files (the model's ``config.json``, the calibration data) in
``recipe.inputs``: they read small files only and never load weights.

Relative paths in a recipe file are resolved against the recipe file's folder, so a recipe means
the same thing whatever the working directory is.
"""

from __future__ import annotations

import hashlib
import json
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    PositiveInt,
    field_validator,
    model_validator,
)

from quantize_serve.core.errors import RecipeError, RecipeErrors
from quantize_serve.recipe.alerts import AlertsSection
from quantize_serve.recipe.gates import GatesSection
from quantize_serve.recipe.quantization import QuantizationSection
from quantize_serve.recipe.section import (
    CANDIDATE_BRANCH,
    COMMIT_MESSAGE_FIELDS,
    GIT_REF_NAME,
    LONG_PROMPT_MARGIN,
    MAX_SEARCH_BOOTS,
    RECIPE_SOURCE,
    REJECTION_TAG_PREFIX,
    REPO_ID,
    RESERVED_VLLM_FLAGS,
    Section,
    looks_local,
)


class ModelSection(Section):
    """The base model: a local folder or a Hub repo id (pinned to a commit at run time)."""

    id: str = Field(description="Local folder (e.g. ../models/tiny-llama) or Hub repo id (org/name).")
    revision: str | None = Field(default=None, description="Hub branch, tag or commit sha.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="The dtype the base model is loaded in for quantization."
    )
    trust_remote_code: bool = Field(
        default=False, description="Run the model's own code from its repo (transformers' trust_remote_code)."
    )


class CalibrationSection(Section):
    """Calibration data: a Hub dataset id or local json/jsonl/csv/parquet/text file(s)."""

    dataset: str = Field(description="Hub dataset id, or a local file / list of files.")
    files: list[str] = Field(default_factory=list, description="More local files, same format.")
    subset: str | None = Field(default=None, description="Hub dataset configuration name.")
    split: str = Field(default="train", description="Dataset split to read.")
    revision: str | None = Field(
        default=None,
        description="Hub dataset branch, tag or commit sha (None = main). A run pins it to "
        "the commit sha it resolves to, loads exactly that commit, and the model card names the sha.",
    )
    text_field: str | None = Field(default=None, description="Column holding plain text.")
    messages_field: str | None = Field(
        default=None, description="Column holding chat messages, rendered with the chat template."
    )
    num_samples: PositiveInt = Field(default=256, description="Rows calibrated on.")
    max_seq_len: PositiveInt = Field(default=2048, description="Tokens a row is cut to.")
    shuffle_seed: int = Field(default=42, description="Seed of the shuffle that picks the rows.")
    batch_size: PositiveInt = Field(
        default=1,
        description="Calibration batch size (llm-compressor's). llm-compressor orders the samples by "
        "length and cuts each batch to its shortest sample: at 4, production-shaped chat data keeps 99.1% "
        "of its tokens and an 8B's AWQ calibrates 22% faster on an H200 (the llama3 recipe's choice).",
    )
    # llm-compressor's calibration pipeline: oneshot's arguments of the same names. Unset, they take the
    # value chosen by measurement for the method (quantize/run.py: calibration_pipeline).
    pipeline: Literal["independent", "sequential", "basic"] | None = Field(
        default=None,
        description="llm-compressor's calibration pipeline. independent (its default): one layer-by-layer "
        "pass per modifier (AWQ: the smoothing pass, then the quantizer's pass for the fp8 KV scales); "
        "sequential: every modifier in one layer-by-layer pass; basic: the whole model at once, every "
        "layer's calibration state held at the same time. Unset: sequential for awq, independent otherwise "
        "(benchmarks/results/release-time/quantize_speed.json; before, independent for every method).",
    )
    propagate_error: bool | None = Field(
        default=None,
        description="llm-compressor's propagate_error: feed each layer the previous layer's outputs after "
        "quantization (true, its default: a second forward pass per layer) or those seen while calibrating "
        "(false). Unset: false for awq, true otherwise (benchmarks/results/release-time/quantize_speed.json; "
        "before, true for every method).",
    )
    sequential_targets_per_subgraph: PositiveInt = Field(
        default=1,
        description="llm-compressor's sequential_targets_per_subgraph (its default 1): decoder layers "
        "calibrated together, fewer and larger steps for more device memory.",
    )
    beside_base: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="When the base model is scored (a first release; a known base's figures are reused), "
        "quantize while it is: the base boots first, its capacity is read, and calibration runs beside its "
        "accuracy run in the device memory the boot leaves. auto: on a GPU host, with the base served at "
        "serve.gpu_memory_utilization where that leaves calibration its memory with the model on the "
        "device, else at the highest lower utilization that does, its capacity row then derived at the "
        "recipe's (capacity/measure.py: at_utilization; the need sized by the calibration tokens counted "
        "with the base's tokenizer, AWQ's from its peak measured on an H200; the 8B's 300k tokens: the base "
        "at 0.48; quantize/device.py: beside_base). Measured on one H200: 483 s from the base's boot to "
        "both done, 594 s one after the other. always: also on a CPU host (the two share its cores, so it "
        "saves little there); never: quantize first, then the base. Where calibration runs, not what it "
        "computes: not in the checkpoint's key.",
    )

    @model_validator(mode="after")
    def _one_field(self) -> CalibrationSection:
        if (self.text_field is None) == (self.messages_field is None):
            raise ValueError(
                "set exactly one of calibration.text_field (plain text column) or "
                "calibration.messages_field (chat messages column)"
            )
        return self


class ProfileSearch(Section):
    """serve.search: find the largest max_num_seqs the stress profile survives, with real boots.

    See quantize_serve/serve_profile/search.py: it starts at the planner's recommendation, brackets
    (grows or shrinks) and bisects until the largest passing and the smallest failing value are at
    most ``step`` apart, or ``max_boots`` boots are spent.
    """

    enabled: bool = Field(default=True, description="false: no search (as when serve.search is absent).")
    max_boots: PositiveInt = Field(
        default=6, description=f"vLLM boots the max_num_seqs search may spend (at most {MAX_SEARCH_BOOTS})."
    )
    min_num_seqs: PositiveInt = Field(default=1, description="Lower end of the searched range.")
    max_num_seqs: PositiveInt | None = Field(
        default=None,
        description="Upper end of the searched range; default: the planner's max concurrency "
        "(KV tokens / max_model_len).",
    )
    step: PositiveInt = Field(
        default=4,
        description="Search resolution in sequences: the search stops when the largest "
        "passing and the smallest failing max_num_seqs are at most this far apart.",
    )
    max_model_len_search: bool = Field(
        default=False,
        description="Then search the largest max_model_len at the found max_num_seqs (its own "
        "max_boots; resolution: one KV block).",
    )

    @field_validator("max_boots")
    @classmethod
    def _max_boots(cls, value: int) -> int:
        if value > MAX_SEARCH_BOOTS:
            raise ValueError(
                f"is more than {MAX_SEARCH_BOOTS}: each boot is a vLLM start plus a stress test (minutes on "
                f"a GPU), and {MAX_SEARCH_BOOTS} already bisect any max_num_seqs range to one sequence. Fix: "
                f"use at most {MAX_SEARCH_BOOTS} (6 is the default), or narrow min_num_seqs..max_num_seqs"
            )
        return value

    @model_validator(mode="after")
    def _range(self) -> ProfileSearch:
        if self.max_num_seqs is not None and self.max_num_seqs < self.min_num_seqs:
            raise ValueError(
                f"serve.search.max_num_seqs ({self.max_num_seqs}) is below serve.search.min_num_seqs "
                f"({self.min_num_seqs}); raise max_num_seqs or lower min_num_seqs"
            )
        return self


class PrefixWorkload(Section):
    """serve.kv_offload.workload: the prefix-reuse traffic the host-memory tier is measured on (vLLM's own
    ``vllm bench serve --dataset-name prefix_repetition``): distinct random prefixes whose tokens together
    are ``working_set`` times the production boot's GPU KV cache, each sent ``prompts_per_prefix`` times with
    its own suffix, in shuffled order, so that a prefix's next request comes after the GPU evicted it."""

    working_set: float = Field(
        default=1.5,
        gt=1,
        le=16,
        description="Distinct prefix tokens as a multiple of the production boot's GPU KV cache tokens (more "
        "than 1: a working set the GPU cache holds whole shows nothing of the tier). Capped at what the tier "
        "holds.",
    )
    prefix_len: PositiveInt = Field(default=2048, description="Tokens of each shared prefix.")
    suffix_len: PositiveInt = Field(default=128, description="Tokens each request adds after its prefix.")
    output_len: PositiveInt = Field(default=32, description="Tokens each request generates.")
    prompts_per_prefix: int = Field(
        default=2, ge=2, le=64, description="Requests per prefix (2 or more: the first computes it)."
    )
    repeats: int = Field(
        default=2,
        ge=2,
        le=5,
        description="Times each side (tier on, tier off) runs the workload, each with fresh prefixes: the "
        "spread of one side's repeats is the run's noise, which a gain must exceed.",
    )
    concurrency: PositiveInt | None = Field(
        default=None, description="Requests in flight; default: serve.max_num_seqs."
    )


class KVOffloadSection(Section):
    """serve.kv_offload: a host-memory tier for vLLM's prefix cache (vLLM's native offloading:
    ``--kv-offloading-backend``, ``--kv-offloading-size``). KV blocks of prompts are kept in pinned host
    memory and loaded back on a prefix hit instead of being recomputed. It does not raise the number of
    sequences decoding at once (those need their blocks on the GPU): it helps traffic that reuses long
    prefixes the GPU cache no longer holds (multi-turn chat, agents, retrieval over the same documents). The
    run measures it on the production boot's settings, tier on against off, and ships it in the serving
    profile only where it helped (``ship``)."""

    backend: Literal["native", "lmcache"] = Field(
        default="native",
        description="vLLM's --kv-offloading-backend. native: vLLM's own CPU tier (sized here). lmcache: an "
        "LMCache server the host runs, sized by LMCache's own settings; needs the lmcache package.",
    )
    size_gib: float | None = Field(
        default=None,
        gt=0,
        description="Host memory the tier pins, in GiB, across all tensor-parallel ranks (vLLM's "
        "--kv-offloading-size). Set this or host_memory_share.",
    )
    host_memory_share: float | None = Field(
        default=None,
        gt=0,
        le=0.8,
        description="The tier's size as a share of the host memory available when the run validates "
        "(resolved to size_gib then; the report names the GiB).",
    )
    ship: Literal["if_it_helps", "always"] = Field(
        default="if_it_helps",
        description="if_it_helps: the serving profile carries the tier only where the measured workload's "
        "prefix hit rate rose and its TTFT fell or its throughput rose by more than the run's noise. always: "
        "ship it whatever the measurement says (the report still shows it).",
    )
    workload: PrefixWorkload = Field(default_factory=PrefixWorkload)

    @model_validator(mode="after")
    def _one_size(self) -> KVOffloadSection:
        if self.backend == "native" and (self.size_gib is None) == (self.host_memory_share is None):
            raise ValueError(
                "set exactly one of serve.kv_offload.size_gib (GiB of host memory) or "
                "serve.kv_offload.host_memory_share (a share of the host's available memory)"
            )
        if self.backend == "lmcache" and (self.size_gib is not None or self.host_memory_share is not None):
            raise ValueError(
                "serve.kv_offload.backend lmcache is sized by LMCache's own configuration: vLLM ignores "
                "--kv-offloading-size for it. Fix: remove size_gib / host_memory_share, or use backend native"
            )
        return self

    def vllm_config(self) -> dict[str, Any]:
        """The tier as vLLM's config keys (serving/server.py ServerSpec.vllm_config)."""
        size = {} if self.size_gib is None else {"kv-offloading-size": self.size_gib}
        return {"kv-offloading-backend": self.backend} | size

    @property
    def size_bytes(self) -> int | None:
        """The tier's pinned host bytes (size_gib, once resolved), as vLLM computes them."""
        return None if self.size_gib is None else int(self.size_gib * 2**30)


def flag_name(arg: str) -> str:
    """A command-line argument's flag as vLLM spells it: no value, dashes (``--max_num_seqs=8`` ->
    ``--max-num-seqs``)."""
    return arg.split("=", 1)[0].replace("_", "-")


# Serve settings that do not change what a boot measures (how the settings were found, a dry check, whether
# row (b) is booted; the host-memory tier, which only the production boot carries and its own measurement
# reads)
SERVE_FIELDS_NOT_MEASURED = frozenset({"search", "preflight", "sixteen_bit_kv_row", "kv_offload"})


# vLLM's max_num_batched_tokens for online serving where a recipe leaves it unset: what the planner assumes
# and the emitted profile states (serve_profile/search.py)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


class ServeSection(Section):
    """How vLLM serves the model: the production settings the gates prove."""

    max_model_len: PositiveInt = Field(default=4096, description="vLLM's --max-model-len.")
    gpu_memory_utilization: float = Field(
        default=0.90, gt=0, le=1, description="vLLM's --gpu-memory-utilization."
    )
    max_num_seqs: PositiveInt = Field(default=256, description="vLLM's --max-num-seqs.")
    max_num_batched_tokens: PositiveInt | None = Field(
        default=None,
        description="vLLM's --max-num-batched-tokens. Unset: "
        f"{DEFAULT_MAX_NUM_BATCHED_TOKENS}, vLLM's default for online serving.",
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="fp8", description="vLLM's --kv-cache-dtype of the production boot."
    )
    tensor_parallel_size: PositiveInt = Field(default=1, description="vLLM's --tensor-parallel-size.")
    enforce_eager: bool = Field(default=False, description="vLLM's --enforce-eager (no CUDA graphs).")
    dtype: Literal["auto", "bfloat16", "float16"] = Field(default="auto", description="vLLM's --dtype.")
    memory_budget: ByteSize | None = Field(
        default=None,
        description="The CPU host's budget: memory the compared configurations share on a host "
        "without a GPU; each boot gets KV cache = budget - its weights (--kv-cache-memory-bytes). "
        "On a GPU host it is not applied (the run says so): vLLM sizes each boot's KV cache from "
        "gpu_memory_utilization (validate/preflight.py for_this_host).",
    )
    extra_args: list[str] = Field(default_factory=list, description="More vLLM server flags.")
    search: ProfileSearch | None = Field(
        default=None,
        description="Search the largest stable max_num_seqs with real boots "
        "(quantize_serve/serve_profile/search.py); off when absent.",
    )
    sixteen_bit_kv_row: Literal["derive", "boot"] = Field(
        default="derive",
        description="Capacity row (b), the quantized model with a 16-bit KV cache, which tells the weights' "
        "share of the gain from the fp8 KV cache's. derive: from the production boot (c), the same "
        "checkpoint under the same budget, its KV cache bytes over a 16-bit token's by vLLM's own sizing "
        "(capacity/measure.py: with_sixteen_bit_kv; on one H200 the 8B's booted row held 272 tokens, "
        "0.03%, more); boot: one more vLLM boot measures it (about 100 s for an 8B on an H200). A row "
        "an earlier release of the same base and format booted is reused either way.",
    )
    kv_offload: KVOffloadSection | None = Field(
        default=None,
        description="A host-memory tier for the prefix cache (vLLM's native KV offloading), measured on a "
        "prefix-reuse workload and shipped only where it helps; off when absent. GPU hosts only.",
    )
    preflight: Literal["off", "measure"] = Field(
        default="off",
        description="measure: before the base model's weights are downloaded, boot its "
        "shape with dummy weights (config.json and tokenizer only) in the three configurations, and stop "
        "the run with vLLM's reason when the production configuration does not fit "
        "(quantize_serve/capacity/shape.py). `quantize-serve plan RECIPE --measure` does the same alone.",
    )

    @field_validator("extra_args")
    @classmethod
    def _no_reserved(cls, args: list[str]) -> list[str]:
        for arg in args:
            flag = flag_name(arg)
            if flag == "--revision":  # the published profile's revision is the release ref (capacity_spec)
                raise ValueError(
                    "--revision would replace the revision serve-profile.yaml and the model card name: "
                    "the release ref (hub.release_ref), which promotion moves to the gated commit, so "
                    "that production serves what the gates passed. Fix: remove --revision from "
                    "serve.extra_args; to serve another ref, set hub.release_ref"
                )
            if flag in RESERVED_VLLM_FLAGS:
                raise ValueError(
                    f"{flag} is set by its own serve.* field; remove it from extra_args and set "
                    f"serve.{flag[2:].replace('-', '_')} instead"
                )
        return args

    @model_validator(mode="after")
    def _batched_tokens(self) -> ServeSection:
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"serve.max_num_batched_tokens ({self.max_num_batched_tokens}) is below "
                f"serve.max_num_seqs ({self.max_num_seqs}); raise it or lower max_num_seqs"
            )
        return self

    def concurrency(self, requested: int | None) -> int:
        """Requests in flight for a gate or a measurement: ``requested``, else every sequence slot the
        server has (``max_num_seqs``: fewer leave it idle between batches, more only queue)."""
        return requested or self.max_num_seqs

    @property
    def extra_flags(self) -> set[str]:
        """The flags of extra_args as vLLM spells them (flag_name), without their values."""
        return {flag_name(arg) for arg in self.extra_args if arg.startswith("--")}

    @property
    def batched_tokens(self) -> int:
        """max_num_batched_tokens as vLLM serves it: the recipe's, else vLLM's default."""
        return self.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS


class HubSection(Section):
    """Where the release goes. The token never comes from here: environment or a Prefect Secret."""

    repo_id: str = Field(description="The Hub repo the release goes to (org/name).")
    private: bool = Field(default=True, description="Create the repo private (applied on creation only).")
    release_ref: str = Field(
        default="production", description="The tag or branch promotion points at the gated commit."
    )
    release_ref_kind: Literal["tag", "branch"] = Field(default="tag", description="What release_ref is.")
    commit_message: str = Field(
        default="quantize-serve: {method} {scheme} of {base_model}@{base_revision}",
        description="Template of the candidate's commit message; placeholders: "
        + ", ".join("{" + f + "}" for f in COMMIT_MESSAGE_FIELDS)
        + ".",
    )
    token_env: str = Field(
        default="HF_TOKEN", description="Environment variable holding the Hub token (never the token itself)."
    )
    token_secret_block: str | None = Field(
        default=None, description="Name of a Prefect Secret block holding the token."
    )

    @field_validator("repo_id")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        if not REPO_ID.match(value):
            raise ValueError("not a Hub repo id. Fix: write it as 'org/name', e.g. your-org/Llama-3-8B-AWQ")
        return value

    @field_validator("release_ref")
    @classmethod
    def _release_ref(cls, value: str) -> str:
        if value == CANDIDATE_BRANCH:
            raise ValueError(
                f"'{CANDIDATE_BRANCH}' is the branch every candidate is committed to (a tag of that name "
                "would make the revision ambiguous), so promotion could not point it at a gated commit. "
                "Fix: name the release ref something else, e.g. production"
            )
        if value.startswith(REJECTION_TAG_PREFIX):
            raise ValueError(
                f"names starting with '{REJECTION_TAG_PREFIX}' are the tags this pipeline writes on "
                f"rejected candidates ({REJECTION_TAG_PREFIX}<sha>). Fix: name the release ref something "
                "else, e.g. production"
            )
        if not GIT_REF_NAME.match(value):
            raise ValueError(
                "not a valid tag or branch name. Fix: use letters, digits, '.', '_', '-' and '/', e.g. "
                "production or release/v1"
            )
        return value

    @field_validator("commit_message")
    @classmethod
    def _commit_message(cls, value: str) -> str:
        allowed = ", ".join("{" + f + "}" for f in COMMIT_MESSAGE_FIELDS)
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
        except ValueError as exc:
            raise ValueError(
                f"is not a valid message template ({exc}). Fix: write literal braces as "
                f"{{{{ and }}}}; placeholders are {allowed}"
            ) from None
        unknown = [n or "{}" for n in names if n not in COMMIT_MESSAGE_FIELDS]
        if unknown:
            raise ValueError(f"unknown placeholder(s) {', '.join(unknown)}. Fix: use only {allowed}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_token(cls, data: Any) -> Any:
        if isinstance(data, dict) and "token" in data:
            raise RecipeError(
                RECIPE_SOURCE,
                "hub.token",
                "<hidden>",
                "a token never goes in a recipe file (recipes are committed and shared)",
                "remove hub.token and set the environment variable named by hub.token_env "
                "(default HF_TOKEN) or hub.token_secret_block",
            )
        return data


class Recipe(BaseModel):
    """A whole release: what to quantize, how to serve it, what it must pass, where it goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Lowercase, digits, dashes.")
    model: ModelSection
    calibration: CalibrationSection
    quantization: QuantizationSection
    serve: ServeSection = Field(default_factory=ServeSection)
    gates: GatesSection = Field(default_factory=GatesSection)
    hub: HubSection | None = None
    alerts: AlertsSection = Field(
        default_factory=AlertsSection,
        description="The Prometheus rules a promoted release carries, thresholds from its gates' figures "
        "(quantize_serve/release/alerts.py, docs/concepts/alerts.md).",
    )
    approval: Literal["auto", "manual"] = Field(
        default="auto",
        description="auto: promote when every gate passes; manual: the run pauses with a sign-off form "
        "in the Prefect UI before promotion.",
    )
    base_dir: str = Field(
        default=".", description="Folder that relative paths resolve against (the recipe's folder)."
    )

    def path(self, value: str) -> Path:
        """Resolve a recipe path against the recipe's folder."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    def is_local(self, value: str) -> bool:
        """Does a model-like recipe value (model.id, a checkpoint) name a local folder, not a Hub repo?"""
        return looks_local(value) or self.path(value).exists()

    @property
    def model_is_local(self) -> bool:
        return self.is_local(self.model.id)

    @property
    def calibration_is_local(self) -> bool:
        d = self.calibration.dataset
        return looks_local(d) or self.path(d).exists() or Path(d).suffix in DATA_FORMATS

    def calibration_files(self) -> list[Path]:
        return [self.path(f) for f in [self.calibration.dataset, *self.calibration.files]]

    @property
    def production_kv_cache_dtype(self) -> str:
        """The KV dtype of the production boot: serve.kv_cache_dtype, where ``auto`` means fp8 for a
        checkpoint that carries calibrated KV scales (quantization.kv_cache_scales: vLLM resolves it so)."""
        kv = self.serve.kv_cache_dtype
        return "fp8" if kv == "auto" and self.quantization.kv_cache_scales else kv

    def fingerprint(self) -> str:
        """sha256 of the canonical recipe (paths as written): identical inputs, identical key."""
        payload = self.model_dump(mode="json", exclude={"base_dir"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    @model_validator(mode="after")
    def _cross_section(self) -> Recipe:
        problems = cross_section_problems(self)
        if problems:
            raise RecipeErrors(problems)
        return self


def cross_section_problems(recipe: Recipe) -> list[RecipeError]:
    """Every rule that spans sections and needs only the recipe (no files), checked at load.

    Each of these used to surface only after quantizing and booting vLLM. One problem per rule,
    naming the field to change; the source is filled in by :func:`parse_recipe`.
    """
    problems: list[RecipeError] = []

    def problem(field: str, value: object, text: str, fix: str) -> None:
        problems.append(RecipeError(RECIPE_SOURCE, field, value, text, fix))

    serve, stress = recipe.serve, recipe.gates.stress
    search = serve.search if serve.search is not None and serve.search.enabled else None
    limit = serve.max_model_len
    # The stress test (quantize_serve/gates/stress.py plan_traffic) sends every prompt size with every
    # output size, and long requests of prompt + output = max_model_len - LONG_PROMPT_MARGIN.
    longest_in, longest_out = max(stress.prompt_tokens), max(stress.output_tokens)
    if longest_in + longest_out > limit:
        problem(
            "gates.stress.prompt_tokens",
            stress.prompt_tokens,
            f"the longest prompt ({longest_in}) plus the longest output ({longest_out}) is "
            f"{longest_in + longest_out} tokens, over serve.max_model_len ({limit}); the stress test "
            "would fail on requests the server must refuse",
            f"keep max(prompt_tokens) + max(output_tokens) <= {limit}: lower gates.stress.prompt_tokens "
            "or gates.stress.output_tokens, or raise serve.max_model_len",
        )
    elif limit - longest_out - LONG_PROMPT_MARGIN < 1:
        problem(
            "gates.stress.output_tokens",
            stress.output_tokens,
            f"leaves no room for the stress test's long prompts (max_model_len {limit} - longest output "
            f"{longest_out} - {LONG_PROMPT_MARGIN} tokens of margin)",
            f"keep max(output_tokens) below {limit - LONG_PROMPT_MARGIN}, or raise serve.max_model_len",
        )
    # vLLM runs at most max_num_seqs requests at once and queues the rest: a stress concurrency
    # above it would report a batch size the server never ran.
    if stress.concurrency is not None:
        if search is None and stress.concurrency > serve.max_num_seqs:
            problem(
                "gates.stress.concurrency",
                stress.concurrency,
                f"is above serve.max_num_seqs ({serve.max_num_seqs}); vLLM runs at most max_num_seqs "
                "requests at once and queues the rest, so the gate would not test the concurrency it "
                "reports",
                f"set gates.stress.concurrency to at most {serve.max_num_seqs} (or leave it unset: it "
                "defaults to serve.max_num_seqs), or raise serve.max_num_seqs",
            )
        elif (
            search is not None
            and search.max_num_seqs is not None
            and stress.concurrency > search.max_num_seqs
        ):
            problem(
                "gates.stress.concurrency",
                stress.concurrency,
                f"is above serve.search.max_num_seqs ({search.max_num_seqs}); no max_num_seqs the "
                "search can choose runs that many requests at once",
                "leave gates.stress.concurrency unset (the gates then run at the max_num_seqs the search "
                f"finds) or set it to at most {search.max_num_seqs}",
            )
    rule = recipe.quantization.choose
    if rule is not None:
        if rule.concurrency is not None and search is None and rule.concurrency > serve.max_num_seqs:
            problem(
                "quantization.choose.concurrency",
                rule.concurrency,
                f"is above serve.max_num_seqs ({serve.max_num_seqs}); vLLM would queue the extra requests "
                "and the throughput would be measured at a concurrency it never ran",
                f"set it to at most {serve.max_num_seqs}, or raise serve.max_num_seqs",
            )
        if rule.input_tokens and rule.output_tokens and rule.input_tokens + rule.output_tokens > limit:
            problem(
                "quantization.choose.input_tokens",
                rule.input_tokens,
                f"plus output_tokens ({rule.output_tokens}) is {rule.input_tokens + rule.output_tokens} "
                f"tokens, over serve.max_model_len ({limit}); the server would refuse every request",
                f"keep input_tokens + output_tokens <= {limit}",
            )
    return problems


DATA_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


# --------------------------------------------------------------------------------------------
# Checks that look at files (small reads only: config.json and the calibration data).
# --------------------------------------------------------------------------------------------
