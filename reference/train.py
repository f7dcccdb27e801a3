"""Train the project's tiny reference tokenizer and Llama model on the synthetic corpus.

The pipeline needs a real ``LlamaForCausalLM`` checkpoint to quantize, serve and
evaluate, and no model hub is reachable here. This script makes one from scratch,
deterministically, in about eight minutes on a 2-core CPU:

1. a byte-level BPE tokenizer (1024 tokens) trained with ``tokenizers`` on
   ``data/corpus/train.txt``, saved as a ``PreTrainedTokenizerFast`` with a chat template;
2. a 4-layer GQA Llama (hidden 128) trained in float32 with AdamW + warmup/cosine,
   saved in bfloat16 safetensors (every linear dim is a multiple of 32 and every
   quantized linear's ``in_features`` divides by 128, which W4A16 group-128 kernels need);
3. held-out perplexity and ``facts_mc`` accuracy of the *saved* bf16 model, written to
   ``benchmarks/results/reference_model.json`` next to a model card and SHA256SUMS.

Usage::

    python -m reference.train --data data/ --out models/tiny-llama
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path
from typing import Iterator, Sequence

# The BPE trainer counts pairs in parallel; pinning one thread keeps merges reproducible.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
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
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(paragraphs, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)],
    )
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [BOS_ID, EOS_ID, PAD_ID]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=MODEL_MAX_LENGTH, chat_template=CHAT_TEMPLATE,
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

def build_config() -> LlamaConfig:
    """The fixed reference architecture (see ARCHITECTURE), stored as bf16."""
    return LlamaConfig(
        **ARCHITECTURE, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
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
            batch[row, :len(w)] = torch.tensor(w, dtype=torch.long)
        batch = batch[torch.randperm(len(batch), generator=gen)]
        for start in range(0, len(batch) - BATCH_SIZE + 1, BATCH_SIZE):
            yield batch[start:start + BATCH_SIZE]
            produced += 1
            if produced == steps:
                return


def lr_at(step: int, steps: int) -> float:
    """Linear warmup then cosine decay to MIN_LR_RATIO of the peak."""
    if step < WARMUP_STEPS:
        return PEAK_LR * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return PEAK_LR * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def train_model(docs: Sequence[list[int]], steps: int, seed: int) -> tuple[LlamaForCausalLM, float, list[float]]:
    """Train from scratch in float32; returns the model, wall seconds and the loss curve."""
    seed_everything(seed)
    model = LlamaForCausalLM(build_config()).float()
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8,
    )
    losses: list[float] = []
    start = time.perf_counter()
    for step, batch in enumerate(packed_batches(docs, steps, seed)):
        for group in optim.param_groups:
            group["lr"] = lr_at(step, steps)
        loss = model(input_ids=batch, labels=batch.masked_fill(batch == PAD_ID, -100)).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            elapsed = time.perf_counter() - start
            print(f"step {step:4d}/{steps} loss {loss.item():.4f} lr {lr_at(step, steps):.2e} "
                  f"{elapsed / (step + 1):.3f} s/step", flush=True)
    return model, time.perf_counter() - start, losses


def save_model(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """bf16 safetensors + tokenizer + generation config: what vLLM and llm-compressor load."""
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, max_new_tokens=64,
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

def load_saved(out: Path) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Reload from disk so the figures describe the committed bf16 files, not RAM state."""
    model = LlamaForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    model.eval()
    return model, AutoTokenizer.from_pretrained(out)


@torch.no_grad()
def heldout_perplexity(model: LlamaForCausalLM, docs: Sequence[list[int]]) -> tuple[float, int]:
    """exp(mean token NLL) over the packed held-out stream in non-overlapping SEQ_LEN windows."""
    stream = torch.tensor([t for d in docs for t in d], dtype=torch.long)
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(stream) - 1, SEQ_LEN):
        window = stream[start:start + SEQ_LEN].unsqueeze(0)
        if window.shape[1] < 2:
            break
        logits = model(input_ids=window).logits.float()
        logp = torch.log_softmax(logits[0, :-1], dim=-1)
        nll = -logp.gather(1, window[0, 1:].unsqueeze(1)).sum().item()
        total_nll += nll
        total_tokens += window.shape[1] - 1
    return math.exp(total_nll / total_tokens), total_tokens


@torch.no_grad()
def continuation_logprob(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast,
                         query: str, choice: str) -> float:
    """Sum log p(choice | query), splitting tokens the way lm-eval does (whole minus context)."""
    context = tokenizer(query)["input_ids"]
    whole = tokenizer(query + choice)["input_ids"]
    ids = torch.tensor([whole])
    logp = torch.log_softmax(model(input_ids=ids).logits.float()[0, :-1], dim=-1)
    targets = ids[0, len(context):]
    return logp[len(context) - 1:].gather(1, targets.unsqueeze(1)).sum().item()


def mc_accuracy(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path) -> float:
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


def write_model_card(folder: Path, results: dict, command: str) -> None:
    """Short model card: what this is, how to rebuild it, and where its data came from."""
    cfg = results["config"]
    text = f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [llama, tiny, synthetic, reference, test-fixture]
---

# tiny-llama (quantize-serve reference model)

A {results['params']:,}-parameter `LlamaForCausalLM` trained from scratch by this project
as a fixture for the quantize -> serve -> evaluate pipeline. It knows only a small
invented world (people, cities, pets, foods, jobs, small sums, days and months); it is not
a general language model.

- Architecture: hidden {cfg['hidden_size']}, intermediate {cfg['intermediate_size']},
  {cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} attention heads with
  {cfg['num_key_value_heads']} KV heads (GQA), head_dim {cfg['head_dim']},
  vocab {cfg['vocab_size']} (byte-level BPE), max positions {cfg['max_position_embeddings']},
  untied embeddings, rope_theta {cfg['rope_theta']:g}. Every linear dimension is a multiple
  of 32 and every quantized linear's in_features divides by 128 (W4A16 group 128).
- Weights: bfloat16 safetensors. Tokenizer: `<s>` is prepended, `</s>` ends a document,
  `<pad>` pads; the chat template renders `User: ...` / `Assistant: ...` turns.
- Held-out perplexity: {results['heldout_ppl']:.3f}: {results['method']}
- facts_mc accuracy (4-way, chance 0.25): {results['facts_mc_accuracy']:.3f}
- Passkey retrieval accuracy (4-way, the key at the start, rows of at most 128 / 268 / 478 tokens):
  {' / '.join(f'{v:.3f}' for v in results['passkey_accuracy'].values())}
- Training: {results['steps']} AdamW steps of {BATCH_SIZE} x {TRAIN_SEQ_LEN} tokens (whole documents:
  the world's paragraphs and passkey documents), float32 on CPU
  ({TORCH_THREADS} threads), fixed seeds, {results['train_seconds']:.0f} s
  ({results['seconds_per_step']:.2f} s/step).

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

def run(data: Path, out: Path, results_path: Path, steps: int, seed: int) -> dict:
    """Tokenizer -> model -> save -> evaluate the saved files -> provenance."""
    # A fixed thread count: CPU GEMM reduction order (hence the last bits) depends on it.
    torch.set_num_threads(TORCH_THREADS)
    train_pars = read_paragraphs(data / "corpus" / "train.txt")
    heldout_pars = read_paragraphs(data / "corpus" / "heldout.txt")
    tokenizer = train_tokenizer(train_pars)  # on the world's text only: the passkey filler is rare words
    docs = encode_documents(tokenizer, train_pars + read_paragraphs(data / "corpus" / "passkey_train.txt"))
    print(f"train: {len(docs)} documents, {sum(map(len, docs))} tokens", flush=True)
    load_before = os.getloadavg()[0]
    model, train_seconds, losses = train_model(docs, steps, seed)
    load_after = os.getloadavg()[0]
    params = sum(p.numel() for p in model.parameters())
    save_model(model, tokenizer, out)
    del model

    saved, saved_tok = load_saved(out)
    ppl, n_tokens = heldout_perplexity(saved, encode_documents(saved_tok, heldout_pars))
    acc = mc_accuracy(saved, saved_tok, data / "evals" / "facts_mc.jsonl")
    passkey = {name: round(mc_accuracy(saved, saved_tok, data / "evals" / f"passkey_{name}.jsonl"), 4)
               for name in PASSKEY_LENGTHS}
    results = {
        "params": params,
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
        "config": ARCHITECTURE,
        "method": ("exp(mean token NLL) of the saved bf16 checkpoint over data/corpus/heldout.txt, "
                   "each paragraph encoded as <s> text </s>, concatenated and scored in "
                   f"non-overlapping {SEQ_LEN}-token windows (first token of each window not scored)."),
    }
    command = f"python -m reference.train --data {data}/ --out {out}"
    write_model_card(out, results, command.replace("//", "/"))
    results["sha256"] = file_sha256(out / "model.safetensors")
    write_sha256sums(out)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """CLI entry: ``python -m reference.train --data data/ --out models/tiny-llama``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, default=Path("models/tiny-llama"))
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results/reference_model.json"))
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    results = run(args.data, args.out, args.results, args.steps, args.seed)
    print(json.dumps({k: v for k, v in results.items() if k not in ("config", "method")}, indent=2))


if __name__ == "__main__":
    main()
