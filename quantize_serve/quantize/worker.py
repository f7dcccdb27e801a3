"""Child process of the quantization stage: load, calibrate with llm-compressor, save, exit.

Run as ``python -m quantize_serve.quantize.worker SPEC.json``. Everything heavy (torch,
transformers, llmcompressor) is imported here only, and the process exits when done, so the
device memory it used goes back to the driver before vLLM boots.

Started ahead (``python -m quantize_serve.quantize.worker`` with no argument, run.prepare_worker), it does
its imports, prints PREPARED_MARK and waits for the spec's path on stdin: the imports happen while the
flow still resolves (or downloads) the base. It touches no device before the spec arrives, and exits when
its stdin closes without one.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

from quantize_serve.core.model_files import GIB
from quantize_serve.core.settings import get_settings
from quantize_serve.quantize.device import (
    CALIBRATION_HEADROOM_BYTES,
    calibration_activation_bytes,
    calibration_need_bytes,
)
from quantize_serve.quantize.calibration import fingerprint, render_texts, tokenize_calibration
from quantize_serve.quantize.run import (
    PREPARED_MARK,
    RECIPE_FILE,
    calibration_pipeline,
    engine_versions,
    weights_bytes_on_disk,
)
from quantize_serve.recipe.model import Recipe


def skip_pinning_without_accelerator() -> bool:
    """Workaround for llm-compressor 0.14: AWQ's IntermediatesCache pins CPU tensors with
    ``pin_memory()`` unconditionally, which raises "Cannot access accelerator device when none is
    available" on a machine without one. Pinned memory only speeds host-to-device copies, so
    without an accelerator skipping it changes nothing else.

    Narrow on purpose: patched only when no accelerator exists and only that one method; on a GPU
    host llm-compressor runs untouched. tests/engines/test_quantize.py checks that upstream still needs
    it; remove this function when that test reports the fix.
    """
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available():
        return False
    IntermediatesCache._pin_intermediate = classmethod(lambda cls, intermediate: None)
    return True


def describe_device(torch) -> str:
    """Where llm-compressor computes: ``cpu``, or the accelerator torch offers with its index and, on
    CUDA, its name (``cuda:0 NVIDIA H200``)."""
    if not torch.accelerator.is_available():
        return "cpu"
    kind = torch.accelerator.current_accelerator().type
    index = torch.accelerator.current_device_index()
    name = torch.cuda.get_device_name(index) if kind == "cuda" else ""
    return f"{kind}:{index} {name}".strip()


def placement(free_bytes: int | None, weights_bytes: int, activation_bytes: int) -> tuple[bool, str]:
    """(whether the model and the calibration activations go on the device, the reason in words).

    llm-compressor's sequential pipeline keeps the model where it was loaded and onloads one layer at
    a time to the device, with the activations between layers offloaded to the CPU: right for a model
    larger than the device, and only slower for one that fits (an 8B AWQ on an H200: the model fits
    nine times over). So when the weights, the activations (device.calibration_activation_bytes) and a
    headroom fit the free memory, everything stays on the device."""
    if free_bytes is None:
        return False, "no accelerator: the model and its activations on the CPU"
    need = calibration_need_bytes(weights_bytes, activation_bytes)
    fits = need <= free_bytes
    verdict = (
        "model and calibration activations on the device"
        if fits
        else "model on the CPU, onloaded one layer at a time (llm-compressor's default)"
    )
    return fits, (
        f"{verdict}: needs {need / GIB:.1f} GiB (weights {weights_bytes / GIB:.1f}, activations "
        f"{activation_bytes / GIB:.1f}, headroom {CALIBRATION_HEADROOM_BYTES / GIB:.0f}), "
        f"{free_bytes / GIB:.1f} GiB free"
    )


def calibration_arguments(recipe: Recipe, target: str | None) -> dict:
    """oneshot's calibration arguments for the recipe (llm-compressor's own names), with ``target`` the
    device the model was placed on (None: the CPU)."""
    c = recipe.calibration
    return {
        "num_calibration_samples": c.num_samples,
        "max_seq_length": c.max_seq_len,
        "batch_size": c.batch_size,
        "shuffle_calibration_samples": False,  # already shuffled with the recipe's seed
        "moe_calibrate_all_experts": True,  # llm-compressor's default, stated: the run depends on it
        "sequential_offload_device": target or "cpu",  # the activations between layers: beside the model
        **calibration_pipeline(recipe),
    }


def main(spec_path: str | None) -> None:
    """Quantize as the spec at ``spec_path`` says; None: prepared ahead, the path comes on stdin."""
    started = last = time.monotonic()  # the stage's wall in this process: from its start, or from its spec
    last_cpu = time.process_time()
    stages: dict[str, float] = {}  # wall seconds per stage, in order
    stages_cpu: dict[str, float] = {}  # this process's CPU seconds (all its threads) per stage

    def mark(stage: str) -> None:
        nonlocal last, last_cpu
        now, now_cpu = time.monotonic(), time.process_time()
        stages[stage], stages_cpu[stage] = round(now - last, 2), round(now_cpu - last_cpu, 2)
        last, last_cpu = now, now_cpu

    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modeling.moe.linearize import linearize_moe
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mark("imports")
    ahead = spec_path is None
    if ahead:  # prepared ahead of the stage: what follows is on the stage's wall, the imports were not
        print(f"{PREPARED_MARK} in {stages['imports']} s", flush=True)
        spec_path = sys.stdin.readline().strip()
        if not spec_path:  # not needed after all (stdin closed): nothing was touched
            return
        started = last = time.monotonic()
    spec = json.loads(Path(spec_path).read_text())
    recipe = Recipe.model_validate(spec["recipe"])
    out = Path(spec["output_dir"])

    workarounds = ["skip pin_memory without accelerator"] if skip_pinning_without_accelerator() else []
    device = describe_device(torch)
    print(f"[quantize] {recipe.quantization.method} {recipe.quantization.scheme} on {device}", flush=True)

    base = spec["base_model_dir"]
    trust = recipe.model.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=trust)
    rows, encoded = tokenize_calibration(recipe, tokenizer)
    dataset = Dataset.from_dict(
        {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    )
    tokens = sum(len(x) for x in encoded["input_ids"])
    print(f"[quantize] {len(rows)} calibration samples, {tokens} tokens", flush=True)
    config = json.loads((Path(base) / "config.json").read_text())
    free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
    if free is not None and not get_settings().quantize_on_device:
        on_device, where = (
            False,
            "model on the CPU, onloaded one layer at a time (QS_QUANTIZE_ON_DEVICE=false)",
        )
    else:
        activations = calibration_activation_bytes(config, recipe.quantization.method, tokens)
        on_device, where = placement(free, weights_bytes_on_disk(Path(base)), activations)
    target = f"cuda:{torch.cuda.current_device()}" if on_device else None
    print(f"[quantize] placement: {where}", flush=True)
    mark("prepare")  # tokenizer, calibration data, placement
    model = AutoModelForCausalLM.from_pretrained(
        base, dtype=recipe.model.dtype, trust_remote_code=trust, device_map=target
    )
    # Mixtures of experts: llm-compressor's own MoE support. linearize_moe turns each layer's fused
    # experts (3D tensors) into one Linear per expert's gate/up/down projection, which the modifiers
    # quantize and the checkpoint stores per expert (what vLLM's MoE kernels load); with
    # moe_calibrate_all_experts every calibration token also passes through every expert, so an expert
    # the router seldom picks is still calibrated (the layer's output stays routed as trained). A dense
    # model is left as it is. (Its load-time variant, load_quantizable_moe, patches transformers in a
    # way that imports every model module, vision ones included, which fails without torchvision.)
    linearize_moe(model)
    mark("load")
    oneshot(
        model=model,
        dataset=dataset,
        recipe=spec["llmcompressor_recipe"],
        **calibration_arguments(recipe, target),
    )
    mark("calibrate")
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)
    (out / RECIPE_FILE).write_text(spec["llmcompressor_recipe"])
    mark("save")  # compress and write
    cuda = torch.cuda.is_available()
    report = {
        "engine_versions": engine_versions(),
        "calibration_fingerprint": fingerprint(render_texts(recipe, rows)),
        "calibration_tokens": tokens,
        "device": device,
        "placement": where,
        # what calibration took of the device at its peak: the caching allocator's reserve (what another
        # process on the device sees) and its tensors' (the measure of calibration_need_bytes' estimate)
        "device_peak_bytes": torch.cuda.max_memory_reserved() if cuda else None,
        "device_peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "workarounds": workarounds,
        "seconds": round(time.monotonic() - started, 2),
        "imports_ahead": ahead,
        "stage_seconds": stages,
        "stage_cpu_seconds": stages_cpu,
    }
    Path(spec_path).with_name("worker_report.json").write_text(json.dumps(report))
    peak = (
        f"; device peak {report['device_peak_bytes'] / GIB:.2f} GiB reserved, "
        f"{report['device_peak_allocated_bytes'] / GIB:.2f} GiB allocated ({where})"
        if cuda
        else ""
    )
    print(f"[quantize] saved {out} in {report['seconds']} s{peak}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
    # Done: the checkpoint and the report are written and closed. Skip the interpreter's teardown of torch,
    # transformers and llm-compressor (1.1-1.2 s on a 2-core CPU, on the stage's wall); the OS frees the
    # process's memory, the device's included, as it exits. The logs' sinks are flushed and closed first
    # (llm-compressor's loguru writes a file too when LLM_COMPRESSOR_LOG_FILE is set). A failure above exits
    # the usual way.
    from loguru import logger

    logger.remove()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
