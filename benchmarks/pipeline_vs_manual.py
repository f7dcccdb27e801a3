"""The whole flow on the tiny AWQ recipe against the same steps done by hand with the engines' own
commands, on the same machine in the same run.

Manual = what the engines' docs show, one command per step, each tool against its own server:
1. an llm-compressor `oneshot` script (the same llm-compressor recipe and calibration samples);
2. capacity: `vllm serve` (the OpenAI server) three times (base, W4A16 16-bit KV, W4A16 fp8 KV),
   reading /metrics each time;
3. accuracy: `vllm serve` base, `lm_eval --model local-completions`; `vllm serve` quantized fp8,
   `lm_eval` again;
4. throughput: `vllm serve` quantized fp8, `vllm bench serve`.
That is 6 boots. Careful manual = the same commands, but a careful engineer shares boots the way
the flow does: 3 boots (base: /metrics and lm_eval; W4A16 16-bit KV: /metrics; W4A16 fp8 KV:
/metrics, lm_eval and the benchmark). The ratio against it is the fair one.
Pipeline = `quantize-serve run recipe` (no Hub section, fresh checkpoint cache), which
also runs the stress traffic and writes the report.

Writes benchmarks/results/pipeline_vs_manual.json: the three wall times, the pipeline's ratio to
each manual path, and the vLLM boots of each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PY, SERVE_PY = ROOT / ".venv/bin/python", ROOT / ".venv-serve/bin/python"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
       "VLLM_USE_FLASHINFER_SAMPLER": "0", "TOKENIZERS_PARALLELISM": "false"}
ONESHOT = """
import json, sys
from datasets import Dataset
from llmcompressor import oneshot
from transformers import AutoModelForCausalLM, AutoTokenizer
sys.path.insert(0, {root!r})
from quantize_serve.quantize.worker import skip_pinning_without_accelerator
skip_pinning_without_accelerator()  # the same CPU workaround the pipeline needs
model_dir, out, recipe = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [json.loads(l) for l in open({data!r})]
import random; random.Random(42).shuffle(rows)
tok = AutoTokenizer.from_pretrained(model_dir)
enc = tok([r["text"] for r in rows[:64]], truncation=True, max_length=256)
ds = Dataset.from_dict(dict(enc))
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="bfloat16")
oneshot(model=model, dataset=ds, recipe=open(recipe).read(), num_calibration_samples=64, max_seq_length=256, batch_size=8)
model.save_pretrained(out, save_compressed=True); tok.save_pretrained(out)
"""


def sh(cmd: list[str], cwd: Path = ROOT) -> None:
    subprocess.run([str(c) for c in cmd], cwd=cwd, env=ENV, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


class Serve:
    """`vllm serve` by hand: start, poll until ready, stop."""

    def __init__(self, model: Path, kv_dtype: str, kv_bytes: int, port: int = 18700) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [SERVE_PY, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "model",
             "--max-model-len", "512", "--max-num-seqs", "16", "--max-num-batched-tokens", "2048",
             "--kv-cache-dtype", kv_dtype, "--kv-cache-memory-bytes", str(kv_bytes), "--enforce-eager",
             "--port", str(port)], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def __enter__(self) -> Serve:
        for _ in range(600):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
                return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("vLLM did not start")

    def __exit__(self, *exc) -> None:
        os.killpg(self.proc.pid, 15)
        self.proc.wait(timeout=60)


def lm_eval(url: str, tokenizer: Path, out: Path) -> None:
    sh([ROOT / ".venv/bin/lm_eval", "--model", "local-completions", "--model_args",
        f"base_url={url}/v1/completions,model=model,tokenizer={tokenizer},tokenizer_backend=huggingface,"
        "tokenized_requests=True,max_length=512,num_concurrent=4", "--tasks", "qs_facts_mc,qs_heldout_ppl",
        "--include_path", ".", "--batch_size", "8", "--output_path", out], cwd=ROOT / "evals/tasks")


def bench(url: str, tokenizer: Path, out: Path) -> None:
    from quantize_serve.traffic.bench import BENCH_LAUNCHER

    sh([SERVE_PY, "-c", BENCH_LAUNCHER, "bench", "serve", "--backend", "openai", "--base-url", url,
        "--model", "model", "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", "93",
        "--random-output-len", "20", "--num-prompts", "48", "--max-concurrency", "16", "--ignore-eos",
        "--save-result", "--result-dir", out])


def manual(work: Path, *, share_boots: bool) -> tuple[float, int]:
    """The steps by hand, from scratch (its own oneshot checkpoint); returns (seconds, vLLM boots).
    ``share_boots``: one boot per configuration (3), as the flow does; else one per step (6)."""
    from quantize_serve.capacity.measure import checkpoint_tensor_bytes
    from quantize_serve.quantize.run import build_llmcompressor_recipe
    from quantize_serve.recipe.load import load_recipe

    recipe = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    budget = int(recipe.serve.memory_budget)
    work = work / ("manual-shared-boots" if share_boots else "manual")
    work.mkdir(parents=True)
    base, ckpt = ROOT / "models/tiny-llama", work / "ckpt"
    (work / "recipe.yaml").write_text(build_llmcompressor_recipe(recipe.quantization))
    boots = 0

    def serve(model: Path, kv_dtype: str, kv: int) -> Serve:
        nonlocal boots
        boots += 1
        return Serve(model, kv_dtype, kv)

    started = time.monotonic()
    sh([PY, "-c", ONESHOT.format(root=str(ROOT), data=str(ROOT / "data/calibration/tiny_calibration.jsonl")),
        base, ckpt, work / "recipe.yaml"])
    kv_base, kv_q = budget - checkpoint_tensor_bytes(base), budget - checkpoint_tensor_bytes(ckpt)
    if share_boots:
        with serve(base, "auto", kv_base) as s:
            urllib.request.urlopen(s.url + "/metrics").read()
            lm_eval(s.url, base, work / "lm-eval-base")
        with serve(ckpt, "bfloat16", kv_q) as s:
            urllib.request.urlopen(s.url + "/metrics").read()
        with serve(ckpt, "fp8", kv_q) as s:
            urllib.request.urlopen(s.url + "/metrics").read()
            lm_eval(s.url, ckpt, work / "lm-eval-quant")
            bench(s.url, ckpt, work)
        return time.monotonic() - started, boots
    for model, kv_dtype, kv in ((base, "auto", kv_base), (ckpt, "bfloat16", kv_q), (ckpt, "fp8", kv_q)):
        with serve(model, kv_dtype, kv) as s:
            urllib.request.urlopen(s.url + "/metrics").read()
    with serve(base, "auto", kv_base) as s:
        lm_eval(s.url, base, work / "lm-eval-base")
    with serve(ckpt, "fp8", kv_q) as s:
        lm_eval(s.url, ckpt, work / "lm-eval-quant")
    with serve(ckpt, "fp8", kv_q) as s:
        bench(s.url, ckpt, work)
    return time.monotonic() - started, boots


def pipeline(work: Path) -> tuple[float, int]:
    data = yaml.safe_load((ROOT / "recipes/tiny-llama-awq.yaml").read_text())
    data.pop("hub")
    recipe = ROOT / "recipes" / ".bench-pipeline.yaml"
    recipe.write_text(yaml.safe_dump(data))
    env = {**ENV, "QS_WORK_DIR": str(work / "pipeline-work"), "QS_RUNS_DIR": str(work / "runs")}
    started = time.monotonic()
    try:
        subprocess.run([PY, "-m", "quantize_serve.cli", "run", recipe], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        recipe.unlink()
    wall = time.monotonic() - started
    boots = len(list((work / "runs").glob("*/vllm-*.log")))
    return wall, boots


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pipeline_s, pipeline_boots = pipeline(work)
        manual_s, manual_boots = manual(work, share_boots=False)
        careful_s, careful_boots = manual(work, share_boots=True)
    result = {
        "pipeline_seconds": round(pipeline_s, 1), "pipeline_vllm_boots": pipeline_boots,
        "manual_seconds": round(manual_s, 1), "manual_vllm_boots": manual_boots,
        "ratio": round(pipeline_s / manual_s, 3),
        "careful_manual_seconds": round(careful_s, 1), "careful_manual_vllm_boots": careful_boots,
        "ratio_vs_careful_manual": round(pipeline_s / careful_s, 3),
        "note": "pipeline also runs the stress traffic and writes the report; all three quantize from "
                "scratch; careful manual shares vLLM boots the way the flow does",
    }
    from quantize_serve.core.portable import write_json_result

    write_json_result(ROOT / "benchmarks/results/pipeline_vs_manual.json", result)
    print(result)


if __name__ == "__main__":
    main()
