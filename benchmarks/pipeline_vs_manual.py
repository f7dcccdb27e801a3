"""The whole flow on the tiny AWQ recipe against exactly the same steps done by hand, on the same
machine in the same run, the two interleaved (manual, flow, manual, flow, ...) so both see the same
load on a shared host.

Careful manual = what the engines' docs show, one command per step, the way a careful engineer
shares boots (one per configuration, 3 in all, as the flow does):
1. an llm-compressor ``oneshot`` script (the same llm-compressor recipe and calibration samples);
2. ``vllm serve`` base (16-bit KV): ``/metrics`` for capacity, then ``lm_eval --model
   local-completions`` with the recipe's five accuracy tasks in one invocation;
3. ``vllm serve`` W4A16, 16-bit KV: ``/metrics``;
4. ``vllm serve`` W4A16, fp8 KV: ``/metrics``; ``lm_eval`` (the same five tasks); the stress test
   as the engine's own tool does it: ``/metrics`` before, ``vllm bench serve`` once per step of the
   flow's concurrency ramp (1 -> 25% -> 50% -> 100% of the target, the same request counts and
   mean lengths as the flow's plan), the over-long prompts sent by hand (each must get HTTP 400),
   ``/metrics`` after (preemptions); then the final ``vllm bench serve`` at the target concurrency
   with the flow's exact arguments.
lm-eval's concurrency is the same on both sides (what the recipe's gate resolves to).
Pipeline = ``quantize-serve run recipe`` (no Hub section, fresh checkpoint cache), which also
writes the report. Both quantize from scratch.

Writes benchmarks/results/pipeline_vs_manual.json: each round's wall times, the totals and
``ratio_vs_careful_manual`` = sum(pipeline) / sum(careful manual), the vLLM boots of each, and
the host's load average during the measurement. Both paths share one ``VLLM_CACHE_ROOT``, filled
by an untimed boot before the first round.

    .venv/bin/python benchmarks/pipeline_vs_manual.py --rounds 2    # the measurement
    .venv/bin/python benchmarks/pipeline_vs_manual.py --rounds 1 --out OUT.json    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RECIPE = ROOT / "recipes/tiny-llama-awq.yaml"
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

    def __init__(self, model: Path, kv_dtype: str, kv_bytes: int, port: int | None = None) -> None:
        from quantize_serve.serving.server import free_port

        port = port or free_port()
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


def lm_eval(url: str, tokenizer: Path, out: Path, *, tasks: list[str], batch_size: int, concurrent: int) -> None:
    """One ``lm_eval`` invocation with every task of the gate (run from the task folder: the task
    files name their data relative to it)."""
    sh([ROOT / ".venv/bin/lm_eval", "--model", "local-completions", "--model_args",
        f"base_url={url}/v1/completions,model=model,tokenizer={tokenizer},tokenizer_backend=huggingface,"
        f"tokenized_requests=True,max_length=512,num_concurrent={concurrent}", "--tasks", ",".join(tasks),
        "--include_path", ".", "--batch_size", str(batch_size), "--output_path", out], cwd=ROOT / "evals/tasks")


def bench(url: str, tokenizer: Path, out: Path, *, input_len: int, output_len: int, num_prompts: int,
          concurrency: int, name: str) -> None:
    """``vllm bench serve`` (random dataset, the flow's arguments: quantize_serve.traffic.bench.bench_args)."""
    from quantize_serve.traffic.bench import BENCH_LAUNCHER

    sh([SERVE_PY, "-c", BENCH_LAUNCHER, "bench", "serve", "--backend", "openai", "--base-url", url,
        "--endpoint", "/v1/completions", "--model", "model", "--served-model-name", "model",
        "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(output_len), "--num-prompts", str(num_prompts),
        "--max-concurrency", str(concurrency), "--request-rate", "inf", "--ignore-eos", "--temperature", "0",
        "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--disable-tqdm", "--save-result", "--result-dir", out, "--result-filename", f"{name}.json"])


def overlong(url: str, max_model_len: int) -> None:
    """A prompt over max_model_len, by hand: vLLM must answer HTTP 400 and stay up."""
    body = json.dumps({"model": "model", "prompt": [1] + [450] * (max_model_len + 15), "max_tokens": 8}).encode()
    try:
        urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", body,
                                                      {"Content-Type": "application/json"}), timeout=60)
    except urllib.error.HTTPError as exc:
        if exc.code == 400:
            return
        raise
    raise RuntimeError("an over-long prompt was not refused")


def stress_by_hand(s: Serve, recipe, ckpt: Path, out: Path) -> None:
    """The flow's stress test with vLLM's own tool: one ``vllm bench serve`` per concurrency step,
    with the step's request count and mean lengths from the flow's plan (quantize_serve.gates.stress
    .plan_traffic: only the numbers are read, nothing of it runs), the over-long prompts by hand in
    the peak, /metrics before and after; then the final bench at the target."""
    from quantize_serve.gates.stress import plan_traffic
    from quantize_serve.traffic.bench import bench_lengths

    profile, serve = recipe.gates.stress, recipe.serve
    urllib.request.urlopen(s.url + "/metrics").read()
    for concurrency, probes in plan_traffic(profile, serve, str(ckpt), seed=0):
        valid = [p for p in probes if p.kind != "overlong"]
        for p in probes:
            if p.kind == "overlong":
                overlong(s.url, serve.max_model_len)
        bench(s.url, ckpt, out, input_len=round(sum(len(p.prompt) for p in valid) / len(valid)),
              output_len=round(sum(p.max_tokens for p in valid) / len(valid)), num_prompts=len(valid),
              concurrency=concurrency, name=f"ramp-{concurrency}")
    urllib.request.urlopen(s.url + "/metrics").read()
    input_len, output_len = bench_lengths(profile, serve)
    target = profile.concurrency or serve.max_num_seqs
    bench(s.url, ckpt, out, input_len=input_len, output_len=output_len,
          num_prompts=max(profile.num_requests, target), concurrency=target, name="bench")


def manual(work: Path, name: str) -> tuple[float, int]:
    """The steps by hand, from scratch (its own oneshot checkpoint), one boot per configuration;
    returns (seconds, vLLM boots)."""
    from quantize_serve.capacity.measure import checkpoint_tensor_bytes
    from quantize_serve.gates.accuracy import lm_eval_concurrency
    from quantize_serve.quantize.run import build_llmcompressor_recipe
    from quantize_serve.recipe.load import load_recipe

    recipe = load_recipe(RECIPE)
    gate = recipe.gates.accuracy
    tasks = [Path(t.task).stem for t in gate.tasks]  # the task files' names are their task names
    concurrent = lm_eval_concurrency(gate, recipe.serve)
    budget = int(recipe.serve.memory_budget)
    work = work / name
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
    with serve(base, "auto", kv_base) as s:
        urllib.request.urlopen(s.url + "/metrics").read()
        lm_eval(s.url, base, work / "lm-eval-base", tasks=tasks, batch_size=gate.batch_size, concurrent=concurrent)
    with serve(ckpt, "bfloat16", kv_q) as s:
        urllib.request.urlopen(s.url + "/metrics").read()
    with serve(ckpt, "fp8", kv_q) as s:
        urllib.request.urlopen(s.url + "/metrics").read()
        lm_eval(s.url, ckpt, work / "lm-eval-quant", tasks=tasks, batch_size=gate.batch_size, concurrent=concurrent)
        stress_by_hand(s, recipe, ckpt, work / "stress")
    return time.monotonic() - started, boots


def pipeline(work: Path, name: str) -> tuple[float, int]:
    data = yaml.safe_load(RECIPE.read_text())
    data.pop("hub")
    recipe = ROOT / "recipes" / f".bench-{name}.yaml"
    recipe.write_text(yaml.safe_dump(data))
    env = {**ENV, "QS_WORK_DIR": str(work / name / "work"), "QS_RUNS_DIR": str(work / name / "runs")}
    started = time.monotonic()
    try:
        subprocess.run([PY, "-m", "quantize_serve.cli", "run", recipe], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        recipe.unlink()
    wall = time.monotonic() - started
    boots = len(list((work / name / "runs").glob("*/vllm-*.log")))
    return wall, boots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="manual/pipeline pairs, interleaved")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/pipeline_vs_manual.json")
    args = parser.parse_args()
    rounds, load = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # One vLLM cache for both paths (model-info and compile caches), filled by one untimed boot first:
        # neither path pays its first fill, as neither would on a host that has served before.
        ENV["VLLM_CACHE_ROOT"] = str(work / "vllm-cache")
        from quantize_serve.capacity.measure import checkpoint_tensor_bytes
        from quantize_serve.recipe.load import load_recipe

        base = ROOT / "models/tiny-llama"
        with Serve(base, "auto", int(load_recipe(RECIPE).serve.memory_budget) - checkpoint_tensor_bytes(base)):
            pass
        for i in range(args.rounds):
            load.append(os.getloadavg()[0])
            manual_s, manual_boots = manual(work, f"manual-{i}")
            load.append(os.getloadavg()[0])
            pipeline_s, pipeline_boots = pipeline(work, f"pipeline-{i}")
            load.append(os.getloadavg()[0])
            rounds.append({"careful_manual_seconds": round(manual_s, 1), "pipeline_seconds": round(pipeline_s, 1),
                           "ratio": round(pipeline_s / manual_s, 3)})
            print(rounds[-1], flush=True)
    pipeline_total = sum(r["pipeline_seconds"] for r in rounds)
    manual_total = sum(r["careful_manual_seconds"] for r in rounds)
    result = {
        "rounds": rounds,
        "pipeline_seconds": round(pipeline_total / len(rounds), 1), "pipeline_vllm_boots": pipeline_boots,
        "careful_manual_seconds": round(manual_total / len(rounds), 1), "careful_manual_vllm_boots": manual_boots,
        "ratio_vs_careful_manual": round(pipeline_total / manual_total, 3),
        "load_average_1min": {"min": round(min(load), 2), "max": round(max(load), 2)},
        "host": f"{os.cpu_count()} CPU cores",
        "note": "the two paths interleaved (manual, pipeline, manual, pipeline, ...) so both see the same load; "
                "the same steps on both sides: quantize from scratch, 3 vLLM boots, /metrics on each, the five "
                "accuracy tasks on base and fp8 boots, the stress ramp (one vllm bench serve per step, the "
                "over-long prompts, /metrics before and after) and the final vllm bench serve; the pipeline "
                "also writes the report. ratio = sum(pipeline) / sum(manual)",
    }
    from quantize_serve.core.portable import write_json_result

    write_json_result(args.out, result)
    print(result)


if __name__ == "__main__":
    main()
