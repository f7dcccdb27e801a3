"""Quantization stage: real llm-compressor on the reference model, and vLLM serving the result."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from itertools import groupby
from pathlib import Path

import pytest

from quantize_serve.core.log_stream import parse_bar
from quantize_serve.quantize.run import MANIFEST, RECIPE_FILE, verify_manifest
from tests.conftest import SERVING_OVERRIDES


def assert_checkpoint(result, scheme: str, method: str) -> dict:
    ckpt = Path(result.checkpoint_dir)
    config = json.loads((ckpt / "config.json").read_text())
    q = config["quantization_config"]
    weights = q["config_groups"]["group_0"]["weights"]
    if scheme == "W8A8":  # SmoothQuant + GPTQ, int8 per channel, no fp8 KV scales (SERVING_OVERRIDES)
        assert q["quant_method"] == "compressed-tensors" and q["format"] == "int-quantized"
        assert weights["num_bits"] == 8 and weights["strategy"] == "channel" and not q.get("kv_cache_scheme")
        assert "SmoothQuantModifier" in (ckpt / RECIPE_FILE).read_text()
    else:
        assert q["quant_method"] == "compressed-tensors" and q["format"] == "pack-quantized"
        assert weights["num_bits"] == 4 and weights["group_size"] == 128
        assert weights["symmetric"] is (scheme == "W4A16")
        assert q["kv_cache_scheme"]["type"] == "float" and q["kv_cache_scheme"]["num_bits"] == 8
    manifest = json.loads((ckpt / MANIFEST).read_text())
    assert {"model.safetensors", "config.json", "tokenizer.json", RECIPE_FILE} <= set(manifest["files"])
    assert manifest["result"]["calibration_fingerprint"] == result.calibration_fingerprint
    assert manifest["result"]["engine_versions"]["llmcompressor"].startswith("0.14")
    assert verify_manifest(ckpt)
    assert method.split("-")[-1].upper() + "Modifier" in (ckpt / RECIPE_FILE).read_text()
    # the calibration pipeline measured for AWQ (benchmarks/results/release-time/quantize_speed.json);
    # llm-compressor's own defaults for the rest
    p = manifest["calibration_pipeline"]
    expected = ("sequential", False) if method == "awq" else ("independent", True)
    assert (p["pipeline"], p["propagate_error"]) == expected
    assert list(manifest["result"]["stage_seconds"]) == ["imports", "prepare", "load", "calibrate", "save"]
    assert 0 < result.quantized_bytes < (0.8 if scheme == "W8A8" else 0.6) * result.base_bytes
    return manifest


def assert_readable_log(lines: list[str], result) -> None:
    """The child's progress bars reached the log as a line or two each, not a line per redraw
    (one AWQ run logged 126 lines of a single grid-search bar). Vacuous for a reused checkpoint."""
    if result.cached:
        return
    bars = [frame.desc if (frame := parse_bar(line)) else None for line in lines]
    runs = Counter()  # the longest stretch of consecutive lines from one bar, per bar name
    for desc, stretch in groupby(bars):
        if desc is not None:
            runs[desc] = max(runs[desc], len(list(stretch)))
    assert runs and max(runs.values()) <= 3, runs.most_common(5)
    assert len(lines) < 200, f"{len(lines)} log lines"


def test_awq_quantizes_on_cpu(awq_checkpoint, quantize_logs):
    """The session's checkpoint: AWQ W4A16_ASYM, or INT8 W8A8 where this CPU's vLLM serves no W4A16
    (tests/conftest.py SERVING_OVERRIDES)."""
    scheme, method = ("W8A8", "smoothquant-gptq") if SERVING_OVERRIDES else ("W4A16_ASYM", "awq")
    manifest = assert_checkpoint(awq_checkpoint, scheme, method)
    assert (
        awq_checkpoint.device == "cpu" == manifest["device"]
    )  # the worker's torch device, in the result too
    assert manifest["workarounds"] == ["skip pin_memory without accelerator"]
    assert_readable_log(quantize_logs["awq"], awq_checkpoint)


def test_gptq_quantizes_on_cpu(gptq_checkpoint, quantize_logs):
    assert_checkpoint(gptq_checkpoint, "W4A16", "gptq")
    assert gptq_checkpoint.device == "cpu"
    assert_readable_log(quantize_logs["gptq"], gptq_checkpoint)


def test_the_flow_counts_the_tokens_calibration_runs_on(gptq_recipe, gptq_checkpoint):
    """The count the flow sizes calibration's device memory by (before the base boots) is the worker's;
    what a GPU run prepares for it as the run starts (count_ahead) runs without error first."""
    from quantize_serve.quantize.calibration import calibration_tokens, count_ahead
    from quantize_serve.validate.preflight import resolve_base, validate_recipe

    assert count_ahead(gptq_recipe).result(timeout=120) is None
    base = resolve_base(validate_recipe(gptq_recipe))
    counted = calibration_tokens(gptq_recipe, Path(base.local_dir))
    assert counted == gptq_checkpoint.calibration_tokens and counted > gptq_recipe.calibration.num_samples


def test_speed_options_reach_llmcompressor():
    """The recipe's speed options arrive as llm-compressor's own objects: n_grid and duo_scaling on the
    AWQModifier its recipe parser builds; pipeline and propagate_error in the DatasetArguments its oneshot
    parser makes of the worker's arguments, and the calibration pipeline it picks from them."""
    from llmcompressor.args import parse_args
    from llmcompressor.pipelines import CalibrationPipeline
    from llmcompressor.recipe import Recipe as LlmcompressorRecipe

    from quantize_serve.quantize.run import build_llmcompressor_recipe
    from quantize_serve.quantize.worker import calibration_arguments
    from quantize_serve.recipe.load import load_recipe
    from tests.conftest import ROOT

    def arrive(name: str, overrides: dict | None = None):
        recipe = load_recipe(ROOT / "recipes" / name, overrides)
        modifiers = LlmcompressorRecipe.create_instance(
            build_llmcompressor_recipe(recipe.quantization)
        ).modifiers
        _, args, _, _ = parse_args(model="unused", **calibration_arguments(recipe, None))
        pipeline = type(CalibrationPipeline.from_modifiers(modifiers, user=args.pipeline)).__name__
        return {type(m).__name__: m for m in modifiers}, (args.pipeline, args.propagate_error, pipeline)

    modifiers, pipeline = arrive("tiny-llama-awq.yaml")
    assert (modifiers["AWQModifier"].n_grid, modifiers["AWQModifier"].duo_scaling) == (5, True)
    assert pipeline == ("sequential", False, "SequentialPipeline")  # AWQ and the quantizer: one pass
    _, pipeline = arrive("tiny-llama-gptq.yaml")
    assert pipeline == ("independent", True, "IndependentPipeline")  # GPTQ: llm-compressor's defaults
    # a recipe that sets them gets what it sets: llm-compressor's defaults, as before the measurement
    before = {
        "quantization.n_grid": 20,
        "calibration.pipeline": "independent",
        "calibration.propagate_error": True,
    }
    modifiers, pipeline = arrive("tiny-llama-awq.yaml", before)
    assert modifiers["AWQModifier"].n_grid == 20
    assert pipeline == ("independent", True, "IndependentPipeline")


def workers_of_this_process() -> list:
    """This process's live quantization workers (a worker started ahead included)."""
    import psutil

    found = []
    for p in psutil.Process().children():
        try:
            if (
                "quantize_serve.quantize.worker" in " ".join(p.cmdline())
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(p)
        except psutil.Error:  # it ended while we looked
            continue
    return found


def test_rerun_reuses_checkpoint(awq_checkpoint):
    from quantize_serve.quantize.run import prepare_worker
    from tests.conftest import ROOT, _quantize

    prepare_worker()  # as the flow does: a reused checkpoint stops it
    again = _quantize(ROOT / "recipes" / "tiny-llama-awq.yaml", overrides=SERVING_OVERRIDES)
    assert again.cached and again.checkpoint_dir == awq_checkpoint.checkpoint_dir
    assert again.device == awq_checkpoint.device == "cpu"  # where it was made, kept in its manifest
    assert not workers_of_this_process()


def test_a_worker_started_ahead_imports_before_the_stage_and_never_outlives_it(tmp_path):
    """The flow starts the worker as it validates (tasks/quantize.py worker_ahead): the stage hands it the
    spec, so torch's, transformers' and llm-compressor's imports are not on the stage's wall. One not taken
    is stopped, and one whose parent went away (stdin closed) exits by itself."""
    from quantize_serve.quantize import run as quantize
    from quantize_serve.quantize.run import PREPARED_MARK
    from quantize_serve.validate.preflight import resolve_base, validate_recipe
    from tests.conftest import ROOT

    validated = validate_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml")
    base = resolve_base(validated)
    quantize.prepare_worker()
    (worker,) = workers_of_this_process()
    lines: list[str] = []
    result = quantize.quantize_model(
        validated.recipe,
        Path(base.local_dir),
        base_identity=base.identity,
        calibration_fingerprint=validated.calibration_fingerprint,
        work_dir=tmp_path,
        log=lines.append,
    )
    assert not worker.is_running() and not workers_of_this_process()
    assert result.imports_ahead and not result.cached and result.stage_seconds["imports"] > 0
    said = [line for line in lines if line.startswith("[quantize]")]  # the imports' warnings before them
    assert said[0].startswith(PREPARED_MARK) and "W4A16" in said[1], said[:2]
    manifest = json.loads((Path(result.checkpoint_dir) / MANIFEST).read_text())
    assert manifest["result"]["imports_ahead"]

    quantize.prepare_worker()  # not taken: stopped
    quantize.discard_prepared_worker()
    assert not workers_of_this_process()
    orphan = subprocess.Popen(
        [sys.executable, "-m", "quantize_serve.quantize.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    out, _ = orphan.communicate(b"", timeout=120)  # its stdin closes with nothing on it
    assert orphan.returncode == 0 and PREPARED_MARK in out.decode(), out.decode()[-2000:]


def complete(server, prompt: str) -> dict:
    import urllib.request

    body = json.dumps({"model": "model", "prompt": prompt, "max_tokens": 12, "temperature": 0}).encode()
    req = urllib.request.Request(
        server.base_url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def test_vllm_serves_awq_checkpoint(awq_fp8_server):
    server, _ = awq_fp8_server
    out = complete(server, "Matha lives in")
    assert out["usage"]["completion_tokens"] > 0 and out["choices"][0]["text"].strip()
    assert (
        "CompressedTensors" in Path(server.log_path).read_text()
        or "WNA16" in Path(server.log_path).read_text()
    )


def test_the_production_boot_names_the_model_as_production_does(awq_recipe, awq_checkpoint, awq_fp8_server):
    """(c) as the flow boots it: vLLM's config names the repo id at the release ref, as production's online
    `vllm serve --config serve-profile.yaml` does (its compile cache keys on both), and reads the checkpoint's
    own files through the boot's Hub-cache layout, offline."""
    from quantize_serve.serving.repo_layout import LOCAL_COMMIT
    from quantize_serve.serving.server import boot_hub_cache

    server, spec = awq_fp8_server
    log = Path(server.log_path).read_text()
    assert (spec.repo_id, spec.revision) == (awq_recipe.hub.repo_id, awq_recipe.hub.release_ref)
    assert (
        f"model='{spec.repo_id}'" in log
        and f"revision={spec.revision}" in log
        and "replace model_id" not in log
    )
    snapshot = (
        boot_hub_cache(Path(server.log_path))
        / ("models--" + spec.repo_id.replace("/", "--"))
        / "snapshots"
        / LOCAL_COMMIT
    )
    checkpoint = Path(awq_checkpoint.checkpoint_dir)
    links = {p.name: p.resolve() for p in snapshot.iterdir()}
    assert links == {p.name: p.resolve() for p in checkpoint.iterdir()}


@pytest.mark.w4a16_serving
@pytest.mark.fp8_kv_serving
def test_vllm_serves_gptq_checkpoint(gptq_recipe, gptq_checkpoint, tmp_path):
    from quantize_serve.serving.spec import capacity_spec
    from quantize_serve.serving.server import vllm_server

    spec = capacity_spec(gptq_recipe, "w4a16-fp8kv", Path(gptq_checkpoint.checkpoint_dir))
    with vllm_server(spec, log_path=tmp_path / "vllm.log") as server:
        out = complete(server, "The favorite color of Matha is")
    assert out["choices"][0]["text"].strip()


def test_cpu_pinning_workaround_still_needed():
    """Upstream check: llm-compressor still pins unconditionally. When this fails, upstream fixed
    it: delete quantize_worker.skip_pinning_without_accelerator and this test."""
    code = (
        "import torch\n"
        "from llmcompressor.pipelines.cache import IntermediatesCache, IntermediateValue\n"
        "assert not torch.accelerator.is_available()\n"
        "v = IntermediateValue(value=torch.zeros(2), device=None)\n"
        "try:\n"
        "    IntermediatesCache._pin_intermediate(v)\n"
        "except RuntimeError as e:\n"
        "    print('STILL-FAILS', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "STILL-FAILS" in out.stdout, (
        "llm-compressor no longer fails to pin memory without an accelerator: remove the "
        f"workaround in quantize_serve/quantize/worker.py\n{out.stdout}\n{out.stderr[-2000:]}"
    )


def test_a_worker_started_ahead_goes_with_a_pipeline_killed_hard():
    """The pipeline process killed (SIGKILL: no cleanup of its own runs) while its worker started ahead still
    imports: the worker goes with it, at once (PR_SET_PDEATHSIG; tests/unit/test_processes.py) or at the
    latest when its imports end and it finds its stdin closed: it never holds a device past its pipeline."""
    import psutil

    from tests.conftest import ROOT

    code = (
        "import time\n"
        "from quantize_serve.quantize import run\n"
        "run.prepare_worker()\n"
        "print(run._prepared[0].pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    pipeline = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    worker = psutil.Process(int(pipeline.stdout.readline()))
    try:
        pipeline.kill()
        pipeline.wait()
        worker.wait(timeout=30)
    finally:
        pipeline.stdout.close()
        if worker.is_running():
            worker.kill()
