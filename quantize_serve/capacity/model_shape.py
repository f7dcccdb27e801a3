"""What a model's ``config.json`` says about the tensors vLLM loads: the capacity planner's input.

:meth:`ModelShape.from_config` reads a Hugging Face config once and checks it. The planner models
full-attention decoders with Llama-style blocks (q/k/v/o projections, a gated MLP, RMSNorms) and their
mixtures of experts, the architectures in :data:`ARCHITECTURES`. A config it cannot model is refused
with a :class:`~quantize_serve.core.errors.RecipeError` naming the field, the value and the fix (the
command line prints it as one screen and exits 2), never planned as something it is not:

- multi-latent attention (DeepSeek's ``kv_lora_rank``): the KV cache holds a compressed latent, not
  ``kv_heads x head_dim`` per layer;
- sliding-window caches (Mistral 7B v0.1, Gemma 2's interleaved layers, ``use_sliding_window``): vLLM
  keeps only the window for those layers, so tokens per request and concurrency follow other rules;
- any other architecture, and a config missing a key the planner needs.

Mixtures of experts (``Qwen3MoeForCausalLM``, ``Qwen2MoeForCausalLM``, ``MixtralForCausalLM``): each
sparse layer holds ``num_experts`` gated MLPs of ``moe_intermediate_size`` (Mixtral: ``intermediate_size``),
a router (``gate``, hidden -> experts) and, where the config has ``shared_expert_intermediate_size``, a
shared expert with its one-output gate. Which layers are sparse follows transformers and vLLM: layer ``i``
is sparse when ``num_experts > 0``, ``i`` is not in ``mlp_only_layers`` and ``(i + 1) %
decoder_sparse_step == 0``; the others have a dense MLP of ``intermediate_size``.

Pure Python (no transformers, no torch): ``quantize-serve plan`` stays light. The unit tests check the
parameter counts against transformers' own models built on the meta device.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quantize_serve.core.errors import RecipeError, RecipeErrors, UnplannableShapeError
from quantize_serve.core.model_files import language_model
from quantize_serve.recipe.inputs import show_path

__all__ = ["ARCHITECTURES", "ModelShape", "Linear"]

Linear = tuple[str, int, int]  # (name, out_features, in_features)

_DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "float64": 8,
}


class Architecture(NamedTuple):
    """How one architecture lays out the tensors the planner counts."""

    model_type: str
    bias: Literal["attention_bias", "qkv"]  # q/k/v/o when the config's attention_bias says so; q/k/v always
    qk_norm: bool  # an RMSNorm of head_dim on q and on k in every layer (Qwen3)
    experts: Literal["", "num_experts", "num_local_experts"]  # the key that counts routed experts
    # num_key_value_heads when config.json leaves it out, as the transformers config class defaults it
    # (vLLM reads the config through it): None, the attention heads (Llama); else its default model's count.
    kv_heads_default: int | None = None


# What the planner models, by the ``architectures`` entry of config.json (``model_type`` when absent).
ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": Architecture("llama", "attention_bias", False, ""),
    "MistralForCausalLM": Architecture("mistral", "attention_bias", False, "", 8),
    "Qwen2ForCausalLM": Architecture("qwen2", "qkv", False, "", 32),
    "Qwen3ForCausalLM": Architecture("qwen3", "attention_bias", True, "", 32),
    "Qwen2MoeForCausalLM": Architecture("qwen2_moe", "qkv", False, "num_experts", 16),
    "Qwen3MoeForCausalLM": Architecture("qwen3_moe", "attention_bias", True, "num_experts", 4),
    "MixtralForCausalLM": Architecture("mixtral", "attention_bias", False, "num_local_experts", 8),
}
# The measured path a refusal names first: the project's own (capacity/shape.py), then vLLM's by hand.
_MEASURE_FIX = (
    "measure it instead: `quantize-serve plan RECIPE --measure` boots this shape in vLLM with "
    "random weights (nothing downloaded but config.json and the tokenizer) under the recipe's "
    "serve settings and reads vLLM's own KV figures; without a recipe, `vllm serve MODEL "
    "--load-format dummy` logs 'GPU KV cache size: N tokens'"
)


def _supported() -> str:
    return ", ".join(ARCHITECTURES)


class ModelShape(BaseModel):
    """The numbers of a decoder-only model that decide its memory.

    Dense layers: q/k/v/o attention projections, a gated MLP of ``intermediate_size``, two RMSNorms.
    Sparse (MoE) layers: the same attention, ``num_experts`` gated MLPs of ``moe_intermediate_size``, a
    16-bit router of ``num_experts`` outputs and, with ``shared_expert_intermediate_size``, a shared
    expert and its one-output gate. Then a final norm, token embeddings and an LM head (unless tied).
    """

    model_config = ConfigDict(frozen=True)

    architecture: str = "LlamaForCausalLM"
    num_layers: int = Field(gt=0, description="num_hidden_layers")
    num_heads: int = Field(gt=0, description="num_attention_heads")
    num_kv_heads: int = Field(
        gt=0, description="num_key_value_heads (GQA); if absent, transformers' default (Llama: = heads)"
    )
    head_dim: int = Field(gt=0, description="head_dim, or hidden_size // num_attention_heads")
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(ge=0, description="the dense MLP's; 0 when every layer is sparse")
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = Field(gt=0)
    dtype: str = "bfloat16"
    attention_bias: bool = Field(False, description="bias on q, k, v and o (Llama's attention_bias)")
    qkv_bias: bool = Field(False, description="bias on q, k and v only (Qwen2)")
    mlp_bias: bool = False
    qk_norm: bool = Field(False, description="RMSNorm of head_dim on q and k (Qwen3)")
    num_experts: int = Field(0, ge=0, description="routed experts per sparse layer; 0: dense")
    num_experts_per_tok: int = Field(0, ge=0)
    moe_intermediate_size: int = Field(0, ge=0, description="each routed expert's MLP width")
    num_moe_layers: int = Field(0, ge=0, description="how many layers are sparse")
    shared_expert_intermediate_size: int = Field(0, ge=0, description="0: no shared expert")
    assumed: tuple[str, ...] = Field(
        (),
        description="what config.json left out and the plan assumed, in "
        "words: every plan of the shape carries them as notes",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelShape:
        if self.num_moe_layers > self.num_layers:
            raise ValueError(f"num_moe_layers {self.num_moe_layers} exceeds num_layers {self.num_layers}")
        if self.num_moe_layers and not (
            self.num_experts and self.moe_intermediate_size and self.num_experts_per_tok
        ):
            raise ValueError("sparse layers need num_experts, num_experts_per_tok and moe_intermediate_size")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok {self.num_experts_per_tok} exceeds num_experts {self.num_experts}"
            )
        if self.num_dense_layers and not self.intermediate_size:
            raise ValueError(f"{self.num_dense_layers} dense layers need an intermediate_size")
        return self

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the checkpoint's dtype (2 for bf16/fp16)."""
        return _DTYPE_BYTES.get(self.dtype.removeprefix("torch."), 2)

    @property
    def is_moe(self) -> bool:
        return self.num_moe_layers > 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @classmethod
    def from_config(cls, config: str | Path | Mapping[str, Any], *, source: str | None = None) -> ModelShape:
        """Build a shape from a HF ``config.json`` (a path to the file, to the model folder holding it,
        or the already-parsed dict), or raise :class:`RecipeError` naming what it cannot model.

        Multimodal configs that nest the language model under ``text_config`` are read from there.
        ``torch_dtype`` (transformers 4) and ``dtype`` (transformers 5) are both accepted. ``source``
        names the config in messages (default: the path, or ``config.json``).
        """
        if isinstance(config, (str, Path)):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            source = source or show_path(path)
            data: Mapping[str, Any] = json.loads(path.read_text())
        else:
            data = config
        return _read(language_model(data), source or "config.json")

    # --- the Linear layers (what GPTQModifier(targets="Linear") quantizes) -------------------------

    def attention_linears(self) -> list[Linear]:
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        h = self.hidden_size
        return [("q_proj", q_out, h), ("k_proj", kv_out, h), ("v_proj", kv_out, h), ("o_proj", h, q_out)]

    def mlp_linears(self, intermediate: int) -> list[Linear]:
        """A gated MLP (the dense one, one routed expert, or the shared expert)."""
        h = self.hidden_size
        return [("gate_proj", intermediate, h), ("up_proj", intermediate, h), ("down_proj", h, intermediate)]

    def layer_linears(self) -> list[Linear]:
        """``(name, out_features, in_features)`` of the Linear layers of one dense block."""
        return self.attention_linears() + self.mlp_linears(self.intermediate_size)

    def expert_linears(self) -> list[Linear]:
        """One routed expert's Linears (Mixtral calls them w1, w3, w2)."""
        return self.mlp_linears(self.moe_intermediate_size)

    def shared_expert_linears(self) -> list[Linear]:
        width = self.shared_expert_intermediate_size
        return self.mlp_linears(width) if width else []

    def router_elements(self) -> int:
        """Per sparse layer: the router (hidden -> experts) and the shared expert's gate (hidden -> 1).
        Both stay 16-bit: llm-compressor's MoE recipes ignore them and vLLM builds them unquantized."""
        shared_gate = self.hidden_size if self.shared_expert_intermediate_size else 0
        return self.num_experts * self.hidden_size + shared_gate

    # --- parameter counts ------------------------------------------------------------------------

    def num_parameters(self) -> int:
        """Total parameter count, tied embeddings counted once, every expert counted."""
        return self._count(experts=self.num_experts)

    def num_active_parameters(self) -> int:
        """Parameters one token passes through: every dense tensor, the router, the shared expert and
        ``num_experts_per_tok`` routed experts per sparse layer (embeddings and LM head included, as
        the published "3.3B activated" of Qwen3-30B-A3B counts them). Equals the total for a dense model."""
        return self._count(experts=self.num_experts_per_tok)

    def _count(self, *, experts: int) -> int:
        per_layer = (
            _elements(self.attention_linears())
            + self.norm_elements_per_layer()
            + self.bias_elements_per_layer()
        )
        dense_mlp = _elements(self.mlp_linears(self.intermediate_size)) + self.mlp_bias_elements()
        sparse_mlp = (
            experts * _elements(self.expert_linears())
            + _elements(self.shared_expert_linears())
            + self.router_elements()
        )
        embed = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embed
        return (
            self.num_layers * per_layer
            + self.num_dense_layers * dense_mlp
            + self.num_moe_layers * sparse_mlp
            + self.hidden_size
            + embed
            + lm_head
        )

    def norm_elements_per_layer(self) -> int:
        """input_layernorm + post_attention_layernorm, and q_norm + k_norm where the model has them."""
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)

    def bias_elements_per_layer(self) -> int:
        """Attention biases of one layer (q/k/v/o with attention_bias; q/k/v only with qkv_bias)."""
        biased = (
            ("q_proj", "k_proj", "v_proj", "o_proj")
            if self.attention_bias
            else (("q_proj", "k_proj", "v_proj") if self.qkv_bias else ())
        )
        return sum(out for name, out, _ in self.attention_linears() if name in biased)

    def mlp_bias_elements(self) -> int:
        """Biases of one dense MLP (Llama's mlp_bias)."""
        return sum(out for _, out, _ in self.mlp_linears(self.intermediate_size)) if self.mlp_bias else 0


def _elements(linears: list[Linear]) -> int:
    return sum(out_f * in_f for _, out_f, in_f in linears)


# --- reading and refusing -----------------------------------------------------------------------


def _architecture(data: Mapping[str, Any], source: str) -> tuple[str, Architecture]:
    names = data.get("architectures")
    if isinstance(names, list) and names:
        name = str(names[0])
        if name in ARCHITECTURES:
            return name, ARCHITECTURES[name]
        raise UnplannableShapeError(
            source,
            "architectures",
            names,
            "the capacity planner has no model of this architecture's memory",
            f"{_MEASURE_FIX}; the planner models {_supported()}",
        )
    model_type = data.get("model_type")
    for name, arch in ARCHITECTURES.items():
        if arch.model_type == model_type:
            return name, arch
    raise RecipeError(
        source,
        "model_type" if model_type else "architectures",
        model_type or names,
        "names no architecture the capacity planner models",
        f"use the model's own config.json (its architectures list names the model class); "
        f"the planner models {_supported()}",
    )


def _unmodelled_attention(data: Mapping[str, Any], source: str) -> UnplannableShapeError | None:
    """Multi-latent attention or a sliding-window cache: the KV cache is not kv_heads x head_dim per
    token per layer, so any plan would be wrong."""
    if data.get("kv_lora_rank"):
        return UnplannableShapeError(
            source,
            "kv_lora_rank",
            data["kv_lora_rank"],
            "multi-latent attention: the KV cache holds a compressed latent per token, not "
            "num_key_value_heads x head_dim, and the capacity planner has no model of it",
            _MEASURE_FIX,
        )
    layer_types = data.get("layer_types")
    if isinstance(layer_types, list):
        other = sorted({str(t) for t in layer_types} - {"full_attention"})
        if other:
            return UnplannableShapeError(
                source,
                "layer_types",
                other,
                "layers other than full attention keep a different KV cache (a sliding window holds only its "
                "last tokens), which the capacity planner does not model",
                _MEASURE_FIX,
            )
    window = data.get("sliding_window")
    if not window:
        return None
    if "use_sliding_window" in data:  # Qwen2 and its kin: the window is off unless this says so
        if not data["use_sliding_window"]:
            return None
        return UnplannableShapeError(
            source,
            "use_sliding_window",
            data["use_sliding_window"],
            f"layers from max_window_layers ({data.get('max_window_layers')}) on attend through a sliding "
            f"window of {window} tokens, a KV cache the capacity planner does not model",
            _MEASURE_FIX,
        )
    names = data.get("architectures")
    model = names[0] if isinstance(names, list) and names else data.get("model_type", "the model")
    return UnplannableShapeError(
        source,
        "sliding_window",
        window,
        f"{model} attends through a sliding window of {window} tokens (in every layer, or interleaved with "
        "full attention): vLLM keeps only the window for those layers, a KV cache the capacity planner does "
        "not model",
        _MEASURE_FIX,
    )


class _Reader:
    """Reads whole numbers from the config, collecting a RecipeError per missing or bad key."""

    def __init__(self, data: Mapping[str, Any], source: str, arch: str) -> None:
        self.data, self.source, self.arch = data, source, arch
        self.errors: list[RecipeError] = []

    def int(self, key: str, *, default: int | None = None, minimum: int = 1, why: str) -> int:
        value = self.data.get(key)
        if value is None:
            if default is not None:
                return default
            self.errors.append(
                RecipeError(
                    self.source,
                    key,
                    None,
                    f"is missing, and the capacity planner needs it for {why} ({self.arch})",
                    f"add the model's {key} to config.json (a config.json saved by transformers has every "
                    "key)",
                )
            )
            return max(minimum, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.errors.append(
                RecipeError(
                    self.source,
                    key,
                    value,
                    f"is not a whole number >= {minimum} ({why})",
                    f"set {key} to the model's value, a whole number >= {minimum}",
                )
            )
            return max(minimum, 1)
        return value


def _read(data: Mapping[str, Any], source: str) -> ModelShape:
    if (refused := _unmodelled_attention(data, source)) is not None:
        raise refused  # first: the reason an architecture is out of reach says more than its name
    name, arch = _architecture(data, source)
    r = _Reader(data, source, name)
    layers = r.int("num_hidden_layers", why="the number of layers")
    heads = r.int("num_attention_heads", why="the attention projections")
    hidden = r.int("hidden_size", why="every weight matrix")
    head_dim = r.int(
        "head_dim", default=hidden // max(heads, 1), why="the attention projections and the KV cache"
    )
    kv_heads = r.int("num_key_value_heads", default=arch.kv_heads_default or heads, why="the KV cache")
    assumed = [] if "num_key_value_heads" in data else [_kv_heads_assumed(name, arch, heads, kv_heads)]
    vocab = r.int("vocab_size", why="the embeddings and the LM head")
    max_pos = r.int("max_position_embeddings", default=2048, why="the longest request")
    experts, per_token, expert_size, moe_layers, shared = 0, 0, 0, 0, 0
    if arch.experts:
        # transformers 5 saves Qwen MoE configs with num_local_experts (its attribute_map's name for
        # num_experts); the Hub's configs, written by transformers 4, say num_experts.
        key = (
            "num_local_experts" if arch.experts not in data and "num_local_experts" in data else arch.experts
        )
        experts = r.int(key, default=0, minimum=0, why="the routed experts")
    if experts:
        per_token = r.int("num_experts_per_tok", why="the experts each token passes through")
        if per_token > experts:
            r.errors.append(
                RecipeError(
                    source,
                    "num_experts_per_tok",
                    per_token,
                    f"exceeds the {experts} experts ({arch.experts})",
                    f"set num_experts_per_tok to the model's value, at most {experts}",
                )
            )
        moe_layers = _sparse_layers(r, layers)
        expert_key = "intermediate_size" if arch.experts == "num_local_experts" else "moe_intermediate_size"
        expert_size = r.int(expert_key, why="each routed expert's MLP")
        shared = r.int("shared_expert_intermediate_size", default=0, minimum=0, why="the shared expert")
    dense_layers = layers - moe_layers
    intermediate = 0
    if dense_layers:
        intermediate = r.int("intermediate_size", why=f"the dense MLP of {dense_layers} layer(s)")
    elif isinstance(
        data.get("intermediate_size"), int
    ):  # unused (every layer is sparse) or Mixtral's experts
        intermediate = data["intermediate_size"]
    if r.errors:
        raise r.errors[0] if len(r.errors) == 1 else RecipeErrors(r.errors)
    dtype = data.get("dtype") or data.get("torch_dtype") or "bfloat16"
    return ModelShape(
        architecture=name,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        max_position_embeddings=max_pos,
        dtype=str(dtype),
        attention_bias=arch.bias == "attention_bias" and bool(data.get("attention_bias", False)),
        qkv_bias=arch.bias == "qkv",
        mlp_bias=bool(data.get("mlp_bias", False)) and not arch.experts,
        qk_norm=arch.qk_norm,
        num_experts=experts,
        num_experts_per_tok=per_token,
        moe_intermediate_size=expert_size,
        num_moe_layers=moe_layers,
        shared_expert_intermediate_size=shared,
        assumed=tuple(assumed),
    )


def _kv_heads_assumed(name: str, arch: Architecture, heads: int, kv_heads: int) -> str:
    """The note for a config.json without num_key_value_heads: what the plan took, whose default it is."""
    config_class = name.removesuffix("ForCausalLM") + "Config"
    if arch.kv_heads_default is None:
        return (
            f"config.json has no num_key_value_heads: planned with {kv_heads} KV heads, one per attention "
            f"head, as transformers' {config_class} (and so vLLM) defaults it; a model with grouped-query "
            "attention holds more KV tokens than planned: add its num_key_value_heads to config.json"
        )
    return (
        f"config.json has no num_key_value_heads: planned with {kv_heads} KV heads ({heads} attention "
        f"heads), the default of transformers' {config_class} (and so vLLM's), which is its default model's "
        "count, not necessarily this one's: add the model's num_key_value_heads to config.json"
    )


def _sparse_layers(r: _Reader, layers: int) -> int:
    """How many layers route to experts (Mixtral: all; Qwen MoE: by decoder_sparse_step and
    mlp_only_layers, as transformers and vLLM decide it)."""
    if r.arch == "MixtralForCausalLM":
        return layers
    step = r.int("decoder_sparse_step", default=1, why="which layers are sparse")
    dense = r.data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        r.errors.append(
            RecipeError(
                r.source,
                "mlp_only_layers",
                dense,
                "is not a list of layer indices",
                "set mlp_only_layers to the model's list of dense layers (e.g. [] or [0, 1])",
            )
        )
        dense = []
    return sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
