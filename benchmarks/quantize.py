"""Quantize the reference model with AWQ and GPTQ; sizes, seconds and held-out perplexity.

Writes benchmarks/results/release-formats/quantize.json. Each method quantizes from scratch (a fresh work
folder,
so no cached checkpoint is reused) through the project's quantization stage.

Perplexity method: the same as benchmarks/results/reference-models/reference_model.json's heldout_ppl:
exp(mean token NLL) over data/corpus/heldout.txt packed into 256-token windows, computed with
transformers on CPU. The quantized checkpoint is loaded through compressed-tensors, which
decompresses the int4 weights (with their scales and zero points) to bf16: the same numbers vLLM's
W4A16 kernels compute with, without the serving path. The served (vLLM, fp8 KV) perplexity is in
gates.json (lm-eval's word/byte perplexity).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from benchmarks.harness import ROOT, perplexity  # noqa: E402
from benchmarks.evidence import write_json_result  # noqa: E402
from quantize_serve.quantize.run import quantize_model  # noqa: E402
from quantize_serve.validate.preflight import resolve_base, validate_recipe  # noqa: E402


def main() -> None:
    results: dict = {"method": __doc__.split("Perplexity method: ")[1].strip()}
    base_dir = ROOT / "models/tiny-llama"
    results["base_heldout_ppl"] = perplexity(base_dir)
    for method in ("awq", "gptq"):
        validated = validate_recipe(ROOT / f"recipes/tiny-llama-{method}.yaml")
        base = resolve_base(validated)
        with tempfile.TemporaryDirectory() as work:
            r = quantize_model(
                validated.recipe,
                Path(base.local_dir),
                base_identity=base.identity,
                calibration_fingerprint=validated.calibration_fingerprint,
                work_dir=Path(work),
                log=lambda _: None,
            )
            ppl = perplexity(Path(r.checkpoint_dir))
        results[method] = {
            "scheme": r.scheme,
            "base_bytes": r.base_bytes,
            "quantized_bytes": r.quantized_bytes,
            "size_ratio": round(r.quantized_bytes / r.base_bytes, 4),
            "seconds": r.seconds,
            "base_ppl": results["base_heldout_ppl"],
            "quantized_ppl": ppl,
            "ppl_increase_pct": round(100 * (ppl / results["base_heldout_ppl"] - 1), 3),
            "calibration_samples": validated.recipe.calibration.num_samples,
        }
        print(method, results[method], flush=True)

    out = ROOT / "benchmarks/results/release-formats/quantize.json"
    write_json_result(out, results)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
