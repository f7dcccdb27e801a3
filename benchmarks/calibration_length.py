"""The llama3 recipe's calibration length (calibration.max_seq_len), chosen by measurement: the calibration
tokens the 8B keeps at each cap, and the reference model's recovery when it is calibrated on the same share
of its own tokens.

The 8B's calibration (production-shaped UltraChat conversations from localhub/datasets.py, rendered with the
chat template, 256 samples, batch 4 as the recipe sets it: llm-compressor orders the samples by length and
cuts each batch to its shortest) is counted at each cap in CAPS. AWQ's calibration time on the GPU follows
the tokens (benchmarks/results/h200_quantize_speed.json: ~0.39 ms a token for the 8B on one H200), and so
does its activation memory. A random-weight 8B's recovery means nothing, so the quality side is the
reference model's (models/tiny-llama, recipes/tiny-llama-awq.yaml, on CPU, held-out perplexity recovery as
benchmarks/quantize_speed.py measures it): its texts are short (~90 tokens, cap 256), so it is calibrated at
the cap that keeps the share of its tokens that each 8B cap keeps of the 8B's at 2,048. Rule: a cap is
eligible when that recovery stays within RECOVERY_TOLERANCE (harness.py) of the reference model's at its
recipe's cap.

    .venv/bin/python benchmarks/calibration_length.py     # ~2 minutes on 2 cores
writes benchmarks/results/calibration_length.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import (  # noqa: E402
    RECOVERY_TOLERANCE,
    ROOT,
    Results,
    driver_env,
    gpu_recipe,
    logger,
    on_reference,
    perplexity,
    production_calibration,
    tokens_kept_in_batches,
)

driver_env()  # before the product's imports, which read it

from quantize_serve.quantize.calibration import tokenize_calibration  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.recipe.model import Recipe  # noqa: E402

OUT = ROOT / "benchmarks/results/calibration_length.json"
CAPS = (2048, 1024, 512)  # the 8B's: the recipe's before this measurement, then halved twice
PRODUCTION_BATCH_SIZE = 4  # recipes/llama3-8b-instruct-awq.yaml's calibration.batch_size
REFERENCE = ROOT / "recipes/tiny-llama-awq.yaml"
log = logger("calibration-length")


def production_tokens() -> dict[int, int]:
    """The 8B's calibration tokens kept at each cap of CAPS (the 8B build's tokenizer is the reference
    model's): tokenized once at the largest cap, as a sample cut at a smaller one keeps its first tokens."""
    from transformers import AutoTokenizer

    tokenizer_dir = ROOT / "models/tiny-llama"
    with tempfile.TemporaryDirectory() as work:
        recipe = gpu_recipe("awq", tokenizer_dir, production_calibration(Path(work), tokenizer_dir, 512))
        recipe["calibration"].update(max_seq_len=max(CAPS), batch_size=PRODUCTION_BATCH_SIZE)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        _, encoded = tokenize_calibration(Recipe.model_validate(recipe), tokenizer)
    lengths = [len(x) for x in encoded["input_ids"]]
    return {
        cap: tokens_kept_in_batches([min(n, cap) for n in lengths], PRODUCTION_BATCH_SIZE) for cap in CAPS
    }


def reference_tokens() -> dict[int, int]:
    """The reference model's calibration tokens kept at every cap up to its recipe's (tokenized once, as
    production_tokens)."""
    from transformers import AutoTokenizer

    recipe = load_recipe(REFERENCE)
    _, encoded = tokenize_calibration(recipe, AutoTokenizer.from_pretrained(ROOT / "models/tiny-llama"))
    lengths = [len(x) for x in encoded["input_ids"]]
    top, batch = recipe.calibration.max_seq_len, recipe.calibration.batch_size
    return {cap: tokens_kept_in_batches([min(n, cap) for n in lengths], batch) for cap in range(top, 0, -1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    production, reference = production_tokens(), reference_tokens()
    top = max(reference)
    base_ppl = perplexity(ROOT / "models/tiny-llama")
    rows = []
    for cap in CAPS:
        share = production[cap] / production[CAPS[0]]
        # the nearest share, the largest cap among equals (the recipe's own cap for the 8B's 2,048)
        ref_cap = min(reference, key=lambda c: (abs(reference[c] / reference[top] - share), -c))
        run = on_reference("awq", {"calibration.max_seq_len": ref_cap}, base_ppl)
        rows.append(
            {
                "max_seq_len": cap,
                "tokens": production[cap],
                "share": round(share, 3),
                "reference_max_seq_len": ref_cap,
                "reference_tokens": reference[ref_cap],
                "reference_share": round(reference[ref_cap] / reference[top], 3),
                "heldout_ppl": run["heldout_ppl"],
                "recovery": run["recovery"],
            }
        )
        log(f"calibration length {rows[-1]}")
    for row in rows:
        row["recovery_delta"] = round(row["recovery"] - rows[0]["recovery"], 5)
        row["within_tolerance"] = row["recovery_delta"] >= -RECOVERY_TOLERANCE
    res = Results(args.out, roots=())
    res.data.update(
        method=__doc__.split("\n\n")[0].replace("\n", " "),
        calibration=f"the 8B: 256 production-shaped conversations, batch {PRODUCTION_BATCH_SIZE}; the "
        f"reference model: {REFERENCE.relative_to(ROOT)}",
        tolerance=RECOVERY_TOLERANCE,
        base_heldout_ppl=base_ppl,
        rows=rows,
        shortest_within_tolerance=min(
            (r["max_seq_len"] for r in rows if r["within_tolerance"]), default=None
        ),
    )
    res.save()


if __name__ == "__main__":
    main()
