"""The recipe: one typed description of a release, loaded and validated once, before heavy work.

A YAML file becomes a pydantic ``Recipe`` with ``extra="forbid"`` everywhere, so a misspelled key
fails at load time (llm-compressor's own recipes work the same way). Rules that span sections live
in model validators. Checks that need to look at files (the model's ``config.json``, the
calibration data) are in :func:`check_inputs`; they read small files only and never load weights.

Relative paths in a recipe file are resolved against the recipe file's folder, so a recipe means
the same thing whatever the working directory is.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from quantize_serve.errors import RecipeError, RecipeErrors

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Flags the server wrapper owns; a recipe's extra_args must not fight over them.
RESERVED_VLLM_FLAGS = (
    "--model", "--host", "--port", "--served-model-name", "--max-model-len",
    "--gpu-memory-utilization", "--kv-cache-dtype", "--max-num-seqs", "--tensor-parallel-size",
    "--max-num-batched-tokens", "--kv-cache-memory-bytes", "--dtype", "--enforce-eager",
)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(Section):
    """The base model: a local folder or a Hub repo id (pinned to a commit at run time)."""

    id: str = Field(description="Local folder (e.g. ../models/tiny-llama) or Hub repo id (org/name).")
    revision: str | None = Field(default=None, description="Hub branch, tag or commit sha.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    trust_remote_code: bool = False


class CalibrationSection(Section):
    """Calibration data: a Hub dataset id or local json/jsonl/csv/parquet/text file(s)."""

    dataset: str = Field(description="Hub dataset id, or a local file / list of files.")
    files: list[str] = Field(default_factory=list, description="More local files, same format.")
    subset: str | None = Field(default=None, description="Hub dataset configuration name.")
    split: str = "train"
    text_field: str | None = Field(default=None, description="Column holding plain text.")
    messages_field: str | None = Field(
        default=None, description="Column holding chat messages, rendered with the chat template."
    )
    num_samples: PositiveInt = 256
    max_seq_len: PositiveInt = 2048
    shuffle_seed: int = 42
    batch_size: PositiveInt = Field(
        default=1,
        description="Calibration batch size (llm-compressor's; batches are truncated to their "
        "shortest sample, so keep it small unless samples have similar lengths).",
    )

    @model_validator(mode="after")
    def _one_field(self) -> CalibrationSection:
        if (self.text_field is None) == (self.messages_field is None):
            raise ValueError(
                "set exactly one of calibration.text_field (plain text column) or "
                "calibration.messages_field (chat messages column)"
            )
        return self


class QuantizationSection(Section):
    """Maps onto llm-compressor modifiers; ``llmcompressor_recipe`` takes a raw recipe instead."""

    method: Literal["awq", "gptq"]
    scheme: Literal["W4A16", "W4A16_ASYM"] = "W4A16"
    group_size: PositiveInt = 128
    targets: list[str] = Field(default_factory=lambda: ["Linear"])
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"])
    kv_cache_scales: bool = Field(
        default=False,
        description="Calibrate static fp8 KV-cache scales into the checkpoint (vLLM uses 1.0 without).",
    )
    dampening_frac: float = Field(default=0.01, gt=0, lt=1, description="GPTQ only.")
    llmcompressor_recipe: str | dict[str, Any] | list[Any] | None = Field(
        default=None,
        description="Escape hatch: a raw llm-compressor recipe (YAML text, a path, or a mapping) "
        "that runs instead of the one built from the fields above.",
    )

    @field_validator("group_size")
    @classmethod
    def _even_group(cls, value: int) -> int:
        if value % 2:
            raise ValueError("group_size must be even (vLLM's int4 kernels need it), e.g. 128")
        return value


class ProfileSearch(Section):
    """serve.search: find the largest max_num_seqs the stress profile survives, with real boots.

    See quantize_serve/profile_search.py: it starts at the planner's recommendation, brackets
    (grows or shrinks) and bisects until the largest passing and the smallest failing value are at
    most ``step`` apart, or ``max_boots`` boots are spent.
    """

    enabled: bool = True
    max_boots: PositiveInt = Field(default=6, description="vLLM boots the max_num_seqs search may spend.")
    min_num_seqs: PositiveInt = Field(default=1, description="Lower end of the searched range.")
    max_num_seqs: PositiveInt | None = Field(
        default=None,
        description="Upper end of the searched range; default: the planner's max concurrency "
        "(KV tokens / max_model_len).",
    )
    step: PositiveInt = Field(
        default=4, description="Search resolution in sequences: the search stops when the largest "
        "passing and the smallest failing max_num_seqs are at most this far apart.",
    )
    max_model_len_search: bool = Field(
        default=False,
        description="Then search the largest max_model_len at the found max_num_seqs (its own "
        "max_boots; resolution: one KV block).",
    )

    @model_validator(mode="after")
    def _range(self) -> ProfileSearch:
        if self.max_num_seqs is not None and self.max_num_seqs < self.min_num_seqs:
            raise ValueError(
                f"serve.search.max_num_seqs ({self.max_num_seqs}) is below serve.search.min_num_seqs "
                f"({self.min_num_seqs}); raise max_num_seqs or lower min_num_seqs"
            )
        return self


class ServeSection(Section):
    """How vLLM serves the model: the production settings the gates prove."""

    max_model_len: PositiveInt = 4096
    gpu_memory_utilization: float = Field(default=0.90, gt=0, le=1)
    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt | None = None
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "fp8"
    tensor_parallel_size: PositiveInt = 1
    enforce_eager: bool = False
    dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    memory_budget: ByteSize | None = Field(
        default=None,
        description="CPU runs: device memory the compared configurations share; each gets "
        "KV cache = budget - its weights (what a GPU does with gpu_memory_utilization).",
    )
    extra_args: list[str] = Field(default_factory=list, description="More vLLM server flags.")
    search: ProfileSearch | None = Field(
        default=None, description="Search the largest stable max_num_seqs with real boots "
        "(quantize_serve/profile_search.py); off when absent.",
    )

    @field_validator("extra_args")
    @classmethod
    def _no_reserved(cls, args: list[str]) -> list[str]:
        for arg in args:
            flag = arg.split("=", 1)[0].replace("_", "-")
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


class AccuracyTask(Section):
    task: str = Field(description="lm-eval task name, or a path to a task YAML.")
    num_fewshot: int = Field(default=0, ge=0)
    limit: PositiveInt | float | None = Field(default=None, description="Docs per task (int or fraction).")
    recovery: dict[str, Annotated[float, Field(gt=0, le=2)]] = Field(
        default_factory=dict, description="Per-metric recovery threshold overrides."
    )


class AccuracyGate(Section):
    tasks: list[AccuracyTask] = Field(default_factory=list)
    default_recovery: float = Field(default=0.95, gt=0, le=2)
    batch_size: PositiveInt = 8
    num_concurrent: PositiveInt = 4


class StressProfile(Section):
    """The batched traffic the release promises to survive."""

    concurrency: PositiveInt | None = Field(
        default=None, description="Target concurrency; defaults to serve.max_num_seqs."
    )
    num_requests: PositiveInt = 64
    max_duration_s: float = Field(default=600, gt=0)
    prompt_tokens: list[PositiveInt] = Field(default_factory=lambda: [32, 128, 512])
    output_tokens: list[PositiveInt] = Field(default_factory=lambda: [16, 64, 128])
    long_prompt_share: float = Field(default=0.1, ge=0, le=1)
    overlong_prompts: int = Field(default=2, ge=0)
    max_preemptions: int = Field(default=0, ge=0)
    request_timeout_s: float = Field(default=120, gt=0)


MIN_SOAK_SAMPLES = 5  # samples after warm-up that a memory trend is fitted to; fewer fit noise

# gates.soak bounds: (lowest, highest, why). Inclusive; the message names the field, value and range.
SOAK_BOUNDS: dict[str, tuple[float, float, str]] = {
    "duration_s": (10, 86_400, "a shorter soak cannot tell a leak from allocator noise; a longer one is "
                   "production monitoring, not a release gate"),
    "warmup_s": (0, 86_400, "the start left out of the trend while pools, caches and kernels settle"),
    "sample_interval_s": (0.2, 600, "each sample reads /health, /metrics and the process tree, so faster "
                          "sampling measures the sampler; slower leaves too few points to fit"),
    "concurrency": (1, 4_096, "requests kept in flight the whole time"),
    "max_memory_growth_mib_per_min": (0.1, 10_240, "below 0.1 MiB/min is allocator noise; above 10 GiB/min "
                                      "a leak kills the server before any trend is needed"),
    "max_preemptions_after_warmup": (0, 1_000_000, "a count of preemptions"),
    "request_timeout_s": (1, 3_600, "seconds one request may take"),
}


class SoakGate(Section):
    """gates.soak: sustained traffic for a long time against the production boot (off when absent).

    Catches the failure that comes hours into production: memory that keeps growing (RSS of the
    server's process tree; GPU memory through NVML on GPU hosts) and a scheduler that keeps
    preempting after warm-up. See quantize_serve/soak.py. Prompts come from the stress test's
    generator; their sizes default to gates.stress's.
    """

    duration_s: float = Field(default=3600, description="How long the sustained traffic runs.")
    warmup_s: float = Field(default=300, description="The start left out of the memory trend and the "
                            "preemption count (allocator pools, caches and kernels settle).")
    sample_interval_s: float = Field(default=10, description="Seconds between samples of /metrics, RSS "
                                     "and GPU memory.")
    concurrency: int | None = Field(default=None, description="Requests in flight the whole time; "
                                    "defaults to serve.max_num_seqs.")
    prompt_tokens: list[PositiveInt] | None = Field(default=None, min_length=1, description="Prompt "
                                                    "sizes drawn from; defaults to gates.stress.prompt_tokens.")
    output_tokens: list[PositiveInt] | None = Field(default=None, min_length=1, description="Output "
                                                    "sizes drawn from; defaults to gates.stress.output_tokens.")
    max_memory_growth_mib_per_min: float = Field(default=10, description="Largest allowed least-squares "
                                                 "slope of memory after warm-up (RSS, and GPU memory where "
                                                 "NVML sees it); 10 MiB/min is 0.6 GiB an hour.")
    max_preemptions_after_warmup: int = Field(default=0, description="Preemptions "
                                              "(vllm:num_preemptions_total) allowed after warm-up.")
    request_timeout_s: float = Field(default=120, description="Seconds one request may take.")

    @field_validator(*SOAK_BOUNDS)
    @classmethod
    def _in_bounds(cls, value: float | None, info: ValidationInfo) -> float | None:
        lo, hi, why = SOAK_BOUNDS[info.field_name]
        if value is not None and not lo <= value <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g} ({why}); set gates.soak.{info.field_name} "
                             "inside that range")
        return value

    @model_validator(mode="after")
    def _enough_samples(self) -> SoakGate:
        if self.warmup_s >= self.duration_s:
            raise ValueError(f"gates.soak.warmup_s ({self.warmup_s:g}) is not below gates.soak.duration_s "
                             f"({self.duration_s:g}), so nothing would be measured; lower warmup_s or raise "
                             "duration_s")
        samples = int((self.duration_s - self.warmup_s) / self.sample_interval_s)
        if samples < MIN_SOAK_SAMPLES:
            raise ValueError(f"gates.soak gives {samples} sample(s) after warm-up ((duration_s {self.duration_s:g}"
                             f" - warmup_s {self.warmup_s:g}) / sample_interval_s {self.sample_interval_s:g}); "
                             f"a memory trend needs at least {MIN_SOAK_SAMPLES}: raise duration_s or lower "
                             "warmup_s or sample_interval_s")
        return self


class GatesSection(Section):
    accuracy: AccuracyGate = Field(default_factory=AccuracyGate)
    stress: StressProfile = Field(default_factory=StressProfile)
    soak: SoakGate | None = Field(default=None, description="Sustained-traffic memory and preemption "
                                  "gate on the production boot (quantize_serve/soak.py); off when absent.")


class HubSection(Section):
    """Where the release goes. The token never comes from here: environment or a Prefect Secret."""

    repo_id: str
    private: bool = True
    release_ref: str = "production"
    release_ref_kind: Literal["tag", "branch"] = "tag"
    commit_message: str = "quantize-serve: {method} {scheme} of {base_model}@{base_revision}"
    token_env: str = "HF_TOKEN"
    token_secret_block: str | None = Field(
        default=None, description="Name of a Prefect Secret block holding the token."
    )

    @field_validator("repo_id")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        if not REPO_ID.match(value):
            raise ValueError("hub.repo_id must look like 'org/name'")
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_token(cls, data: Any) -> Any:
        if isinstance(data, dict) and "token" in data:
            raise ValueError(
                "a token never goes in a recipe file; remove hub.token and set the environment "
                "variable named by hub.token_env (default HF_TOKEN) or hub.token_secret_block"
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
    approval: Literal["auto", "manual"] = "auto"
    base_dir: str = Field(
        default=".", description="Folder that relative paths resolve against (the recipe's folder)."
    )

    def path(self, value: str) -> Path:
        """Resolve a recipe path against the recipe's folder."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    @property
    def model_is_local(self) -> bool:
        return looks_local(self.model.id) or self.path(self.model.id).exists()

    @property
    def calibration_is_local(self) -> bool:
        d = self.calibration.dataset
        return looks_local(d) or self.path(d).exists() or Path(d).suffix in DATA_FORMATS

    def calibration_files(self) -> list[Path]:
        return [self.path(f) for f in [self.calibration.dataset, *self.calibration.files]]

    def fingerprint(self) -> str:
        """sha256 of the canonical recipe (paths as written): identical inputs, identical key."""
        payload = self.model_dump(mode="json", exclude={"base_dir"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


DATA_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}

FIXES = {
    "extra_forbidden": "remove the key or check its spelling against the recipe reference in README.md",
    "literal_error": "use one of the allowed values",
    "missing": "add the field",
    "greater_than": "use a positive value",
    "greater_than_equal": "use a value in range",
    "less_than_equal": "use a value in range",
    "int_parsing": "use a whole number",
    "string_pattern_mismatch": "use lowercase letters, digits and dashes",
}


def looks_local(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or not REPO_ID.match(value)


def parse_recipe(data: Any, *, source: str = "<recipe>", base_dir: Path | None = None) -> Recipe:
    """Validate a mapping into a Recipe, translating pydantic's errors into ours."""
    if not isinstance(data, dict):
        raise RecipeError(source, "<top level>", type(data).__name__, "a recipe is a mapping",
                          "start the file with keys such as name:, model:, calibration:")
    if base_dir is not None:
        data = {**data, "base_dir": str(base_dir)}
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeErrors([_translate(source, err) for err in exc.errors()]) from None


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe file. Fails on the first read, before anything heavy."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(str(path), "<file>", str(path), "no such recipe file",
                          "pass the path of a YAML recipe, e.g. recipes/tiny-llama-awq.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(str(path), "<yaml>", str(exc).splitlines()[0], "not valid YAML",
                          "fix the YAML syntax at the line shown") from None
    return parse_recipe(data, source=str(path), base_dir=path.resolve().parent)


def _translate(source: str, err: dict[str, Any]) -> RecipeError:
    field = ".".join(str(p) for p in err["loc"]) or "<top level>"
    msg = err["msg"].removeprefix("Value error, ")
    fix = FIXES.get(err["type"], "see the message")
    if err["type"] == "literal_error":
        fix = f"use one of {msg.split('Input should be ', 1)[-1]}"
    if err["type"] == "value_error":
        fix = "see the message"
    value = err.get("input")
    if isinstance(value, dict):
        value = "{...}"
    return RecipeError(source, field, value, msg, fix)


# --------------------------------------------------------------------------------------------
# Checks that look at files (small reads only: config.json and the calibration data).
# --------------------------------------------------------------------------------------------


def read_model_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())


def check_model(recipe: Recipe, model_dir: Path, *, source: str) -> dict[str, Any]:
    """Check the recipe against the base model's config.json; return the config."""
    if not (model_dir / "config.json").is_file():
        raise RecipeError(source, "model.id", recipe.model.id,
                          f"no model folder with a config.json at {model_dir}",
                          "point model.id at a Hugging Face model folder (relative paths resolve "
                          "against the recipe's folder) or at a Hub repo id such as org/name")
    config = read_model_config(model_dir)
    errors: list[RecipeError] = []
    q = recipe.quantization
    hidden = int(config.get("hidden_size", 0))
    intermediate = int(config.get("intermediate_size", 0))
    heads = int(config.get("num_attention_heads", 1))
    head_dim = int(config.get("head_dim") or hidden // max(heads, 1))
    # in_features of the quantized linears: q/k/v/gate/up take hidden, o takes heads*head_dim,
    # down takes intermediate. Each must split into whole groups.
    dims = {"hidden_size": hidden, "intermediate_size": intermediate,
            "num_attention_heads*head_dim": heads * head_dim}
    bad = {k: v for k, v in dims.items() if v and v % q.group_size}
    if bad and q.llmcompressor_recipe is None:
        divisors = sorted({g for g in (32, 64, 128) if all(v % g == 0 for v in dims.values() if v)})
        errors.append(RecipeError(
            source, "quantization.group_size", q.group_size,
            f"does not divide the model's {', '.join(f'{k}={v}' for k, v in bad.items())}",
            f"use a group size that divides them: {divisors or 'none of 32/64/128 does'}"))
    max_pos = config.get("max_position_embeddings")
    if max_pos and recipe.serve.max_model_len > int(max_pos):
        errors.append(RecipeError(
            source, "serve.max_model_len", recipe.serve.max_model_len,
            f"exceeds the model's max_position_embeddings ({max_pos})",
            f"set serve.max_model_len to at most {max_pos}"))
    tp = recipe.serve.tensor_parallel_size
    if heads % tp:
        errors.append(RecipeError(
            source, "serve.tensor_parallel_size", tp,
            f"does not divide num_attention_heads ({heads})",
            "use a tensor_parallel_size that divides the number of attention heads"))
    if errors:
        raise RecipeErrors(errors) if len(errors) > 1 else errors[0]
    return config


def check_calibration_rows(recipe: Recipe, columns: list[str], num_rows: int, *, source: str) -> None:
    """The named field exists and there are enough rows (both numbers in the message)."""
    c = recipe.calibration
    field_name, field_key = (
        (c.text_field, "calibration.text_field") if c.text_field else (c.messages_field, "calibration.messages_field")
    )
    if field_name not in columns:
        raise RecipeError(source, field_key, field_name,
                          f"the calibration data {c.dataset!r} has no such field (it has: {', '.join(columns)})",
                          f"set {field_key} to one of: {', '.join(columns)}")
    if num_rows < c.num_samples:
        raise RecipeError(source, "calibration.num_samples", c.num_samples,
                          f"the calibration data {c.dataset!r} (split {c.split!r}) has only {num_rows} rows",
                          f"lower calibration.num_samples to at most {num_rows} or add data")
