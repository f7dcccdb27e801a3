"""Print the capacity planner's table for Llama-3-8B and Llama-3-70B on 80 GB and 141 GB
GPUs and write ``benchmarks/results/capacity/plan.json``.

Why: it answers "how much memory does 4-bit quantization free, and how many more
max-length requests fit" for the production GPU sizes without booting anything; the
H200 row for the 8B can be checked against the measured figures quoted in
``tests/unit/test_planner.py`` (H200 runs on the host of ``scripts/gpu/README.md``; the planner is
calibrated on them).

Run from the repository root in the pipeline venv (no GPU, no torch needed)::

    python benchmarks/plan.py

Assumptions: device memory is the total CUDA reports, not the marketing figure:
139.8 GiB for an H200 141 GB (measured on the lent H200) and 79.6 GiB for an 80 GB card,
the figure given for A100/H100 80GB (about the H100 SXM's nvidia-smi total of 81,559 MiB;
not measured here: PyTorch on some 80 GB cards reports nearer 79.1-79.2 GiB, which would
lower every KV figure by ~0.4 GiB x 0.90, about 3,000 tokens for the 8B in bf16). The
overhead and activation constants were calibrated on the H200 with vLLM 0.26 and are
assumed to carry over. ``gpu_memory_utilization`` 0.90, ``max_model_len`` 8192,
``max_num_batched_tokens`` 8192 (the OpenAI server's default), ``gpu`` mode. The 70B is
also planned at TP 2 and 4, since its bf16 weights do not fit on one GPU of either size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import ROOT  # noqa: E402
from quantize_serve.capacity.plan_table import format_table, plan_table  # noqa: E402
from quantize_serve.capacity.planner import GPU_MEMORY_BYTES, ModelShape  # noqa: E402
from benchmarks.evidence import write_json_result  # noqa: E402

GPUS: dict[str, float] = {  # labels as in results/capacity/plan.json; sizes: the planner's presets (`--gpu`)
    "80GB (H100/A100 80GB, 79.6 GiB)": GPU_MEMORY_BYTES["h100-80gb"],
    "141GB (H200, 139.8 GiB)": GPU_MEMORY_BYTES["h200"],
}
MODELS: dict[str, tuple[str, tuple[int, ...]]] = {
    "Llama-3-8B": ("llama-3-8b.json", (1,)),
    "Llama-3-70B": ("llama-3-70b.json", (1, 2, 4)),
}


def main(argv: list[str] | None = None) -> int:
    """Plan every (model, GPU, TP) combination, print the tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--utilization", type=float, default=0.90)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "capacity" / "plan.json"
    )
    args = parser.parse_args(argv)

    configs = ROOT / "benchmarks" / "configs"
    results: list[dict[str, object]] = []
    serve = {  # the same for every (model, GPU, TP)
        "gpu_memory_utilization": args.utilization,
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": args.max_num_batched_tokens,
    }
    for model, (config_file, tps) in MODELS.items():
        shape = ModelShape.from_config(configs / config_file)
        for gpu, memory in GPUS.items():
            for tp in tps:
                table = plan_table(
                    shape, device_memory_bytes=memory, tensor_parallel_size=tp, model=model, **serve
                )
                print(format_table(table, title=f"{model} on {gpu}, TP {tp}"))
                print()
                results.append(
                    {"model": model, "gpu": gpu, "tensor_parallel_size": tp, **table.model_dump(mode="json")}
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_result(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
