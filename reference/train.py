"""Train the project's tiny reference tokenizer and models on the synthetic corpus.

The pipeline needs real checkpoints to quantize, serve and evaluate, and no model hub is
reachable here. This script makes one from scratch, deterministically, in about eight
minutes on a 2-core CPU, for either reference architecture (``--arch``):

- ``llama``: a dense ``LlamaForCausalLM`` (``models/tiny-llama``);
- ``qwen3-moe``: a mixture of experts, ``Qwen3MoeForCausalLM`` (``models/tiny-qwen3-moe``): the
  same attention, and in every layer 8 routed experts of width 128 (top-2) behind a router,
  trained with the router's load-balancing loss so every expert learns.

Steps:

1. a byte-level BPE tokenizer (1024 tokens) trained with ``tokenizers`` on
   ``data/corpus/train.txt``, saved as a ``PreTrainedTokenizerFast`` with a chat template;
2. a 4-layer GQA model (hidden 128) trained in float32 with AdamW + warmup/cosine,
   saved in bfloat16 safetensors (every linear dim is a multiple of 32 and every
   quantized linear's ``in_features`` divides by 128, which W4A16 group-128 kernels need);
3. held-out perplexity and ``facts_mc`` accuracy of the *saved* bf16 model, written to
   ``benchmarks/results/reference-models/reference_model.json`` (``reference_moe.json``) next to a model
   card and SHA256SUMS.

Both architectures share the tokenizer (trained the same way on the same text, so the
same merges) and the training data.

Usage::

    python -m reference.train --data data/ --out models/tiny-llama
    python -m reference.train --arch qwen3-moe --data data/ --out models/tiny-qwen3-moe
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

# The BPE trainer counts pairs in parallel; pinning one thread keeps merges reproducible.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from quantize_serve.core.digest import file_sha256  # noqa: E402
from reference.corpus import PASSKEY_LENGTHS, read_paragraphs  # noqa: E402

SEED = 1234
VOCAB_SIZE = 1024
SEQ_LEN = 256  # held-out perplexity windows
TRAIN_SEQ_LEN = 512  # training windows: a passkey document of up to ~470 tokens fits whole in one
BATCH_SIZE = 8
# A step count, not a timer, keeps the weights reproducible (8 x 512 tokens a step).
DEFAULT_STEPS = 1200
MOE_STEPS = 600
PEAK_LR = 3e-3
MIN_LR_RATIO = 0.1
WARMUP_STEPS = 30
WEIGHT_DECAY = 0.01
TORCH_THREADS = 2
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
MODEL_MAX_LENGTH = 1024

# Same layout as the corpus' dialog paragraphs ("User: ...\nAssistant: ..."), so chat
# requests look like what the model was trained on and generation stops at </s>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'] }}"
    "{% if loop.last %}{{ eos_token }}{% else %}\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

ARCHITECTURE = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": MODEL_MAX_LENGTH,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}

# The mixture of experts: the same attention, embeddings and head; each layer's MLP is 8 routed
# experts of width 128 (a multiple of 128: W4A16 group 128 divides every expert's down_proj), 2 per
# token, with normalised top-k weights (Qwen3-30B-A3B's routing). intermediate_size is unused (no
# dense layer) and kept at the dense model's width, which group 128 also divides. The router's
# load-balancing loss (coefficient 0.01) keeps every expert in use.
MOE_ARCHITECTURE = {
    **ARCHITECTURE,
    "moe_intermediate_size": 128,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "router_aux_loss_coef": 0.01,
}


@dataclass(frozen=True)
class Reference:
    """One reference architecture: its transformers classes, its numbers and where it goes."""

    name: str  # the --arch value
    folder: str  # models/<folder>
    config_class: type
    model_class: type
    architecture: dict[str, Any]
    results: str  # benchmarks/results/reference-models/<results>
    train_kwargs: dict[str, Any]  # extra forward arguments while training
    description: str  # the model card's first paragraph (after the parameter count)
    steps: int  # the default step count (a count, not a timer: the weights stay reproducible)


REFERENCES = {
    "llama": Reference(
        "llama",
        "tiny-llama",
        LlamaConfig,
        LlamaForCausalLM,
        ARCHITECTURE,
        "reference_model.json",
        {},
        "`LlamaForCausalLM`",
        DEFAULT_STEPS,
    ),
    "qwen3-moe": Reference(
        "qwen3-moe",
        "tiny-qwen3-moe",
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        MOE_ARCHITECTURE,
        "reference_moe.json",
        {"output_router_logits": True},  # the load-balancing loss joins the loss
        # Fewer steps than the dense model: a step costs more (the experts' loop), and the 2-core build
        # machine is shared; 600 steps still learn the world
        # (benchmarks/results/reference-models/reference_moe.json).
        "mixture-of-experts `Qwen3MoeForCausalLM`",
        MOE_STEPS,
    ),
}


def seed_everything(seed: int) -> None:
    """Fix every RNG the run touches so that a rebuild gives the same weights."""
    random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def train_tokenizer(paragraphs: Sequence[str]) -> PreTrainedTokenizerFast:
    """Byte-level BPE (no unknown tokens ever) with <s> prepended like Llama's tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(paragraphs, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A",
        pair="<s> $A <s> $B",
        special_tokens=[("<s>", BOS_ID)],
    )
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [BOS_ID, EOS_ID, PAD_ID]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MODEL_MAX_LENGTH,
        chat_template=CHAT_TEMPLATE,
        # Decoder-only generation needs prompts padded on the left when batched.
        padding_side="left",
    )


def encode_documents(tokenizer: PreTrainedTokenizerFast, paragraphs: Sequence[str]) -> list[list[int]]:
    """Each paragraph as <s> ... </s>, the document boundary the model should learn."""
    encoded = tokenizer(list(paragraphs), add_special_tokens=True)["input_ids"]
    return [ids + [EOS_ID] for ids in encoded]


# ---------------------------------------------------------------------------
# Model and data
# ---------------------------------------------------------------------------


def build_config(ref: Reference = REFERENCES["llama"]):
    """The fixed reference architecture (see ARCHITECTURE, MOE_ARCHITECTURE), stored as bf16."""
    return ref.config_class(
        **ref.architecture,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        dtype="bfloat16",
    )


def packed_batches(docs: Sequence[list[int]], steps: int, seed: int) -> Iterator[torch.Tensor]:
    """Yield ``steps`` batches of TRAIN_SEQ_LEN-token windows of whole, shuffled documents.

    Documents are packed whole (a window ends with padding, label -100, where the next document
    does not fit), so a passkey document's key and question always share a window. Each epoch
    reshuffles the order with a seeded generator, so windows differ between epochs while the
    order stays reproducible.
    """
    gen = torch.Generator().manual_seed(seed)
    produced = 0
    while True:
        order = torch.randperm(len(docs), generator=gen).tolist()
        windows: list[list[int]] = [[]]
        for i in order:
            doc = docs[i][:TRAIN_SEQ_LEN]
            if len(windows[-1]) + len(doc) > TRAIN_SEQ_LEN:
                windows.append([])
            windows[-1].extend(doc)
        batch = torch.full((len(windows), TRAIN_SEQ_LEN), PAD_ID, dtype=torch.long)
        for row, w in enumerate(windows):
            batch[row, : len(w)] = torch.tensor(w, dtype=torch.long)
        batch = batch[torch.randperm(len(batch), generator=gen)]
        for start in range(0, len(batch) - BATCH_SIZE + 1, BATCH_SIZE):
            yield batch[start : start + BATCH_SIZE]
            produced += 1
            if produced == steps:
                return


def lr_at(step: int, steps: int) -> float:
    """Linear warmup then cosine decay to MIN_LR_RATIO of the peak."""
    if step < WARMUP_STEPS:
        return PEAK_LR * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return PEAK_LR * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def train_model(
    docs: Sequence[list[int]], steps: int, seed: int, ref: Reference = REFERENCES["llama"]
) -> tuple[PreTrainedModel, float, list[float]]:
    """Train from scratch in float32; returns the model, wall seconds and the loss curve."""
    seed_everything(seed)
    model = ref.model_class(build_config(ref)).float()
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=PEAK_LR,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    losses: list[float] = []
    start = time.perf_counter()
    for step, batch in enumerate(packed_batches(docs, steps, seed)):
        for group in optim.param_groups:
            group["lr"] = lr_at(step, steps)
        loss = model(
            input_ids=batch, labels=batch.masked_fill(batch == PAD_ID, -100), **ref.train_kwargs
        ).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            elapsed = time.perf_counter() - start
            print(
                f"step {step:4d}/{steps} loss {loss.item():.4f} lr {lr_at(step, steps):.2e} "
                f"{elapsed / (step + 1):.3f} s/step",
                flush=True,
            )
    return model, time.perf_counter() - start, losses


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """bf16 safetensors + tokenizer + generation config: what vLLM and llm-compressor load."""
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        max_new_tokens=64,
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_class(out / "tokenizer_config.json")


def _portable_tokenizer_class(path: Path) -> None:
    """Name the class ``PreTrainedTokenizerFast`` instead of v5's ``TokenizersBackend``.

    transformers 5 maps the old name to the same backend, while 4.x only knows the
    old name, so the checkpoint stays loadable by older tools (lm-eval, AutoAWQ users).
    """
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------
# Evaluation of the saved checkpoint
# ---------------------------------------------------------------------------


def load_saved(out: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Reload from disk so the figures describe the committed bf16 files, not RAM state."""
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    model.eval()
    return model, AutoTokenizer.from_pretrained(out)


@torch.no_grad()
def heldout_perplexity(model: PreTrainedModel, docs: Sequence[list[int]]) -> tuple[float, int]:
    """exp(mean token NLL) over the packed held-out stream in non-overlapping SEQ_LEN windows."""
    stream = torch.tensor([t for d in docs for t in d], dtype=torch.long)
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(stream) - 1, SEQ_LEN):
        window = stream[start : start + SEQ_LEN].unsqueeze(0)
        if window.shape[1] < 2:
            break
        logits = model(input_ids=window).logits.float()
        logp = torch.log_softmax(logits[0, :-1], dim=-1)
        nll = -logp.gather(1, window[0, 1:].unsqueeze(1)).sum().item()
        total_nll += nll
        total_tokens += window.shape[1] - 1
    return math.exp(total_nll / total_tokens), total_tokens


@torch.no_grad()
def continuation_logprob(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, query: str, choice: str
) -> float:
    """Sum log p(choice | query), splitting tokens the way lm-eval does (whole minus context)."""
    context = tokenizer(query)["input_ids"]
    whole = tokenizer(query + choice)["input_ids"]
    ids = torch.tensor([whole])
    logp = torch.log_softmax(model(input_ids=ids).logits.float()[0, :-1], dim=-1)
    targets = ids[0, len(context) :]
    return logp[len(context) - 1 :].gather(1, targets.unsqueeze(1)).sum().item()


def mc_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: Path) -> float:
    """Fraction of rows whose gold choice has the highest summed continuation log-prob."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    correct = 0
    for row in rows:
        scores = [continuation_logprob(model, tokenizer, row["query"], c) for c in row["choices"]]
        correct += int(max(range(len(scores)), key=scores.__getitem__) == row["gold"])
    return correct / len(rows)


# ---------------------------------------------------------------------------
# Provenance files
# ---------------------------------------------------------------------------


def write_sha256sums(folder: Path) -> None:
    """``sha256sum -c`` compatible list of every file in the model folder."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != "SHA256SUMS")
    lines = [f"{file_sha256(p)}  {p.name}\n" for p in files]
    (folder / "SHA256SUMS").write_text("".join(lines), encoding="utf-8")


def write_model_card(folder: Path, results: dict, command: str, ref: Reference = REFERENCES["llama"]) -> None:
    """Short model card: what this is, how to rebuild it, and where its data came from."""
    cfg = results["config"]
    moe = "num_experts" in cfg
    tags = "[qwen3_moe, mixture-of-experts, tiny" if moe else "[llama, tiny"
    params = (
        f"{results['params']:,}-parameter ({results['active_params']:,} active per token)"
        if moe
        else f"{results['params']:,}-parameter"
    )
    experts = (
        f"""
- Mixture of experts: in each of the {cfg["num_hidden_layers"]} layers {cfg["num_experts"]} routed experts
  (gated MLPs of width {cfg["moe_intermediate_size"]}), {cfg["num_experts_per_tok"]} per token with normalised
  top-k weights, behind a router (`mlp.gate`, hidden -> experts, kept 16-bit by quantization); trained with
  the router's load-balancing loss (coefficient {cfg["router_aux_loss_coef"]:g}). Share of held-out tokens
  each expert receives (layer by layer, top-{cfg["num_experts_per_tok"]} picks):
  {"; ".join(" ".join(f"{x:.2f}" for x in layer) for layer in results["expert_load"])}."""
        if moe
        else ""
    )
    intermediate = (
        f"expert width {cfg['moe_intermediate_size']}" if moe else f"intermediate {cfg['intermediate_size']}"
    )
    text = f"""---
library_name: transformers
pipeline_tag: text-generation
tags: {tags}, synthetic, reference, test-fixture]
---

# {folder.name} (quantize-serve reference model)

A {params} {ref.description} trained from scratch by this project
as a fixture for the quantize -> serve -> evaluate pipeline. It knows only a small
invented world (people, cities, pets, foods, jobs, small sums, days and months); it is not
a general language model.

- Architecture: hidden {cfg["hidden_size"]}, {intermediate},
  {cfg["num_hidden_layers"]} layers, {cfg["num_attention_heads"]} attention heads with
  {cfg["num_key_value_heads"]} KV heads (GQA), head_dim {cfg["head_dim"]},
  vocab {cfg["vocab_size"]} (byte-level BPE), max positions {cfg["max_position_embeddings"]},
  untied embeddings, rope_theta {cfg["rope_theta"]:g}. Every linear dimension is a multiple
  of 32 and every quantized linear's in_features divides by 128 (W4A16 group 128).{experts}
- Weights: bfloat16 safetensors. Tokenizer: `<s>` is prepended, `</s>` ends a document,
  `<pad>` pads; the chat template renders `User: ...` / `Assistant: ...` turns.
- Held-out perplexity: {results["heldout_ppl"]:.3f}: {results["method"]}
- facts_mc accuracy (4-way, chance 0.25): {results["facts_mc_accuracy"]:.3f}
- Passkey retrieval accuracy (4-way, the key at the start, rows of at most 128 / 268 / 478 tokens):
  {" / ".join(f"{v:.3f}" for v in results["passkey_accuracy"].values())}
- Training: {results["steps"]} AdamW steps of {BATCH_SIZE} x {TRAIN_SEQ_LEN} tokens (whole documents:
  the world's paragraphs and passkey documents), float32 on CPU
  ({TORCH_THREADS} threads), fixed seeds, {results["train_seconds"]:.0f} s
  ({results["seconds_per_step"]:.2f} s/step).

## How it was made

```
python -m reference.corpus --out data/
{command}
```

Both steps are deterministic on a given CPU and library build (seeded RNGs, fixed step
count); other CPUs or torch builds can change the last bits of the weights, so check
`SHA256SUMS` rather than expecting the same hash everywhere.

## License

Trained only on synthetic text generated by this repository's own code
(`reference/corpus.py`); no third-party data or weights are involved. It is
distributed under the same license as the quantize-serve repository.
"""
    (folder / "README.md").write_text(text, encoding="utf-8")


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


@torch.no_grad()
def expert_load(model: PreTrainedModel, docs: Sequence[list[int]]) -> list[list[float]]:
    """Per sparse layer, the share of the top-k picks each expert receives over the held-out text
    (1 / num_experts each when balanced): shows the router learned to use every expert."""
    counts: dict[int, torch.Tensor] = {}

    def count(index: int):
        def hook(module, args, output):
            picks = output[2].flatten()  # (router logits, weights, indices)
            counts[index] = counts.get(index, 0) + torch.bincount(picks, minlength=module.num_experts)

        return hook

    hooks = [layer.mlp.gate.register_forward_hook(count(i)) for i, layer in enumerate(model.model.layers)]
    try:
        heldout_perplexity(model, docs)
    finally:
        for h in hooks:
            h.remove()
    return [[round(x, 4) for x in (c / c.sum()).tolist()] for _, c in sorted(counts.items())]


def active_parameters(model: PreTrainedModel) -> int:
    """Parameters one token passes through: all but the routed experts it is not sent to."""
    cfg = model.config
    total = sum(p.numel() for p in model.parameters())
    if not getattr(cfg, "num_experts", 0):
        return total
    experts = sum(p.numel() for layer in model.model.layers for p in layer.mlp.experts.parameters())
    return total - experts + experts * cfg.num_experts_per_tok // cfg.num_experts


def run(
    data: Path, out: Path, results_path: Path, steps: int, seed: int, ref: Reference = REFERENCES["llama"]
) -> dict:
    """Tokenizer -> model -> save -> evaluate the saved files -> provenance."""
    # A fixed thread count: CPU GEMM reduction order (hence the last bits) depends on it.
    torch.set_num_threads(TORCH_THREADS)
    train_pars = read_paragraphs(data / "corpus" / "train.txt")
    heldout_pars = read_paragraphs(data / "corpus" / "heldout.txt")
    tokenizer = train_tokenizer(train_pars)  # on the world's text only: the passkey filler is rare words
    docs = encode_documents(tokenizer, train_pars + read_paragraphs(data / "corpus" / "passkey_train.txt"))
    print(f"train: {len(docs)} documents, {sum(map(len, docs))} tokens", flush=True)
    load_before = os.getloadavg()[0]
    model, train_seconds, losses = train_model(docs, steps, seed, ref)
    load_after = os.getloadavg()[0]
    params = sum(p.numel() for p in model.parameters())
    active = active_parameters(model)
    save_model(model, tokenizer, out)
    del model

    saved, saved_tok = load_saved(out)
    ppl, n_tokens = heldout_perplexity(saved, encode_documents(saved_tok, heldout_pars))
    acc = mc_accuracy(saved, saved_tok, data / "evals" / "facts_mc.jsonl")
    passkey = {
        name: round(mc_accuracy(saved, saved_tok, data / "evals" / f"passkey_{name}.jsonl"), 4)
        for name in PASSKEY_LENGTHS
    }
    moe = (
        {
            "active_params": active,
            "expert_load": expert_load(saved, encode_documents(saved_tok, heldout_pars)),
        }
        if active != params
        else {}
    )
    results = {
        "architecture": ref.model_class.__name__,
        "params": params,
        **moe,
        "vocab_size": VOCAB_SIZE,
        "heldout_ppl": round(ppl, 4),
        "facts_mc_accuracy": round(acc, 4),
        "passkey_accuracy": passkey,  # 4-way, chance 0.25; filler groups per length: PASSKEY_LENGTHS
        "train_seconds": round(train_seconds, 1),
        "steps": steps,
        "batch_size": BATCH_SIZE,
        "seq_len": TRAIN_SEQ_LEN,
        "seconds_per_step": round(train_seconds / steps, 4),
        "final_train_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "heldout_tokens": n_tokens,
        "torch_threads": TORCH_THREADS,
        # train_seconds is wall time on a shared machine: the load shows how busy it was.
        "cpu_load_1m_before_after": [round(load_before, 2), round(load_after, 2)],
        "config": ref.architecture,
        "method": (
            "exp(mean token NLL) of the saved bf16 checkpoint over data/corpus/heldout.txt, "
            "each paragraph encoded as <s> text </s>, concatenated and scored in "
            f"non-overlapping {SEQ_LEN}-token windows (first token of each window not scored)."
        ),
    }
    arch = "" if ref.name == "llama" else f" --arch {ref.name}"
    command = f"python -m reference.train{arch} --data {data}/ --out {out}"
    write_model_card(out, results, command.replace("//", "/"), ref)
    results["sha256"] = file_sha256(out / "model.safetensors")
    write_sha256sums(out)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """CLI entry: ``python -m reference.train --data data/ --out models/tiny-llama``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arch",
        choices=sorted(REFERENCES),
        default="llama",
        help="llama: the dense tiny-llama; qwen3-moe: the mixture of experts tiny-qwen3-moe",
    )
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, help="default: models/tiny-llama or models/tiny-qwen3-moe")
    parser.add_argument(
        "--results",
        type=Path,
        help="default: benchmarks/results/reference-models/reference_model.json or reference_moe.json",
    )
    parser.add_argument(
        "--steps", type=int, help=f"default: {DEFAULT_STEPS} (llama), {MOE_STEPS} (qwen3-moe)"
    )
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    ref = REFERENCES[args.arch]
    out = args.out or Path("models") / ref.folder
    results_path = args.results or Path("benchmarks/results/reference-models") / ref.results
    results = run(args.data, out, results_path, args.steps or ref.steps, args.seed, ref)
    print(
        json.dumps(
            {k: v for k, v in results.items() if k not in ("config", "method", "expert_load")}, indent=2
        )
    )


if __name__ == "__main__":
    main()
