"""Make an AutoAWQ-format checkpoint of the reference model with the real ``autoawq`` package.

Why: issue 16 validates an *existing* AutoAWQ checkpoint as a release candidate, without
re-quantizing it. The pipeline itself quantizes with llm-compressor (compressed-tensors format),
so the tests need a checkpoint in the older ``awq`` format made by the tool that defined it. This
script made ``tests/fixtures/tiny-llama-autoawq/``.

What: loads ``models/tiny-llama``, runs AutoAWQ (4-bit, zero point, GEMM packing, group 128)
calibrated on the first 64 texts of ``data/calibration/tiny_calibration.jsonl``, and saves the
quantized weights and the tokenizer to OUT_DIR.

Run (with a Python that has ``autoawq``; AutoAWQ 0.2.9 is deprecated and is not a project
dependency, so install it into a scratch environment)::

    python scripts/make_autoawq_checkpoint.py OUT_DIR

It runs on CPU in well under a minute.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BASE_MODEL = "models/tiny-llama"
CALIBRATION = "data/calibration/tiny_calibration.jsonl"
NUM_CALIBRATION_TEXTS = 64
MAX_CALIB_SEQ_LEN = 256

# Group 128 divides every linear input width of the reference model (hidden 128, heads 4 x 32,
# intermediate 384), so no layer needs a smaller group.
QUANT_CONFIG = {"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}


def read_calibration_texts(path: Path, count: int) -> list[str]:
    texts = []
    with path.open(encoding="utf-8") as rows:
        for line in rows:
            texts.append(json.loads(line)["text"])
            if len(texts) == count:
                break
    return texts


def make_checkpoint(out_dir: Path) -> None:
    from awq import AutoAWQForCausalLM
    from transformers import AutoTokenizer

    base = REPO_ROOT / BASE_MODEL
    tokenizer = AutoTokenizer.from_pretrained(base)
    # AutoAWQ's default dtype ("auto") keeps the model's bf16 for the unquantized tensors; its GEMM
    # layers store their scales in fp16 whatever the model dtype (vLLM casts them on load).
    model = AutoAWQForCausalLM.from_pretrained(base, device_map="cpu")
    texts = read_calibration_texts(REPO_ROOT / CALIBRATION, NUM_CALIBRATION_TEXTS)
    model.quantize(
        tokenizer,
        quant_config=QUANT_CONFIG,
        calib_data=texts,
        max_calib_samples=NUM_CALIBRATION_TEXTS,
        max_calib_seq_len=MAX_CALIB_SEQ_LEN,
    )
    model.save_quantized(str(out_dir))  # AutoAWQ indexes the path as a str
    tokenizer.save_pretrained(out_dir)
    _relativize_base_path(out_dir / "config.json")


def _relativize_base_path(config_path: Path) -> None:
    """Replace the base model's path as this machine spells it (``_name_or_path``) with the
    repo-relative one, so the checkpoint holds no absolute path and is the same wherever it is made."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if "_name_or_path" in config:  # none with transformers 5.17; a guard
        config["_name_or_path"] = BASE_MODEL
        config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="where to write the AutoAWQ checkpoint")
    args = parser.parse_args()
    make_checkpoint(args.out_dir)
    print(f"wrote {args.out_dir}")


if __name__ == "__main__":
    main()
