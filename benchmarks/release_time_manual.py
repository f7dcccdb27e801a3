"""The careful engineer's path of ``benchmarks/h200_release_time.py --runs manual``: first_release's work by
hand, with the engines' own commands (``benchmarks/manual.py``, shared with the CPU's
``benchmarks/pipeline_vs_manual.py``), each built from the same recipe and overrides as first_release's,
timed stage by stage as the flow's "stage done" marks are read; and the flow-to-manual ratio recorded with
where its two walls came from (``record_ratio``). What the run is, step by step against the flow's, is the
scenario's ``manual_note`` (benchmarks/scenarios/release-time.yaml), recorded with it.

The driver's own part: imported by it after ``harness.driver_env`` (the local Hub's environment).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import manual as m
from benchmarks import production_stack as production
from benchmarks.harness import ROOT, Results, boot_logs, load_scenario, logger
from quantize_serve.serving.spec import sixteen_bit_kv_dtype
from quantize_serve.gates.accuracy.run import lm_eval_concurrency
from quantize_serve.quantize.run import build_llmcompressor_recipe
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving import gpu
from quantize_serve.serving.server import BOOT_START_DEFAULTS, stop_process_group

SCENARIO = load_scenario("release-time")
RECIPE = ROOT / SCENARIO["recipe"]
MANUAL_REPO_SUFFIX = "-manual"
PROGRESS_EVERY_S = 10.0  # the record's elapsed_seconds between stages (a bound for a run cut short)
log = logger("release")

MANUAL_NOTE = SCENARIO["manual_note"]  # what the manual run is, recorded with it


class Marks:
    """Seconds per stage (each since the previous mark), as the flow's "stage done" marks are read."""

    def __init__(self) -> None:
        self.t0 = self.last = time.monotonic()
        self.stages: dict[str, float] = {}

    def done(self, stage: str) -> None:
        now = time.monotonic()
        self.stages[stage] = round(now - self.last, 1)
        self.last = now

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 1)


def manual_recipe(base_overrides: dict[str, Any], repo: str) -> tuple[Any, dict[str, Any]]:
    """first_release's recipe (the same overrides) with a Hub repo of its own."""
    overrides = {**base_overrides, "hub.repo_id": repo + MANUAL_REPO_SUFFIX}
    return load_recipe(RECIPE, overrides), overrides


def lm_eval_settings(recipe: Any, tasks_dir: Path) -> dict[str, Any]:
    """The lm_eval invocation's settings as the gate resolves them: the recipe's task set as one group
    file in ``tasks_dir`` (written here) with its limits as --samples, the gate's batch size, lm-eval's
    concurrency (quantize_serve.gates.accuracy.run.lm_eval_concurrency), the server's max_model_len."""
    gate = recipe.gates.accuracy
    group, samples = m.gate_group(gate.tasks)
    tasks_dir.mkdir(parents=True, exist_ok=True)
    (tasks_dir / f"{m.GATE_GROUP}.yaml").write_text(group)
    settings: dict[str, Any] = {
        "tasks": [m.GATE_GROUP],
        "batch_size": gate.batch_size,
        "include_path": tasks_dir,
        "concurrent": lm_eval_concurrency(gate, recipe.serve),
        "max_length": recipe.serve.max_model_len,
    }
    if samples:
        (tasks_dir / "samples.json").write_text(json.dumps(samples))
        settings["samples"] = tasks_dir / "samples.json"
    return settings


@dataclass(frozen=True)
class ManualSetting:
    """What the manual run is given: first_release's recipe and overrides with a Hub repo of its own
    (``manual_recipe``), the deployment's env on the local stack, a work dir of its own, the serving Python
    and how long a vLLM boot may take to be ready."""

    recipe: Any
    overrides: dict[str, Any]
    env: dict[str, str]
    work: Path
    serving_python: Path
    ready_timeout_s: float


def manual_run(res: Results, setting: ManualSetting, *, session: str, preceded_by: list[str]) -> None:
    """first_release's work by hand (h200_release_time.py's doc, run 4); the record is saved as it goes, so a
    failure leaves the stages done so far (``complete`` false)."""
    recipe, overrides, env, work = setting.recipe, setting.overrides, setting.env, setting.work
    serving_python, ready_timeout_s = setting.serving_python, setting.ready_timeout_s
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {
        **env,
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),  # a fresh compile cache, as first_release's
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",  # the hf CLI asks PyPI for a newer version otherwise
        **BOOT_START_DEFAULTS,  # vLLM's engine core forked from the server, as the flow's boots start it
    }
    base, ckpt, hub, serve = work / "base", work / "ckpt", recipe.hub, recipe.serve
    # Written before the clock starts, as a person has them ready: the llm-compressor recipe, the script,
    # the lm-eval group file.
    (work / "recipe.yaml").write_text(build_llmcompressor_recipe(recipe.quantization))
    # On a GPU the model goes on it, as the flow places a model that fits (an 8B on an H200: 9 times over).
    params = m.oneshot_params(
        recipe,
        base,
        ckpt,
        work / "recipe.yaml",
        device="cuda:0" if gpu.usable_memory_bytes() is not None else None,
    )
    (work / "oneshot.py").write_text(m.oneshot_script(params))
    evaluate = lm_eval_settings(recipe, work / "lm-eval-tasks")
    marks, commands, steps = Marks(), {}, {}
    record: dict[str, Any] = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "session_started": session,
        "device": res.card(),
        "preceded_by": preceded_by,
        "complete": False,
        "wall_seconds": None,
        "decision_inputs_seconds": None,
        "elapsed_seconds": 0.0,
        "stage_seconds": marks.stages,
        "step_seconds": steps,
        "calibration": None,
        "tasks": [t.task for t in recipe.gates.accuracy.tasks],
        "boots": [],
        "boot_seconds": {},
        "capacity": {},
        "base_reused_from": None,
        "decision": None,
        "repo_id": hub.repo_id,
        "commands": commands,
        "oneshot": {k: v for k, v in params.items() if k not in ("model", "out", "recipe")},
        "lm_eval": {
            **{k: v for k, v in evaluate.items() if k not in ("include_path", "samples")},
            "group_file": (work / "lm-eval-tasks" / f"{m.GATE_GROUP}.yaml").read_text(),
        },
        "environment": {
            k: env.get(k) for k in ("VLLM_CACHE_ROOT", "VLLM_USE_FLASHINFER_SAMPLER", *BOOT_START_DEFAULTS)
        },
        "overrides": overrides,
    }
    res.replace_run("manual", record)

    saving = threading.Lock()

    def save() -> None:  # the record on disk: a run cut short keeps its stages and how long it had run
        with saving:
            if not record["complete"]:
                record.update(elapsed_seconds=marks.elapsed(), measured=time.strftime("%Y-%m-%dT%H:%M:%S"))
            record_ratio(res)
            res.save()

    def mark(stage: str) -> None:
        marks.done(stage)
        save()

    def uploaded_after(seconds: float) -> None:
        with saving:
            steps["upload (in the background)"] = round(seconds, 1)

    ended = threading.Event()

    def save_while_running() -> None:  # a session's end inside a long stage (lm_eval's) still bounds the
        while not ended.wait(PROGRESS_EVERY_S):  # ratio by how long the run had been going
            try:
                save()
            except RuntimeError:  # the record changed as it was written (the file is replaced whole)
                continue

    threading.Thread(target=save_while_running, daemon=True).start()

    def run(step: str, argv: list[Any], **kwargs: Any) -> None:
        commands[step] = m.typed(argv)
        t0 = time.monotonic()
        m.sh(argv, env=env, log=work / f"{step.replace(' ', '-')}.log", **kwargs)
        steps[step] = round(time.monotonic() - t0, 1)

    def boot(name: str, model: Path, kv_dtype: str) -> m.Serve:
        s = m.Serve(
            model,
            kv_dtype,
            m.kv_budget(serve, model),
            serve=serve,
            env=env,
            log=work / f"vllm-{name}.log",
            cli=True,
            python=serving_python,
            ready_timeout_s=ready_timeout_s,
        )
        commands[f"serve {name}"] = m.typed(s.argv).replace(f"--port {s.port}", "--port PORT")
        return s

    def up(name: str, s: m.Serve) -> None:
        record["boot_seconds"][name] = steps[f"boot {name}"] = s.boot_seconds
        record["capacity"][name] = m.cache_info(s.metrics())

    def evaluate_on(name: str, s: m.Serve, tokenizer: Path) -> None:  # from work: the group file's folder
        run(
            f"lm_eval {name}",
            m.lm_eval_argv(s.url, tokenizer, work / f"lm-eval-{name}", **evaluate),
            cwd=work,
        )

    upload = None
    try:
        run("download", m.download_argv(production.BASE_ID, base))
        mark("base downloaded")
        run("oneshot", [m.PY, work / "oneshot.py"])
        calibration = m.CALIBRATION_LINE.search((work / "oneshot.log").read_text(errors="replace"))
        if calibration:
            record["calibration"] = {"samples": int(calibration[1]), "tokens": int(calibration[2])}
        mark("quantized")
        upload_argv = m.upload_argv(hub.repo_id, ckpt, private=hub.private)
        commands["upload"] = m.typed(upload_argv)
        t_upload = time.monotonic()
        with (work / "upload.log").open("w") as upload_log:  # beside the boots, as the flow pushes
            upload = subprocess.Popen(
                upload_argv, env=env, stdout=upload_log, stderr=subprocess.STDOUT, start_new_session=True
            )
        uploaded = threading.Thread(
            target=lambda: (upload.wait(), uploaded_after(time.monotonic() - t_upload)),
            daemon=True,
        )
        uploaded.start()
        with boot("base", base, "auto") as s:
            up("base", s)
            evaluate_on("base", s, base)
        mark("base served")
        with boot("w4a16", ckpt, sixteen_bit_kv_dtype(ckpt)) as s:
            up("w4a16", s)
        mark("quantized served")
        with boot("w4a16-fp8kv", ckpt, serve.kv_cache_dtype) as s:
            up("w4a16-fp8kv", s)
            evaluate_on("w4a16-fp8kv", s, ckpt)
            t0 = time.monotonic()
            m.stress_by_hand(s, recipe, ckpt, work / "stress", env=env, python=serving_python)
            steps["stress (ramp and final bench)"] = round(time.monotonic() - t0, 1)
        mark("fp8 served")
        uploaded.join()
        if upload.returncode != 0:
            raise RuntimeError(
                f"hf upload exited {upload.returncode}: {(work / 'upload.log').read_text()[-2000:]}"
            )
        mark("candidate pushed")
        record["decision_inputs_seconds"] = marks.elapsed()
        run("tag", m.tag_argv(hub.repo_id, hub.release_ref, hub.release_ref_kind))
        marks.done("released")
        with saving:
            record.update(
                complete=True,
                wall_seconds=marks.elapsed(),
                elapsed_seconds=marks.elapsed(),
                measured=time.strftime("%Y-%m-%dT%H:%M:%S"),
            )
        record["stress"] = dict(zip(("ramp", "final"), m.stress_steps(recipe, ckpt), strict=True))
    finally:
        ended.set()
        if upload is not None and upload.poll() is None:
            stop_process_group(upload, grace_s=30)
        with saving:
            record["boots"] = boot_logs(work)
            res.save()
    log(f"manual: wall {record['wall_seconds']} s, stages {marks.stages}")


def record_ratio(res: Results) -> None:
    """``ratio_vs_careful_manual`` and where its two walls came from (careful_manual_ratio), in --out."""
    ratio = m.careful_manual_ratio(res.data.get("runs", {}))
    res.data["ratio_vs_careful_manual"] = ratio["ratio"] if ratio else None
    res.data["ratio_vs_careful_manual_from"] = ratio and {k: v for k, v in ratio.items() if k != "ratio"}
    res.data["manual_note"] = MANUAL_NOTE
