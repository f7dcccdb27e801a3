"""The release-time benchmark's choice of runs (a session that cannot hold all four measures some; a
re-release never runs without the first release it re-releases), the careful engineer's commands built
from the recipe (benchmarks/manual.py, as h200_release_time.py --runs manual and pipeline_vs_manual.py
type them), and the flow-to-manual ratio with where its two walls came from. No engine runs here."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from benchmarks import h200_release_time as release_time
from benchmarks.harness import Results
from benchmarks import manual
from benchmarks import production_stack as production
from benchmarks import release_time_manual as manual_path
from localhub.datasets import MMLU_SUBJECTS
from quantize_serve.quantize.worker import calibration_arguments
from quantize_serve.recipe.load import load_recipe
from tests.conftest import ROOT

PRODUCTION = {"gates.accuracy.tasks": release_time.TASKS}  # first_release's overrides on the H200


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize(
    ("runs", "message"),
    [
        (
            "re_release",
            "or --base-reference h200_base_reference.json from a first release of another session",
        ),
        ("re_release,manual", "re_release needs first_release in the same invocation"),
        ("re_release_warm", "re_release_warm needs first_release, re_release or warm_up before it"),
        ("warm_up,re_release_warm", "re_release_warm needs first_release in the same invocation, or --base"),
        ("baseline,bogus", "--runs: unknown bogus"),
        (",", "--runs: name at least one of"),
    ],
)
def test_runs_that_cannot_be_measured_are_refused_before_anything_starts(
    runs, message, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(release_time, "cmd_run", lambda args: pytest.fail("the run must not start"))
    with pytest.raises(SystemExit) as exit_info:
        release_time.main(
            ["--cpu-smoke", "--state", str(tmp_path), "--out", str(tmp_path / "out.json"), "--runs", runs]
        )
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_session_may_measure_the_baseline_alone_the_two_releases_or_the_manual_path_alone(
    tmp_path, monkeypatch
):
    picked = []
    monkeypatch.setattr(release_time, "cmd_run", lambda args: picked.append(args.runs))
    for runs in (
        "baseline",
        "first_release,re_release",
        "manual",
        "manual,first_release",
        "re_release_warm,first_release",
        None,
    ):
        extra = ["--runs", runs] if runs else []
        release_time.main(
            ["--cpu-smoke", "--state", str(tmp_path), "--out", str(tmp_path / "o.json"), *extra]
        )
    # always run in one order: the manual path after the flow's runs of its session
    assert picked == [
        ["baseline"],
        ["first_release", "re_release"],
        ["manual"],
        ["first_release", "manual"],
        ["first_release", "re_release_warm"],
        ["baseline", "first_release", "re_release", "warm_up", "re_release_warm", "manual"],
    ]
    assert release_time.RUNS[-1] == "manual" and "manual" not in release_time.FLOW_RUNS


def test_a_re_release_in_a_later_session_knows_its_base_from_the_first_releases_reference(
    tmp_path, monkeypatch
):
    """A first release and its re-release do not fit one session's device time: the first release's base
    reference is kept beside --out, and a later session's re_release runs alone with it in its work dir."""
    from quantize_serve.report.base_reference import find_reference, save_reference
    from tests.release_fixtures import placeholder_reference

    # a path on the host, as the flow stores its tasks' raw results (results_path)
    ref = placeholder_reference("k1", "run-1").model_copy(
        update={"run_dir": str(tmp_path / "session-1/run-1")}
    )
    save_reference(tmp_path / "session-1", ref)
    kept = tmp_path / release_time.BASE_REFERENCE_FILE
    release_time.keep_base_reference(tmp_path / "session-1", tmp_path, (tmp_path,))
    assert str(tmp_path) not in kept.read_text()  # it is committed: paths relative to the state folder
    carried = release_time.carry_base_reference(kept, tmp_path / "session-2")
    assert carried == {"file": release_time.BASE_REFERENCE_FILE, "run_id": "run-1", "key": "k1"}
    found = find_reference(tmp_path / "session-2", "k1")
    assert found.run_dir == "session-1/run-1" and found.accuracy.server_base_url == "http://127.0.0.1:PORT"
    assert (found.capacity, found.accuracy.tasks, found.factors) == (
        ref.capacity,
        ref.accuracy.tasks,
        ref.factors,
    )
    picked = []
    monkeypatch.setattr(release_time, "cmd_run", lambda args: picked.append((args.runs, args.base_reference)))
    argv = [
        "--cpu-smoke",
        "--state",
        str(tmp_path),
        "--out",
        str(tmp_path / "o.json"),
        "--runs",
        "re_release",
    ]
    release_time.main([*argv, "--base-reference", str(kept)])
    # and once more on the host it leaves (the persistent host's case: download and compile cache warm)
    release_time.main([*argv[:-1], "re_release,re_release_warm", "--base-reference", str(kept)])
    # or after a cheaper warm-up of that host
    release_time.main([*argv[:-1], "re_release_warm,warm_up", "--base-reference", str(kept)])
    assert picked == [
        (["re_release"], str(kept)),
        (["re_release", "re_release_warm"], str(kept)),
        (["warm_up", "re_release_warm"], str(kept)),
    ]


def test_the_warm_up_cuts_the_gates_and_nothing_that_keys_the_compile_cache(tmp_path):
    """warm_up leaves the host as a re-release would (the base's download, the production boot's compile
    cache) for less device time: its gates are cut, its serve settings are every run's."""
    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml", PRODUCTION)
    plan = {
        name: (overrides, env)
        for name, overrides, env in release_time.run_plan(recipe, PRODUCTION, {}, tmp_path)
    }
    assert list(plan) == list(release_time.FLOW_RUNS)
    warm_up, re_release = plan["warm_up"][0], plan["re_release_warm"][0]
    assert {k for k in warm_up if warm_up[k] != re_release.get(k)} == {
        "calibration.shuffle_seed",  # quantized anew, as each re-release is
        "gates.accuracy.tasks",
        "gates.stress.num_requests",
        "gates.stress.output_tokens",
    }
    seeds = [plan[n][0]["calibration.shuffle_seed"] for n in ("re_release", "warm_up", "re_release_warm")]
    assert len(set(seeds)) == 3 and recipe.calibration.shuffle_seed not in seeds
    assert [t["limit"] for t in warm_up["gates.accuracy.tasks"]] == [3, 3, 3, 1]
    assert warm_up["gates.stress.num_requests"] == recipe.gates.stress.concurrency == 128  # one wave
    cut = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml", warm_up)  # a recipe the flow takes
    assert cut.serve == recipe.serve
    assert plan["warm_up"][1] == plan["re_release_warm"][1] == plan["first_release"][1]  # one work dir


def test_the_baseline_turns_every_speed_up_off_by_one_setting(tmp_path, monkeypatch):
    """The baseline sets QS_STEPS=baseline, and that one value means what its seven switches did: three
    settings off, vLLM's workers spawned, three recipe fields as the run's overrides (report/steps.py)."""
    from quantize_serve.core.settings import Settings
    from quantize_serve.report.steps import baseline_overrides
    from quantize_serve.serving import server

    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml", PRODUCTION)
    plan = {name: (o, env) for name, o, env in release_time.run_plan(recipe, PRODUCTION, {}, tmp_path)}
    (baseline, env), (first, first_env) = plan["baseline"], plan["first_release"]
    assert {k: v for k, v in env.items() if first_env.get(k) != v} == {
        "QS_STEPS": "baseline",
        "QS_WORK_DIR": str(tmp_path / "work-baseline"),
    }
    assert {k for k in baseline if baseline[k] != first.get(k)} == {
        "hub.repo_id",
        "gates.accuracy.num_concurrent",
    }
    monkeypatch.setenv("QS_STEPS", "baseline")
    settings = Settings()
    assert not (settings.prepare_boots or settings.reuse_base_reference or settings.quantize_on_device)
    assert baseline_overrides(settings) == {
        "gates.accuracy.scoring": "echo",
        "gates.accuracy.looks": [1.0],
        "calibration.beside_base": "never",
    }
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    monkeypatch.setattr(server, "get_settings", lambda: settings)
    assert server.serving_env()["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_a_runs_stress_seconds_are_the_tests_and_its_bench():
    assert release_time.stress_seconds(None) is None  # no stress test ran (a failure before it)
    assert release_time.stress_seconds({"duration_s": 131.4, "throughput": None}) == {
        "test": 131.4,
        "bench": None,
    }
    ran = {"duration_s": 131.4, "throughput": {"duration": 48.2, "completed": 512}}
    assert release_time.stress_seconds(ran) == {"test": 131.4, "bench": 48.2}


def test_the_manual_path_does_first_releases_work_in_a_hub_repo_of_its_own():
    recipe, overrides = manual_path.manual_recipe(PRODUCTION, "your-org/Meta-Llama-3-8B-Instruct-AWQ-W4A16")
    assert overrides == {**PRODUCTION, "hub.repo_id": "your-org/Meta-Llama-3-8B-Instruct-AWQ-W4A16-manual"}
    assert recipe.hub.repo_id.endswith("-manual") and recipe.hub.release_ref == "production"
    assert [(t.task, t.num_fewshot, t.limit) for t in recipe.gates.accuracy.tasks] == [
        ("gsm8k", 5, 850),
        ("arc_challenge", 25, None),
        ("hellaswag", 10, 1000),
        ("mmlu", 5, 20),
    ]


def test_vllm_serve_takes_the_recipes_serve_settings_on_the_gpu_without_a_kv_budget():
    recipe, _ = manual_path.manual_recipe(PRODUCTION, "org/repo")
    assert manual.kv_budget(recipe.serve, Path("unused")) is None  # no memory_budget: vLLM sizes the KV cache
    argv = manual.serve_argv(recipe.serve, "ckpt", kv_dtype="fp8", kv_bytes=None, port=8000, cli=True)
    assert manual.typed(argv) == (
        "vllm serve ckpt --served-model-name model --max-model-len 8192 --max-num-seqs 128 "
        "--max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 --kv-cache-dtype fp8 --port 8000"
    )
    assert (
        "--enforce-eager" not in argv and "--kv-cache-memory-bytes" not in argv
    )  # CUDA graphs, as the recipe


def test_the_cpu_smoke_serves_with_the_overridden_budget_and_eager():
    recipe, _ = manual_path.manual_recipe({**PRODUCTION, **release_time.SMOKE_OVERRIDES}, "org/repo")
    base = ROOT / "models/tiny-llama"
    kv = manual.kv_budget(recipe.serve, base)
    assert 0 < kv < 8 << 20  # the 8 MiB budget less the tiny model's weights
    argv = manual.serve_argv(recipe.serve, base, kv_dtype="auto", kv_bytes=kv, port=1, cli=True)
    assert value(argv, "--kv-cache-memory-bytes") == str(kv) and "--enforce-eager" in argv
    assert "--gpu-memory-utilization" not in argv and value(argv, "--max-num-seqs") == "8"


def test_the_cpu_benchmarks_vllm_serve_is_the_one_it_always_typed():
    """pipeline_vs_manual.py's boots, now built from the tiny recipe: the same argv as before."""
    recipe = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    argv = manual.serve_argv(recipe.serve, "M", kv_dtype="fp8", kv_bytes=123, port=8000)
    assert argv == [
        str(manual.SERVE_PY),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "M",
        "--served-model-name",
        "model",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "16",
        "--max-num-batched-tokens",
        "2048",
        "--kv-cache-dtype",
        "fp8",
        "--kv-cache-memory-bytes",
        "123",
        "--enforce-eager",
        "--port",
        "8000",
    ]


def test_one_lm_eval_invocation_runs_every_task_at_its_own_shots_and_limit(tmp_path):
    recipe, _ = manual_path.manual_recipe(PRODUCTION, "org/repo")
    settings = manual_path.lm_eval_settings(recipe, tmp_path)
    group = yaml.safe_load((tmp_path / "release_gate.yaml").read_text())
    assert group == {
        "group": "release_gate",
        "task": [
            {"task": "gsm8k", "num_fewshot": 5},
            {"task": "arc_challenge", "num_fewshot": 25},
            {"task": "hellaswag", "num_fewshot": 10},
            {"group": "mmlu", "num_fewshot": 5},
        ],
    }
    samples = json.loads((tmp_path / "samples.json").read_text())  # --limit's first documents, per task
    assert samples["gsm8k"] == list(range(850)) and samples["hellaswag"] == list(range(1000))
    assert "arc_challenge" not in samples  # no limit: the whole test split
    assert len(samples) == 2 + len(MMLU_SUBJECTS) == 59 and samples["mmlu_anatomy"] == list(range(20))
    # the gate's settings: batch 16, lm-eval's concurrency sized to max_num_seqs, the server's max_model_len
    assert (settings["batch_size"], settings["concurrent"], settings["max_length"]) == (16, 128, 8192)
    argv = manual.lm_eval_argv("http://127.0.0.1:9", "ckpt", "out", **settings)
    assert manual.typed(argv).startswith(
        "lm_eval --model local-completions --model_args base_url=http://127.0.0.1:9"
        "/v1/completions,model=model,tokenizer=ckpt,"
    )
    assert "num_concurrent=128" in value(argv, "--model_args") and "max_length=8192" in value(
        argv, "--model_args"
    )
    assert value(argv, "--tasks") == "release_gate" and value(argv, "--samples") == str(
        tmp_path / "samples.json"
    )
    assert "--limit" not in argv and "--num_fewshot" not in argv


def test_a_fractional_limit_cannot_become_samples():
    recipe, _ = manual_path.manual_recipe({"gates.accuracy.tasks": [{"task": "gsm8k", "limit": 0.5}]}, "o/r")
    with pytest.raises(ValueError, match="fractional limit"):
        manual.gate_group(recipe.gates.accuracy.tasks)


def test_the_oneshot_script_calibrates_on_the_flows_rows_the_docs_way(tmp_path):
    recipe, _ = manual_path.manual_recipe(PRODUCTION, "org/repo")
    params = manual.oneshot_params(recipe, tmp_path / "base", tmp_path / "ckpt", tmp_path / "recipe.yaml")
    assert {
        k: params[k]
        for k in (
            "dataset",
            "subset",
            "split",
            "data_files",
            "messages_field",
            "seed",
            "num_samples",
            "max_seq_len",
            "dtype",
        )
    } == {
        "dataset": "HuggingFaceH4/ultrachat_200k",
        "subset": None,
        "split": "train_sft",
        "data_files": None,
        "messages_field": "messages",
        "seed": 42,
        "num_samples": 256,
        "max_seq_len": 512,
        "dtype": "bfloat16",
    }
    script = manual.oneshot_script(params)
    ast.parse(script)
    # the flow's selection and rendering (quantize/calibration.py, quantize/worker.py)
    assert "ds.shuffle(seed=42).select(range(256))" in script
    assert "apply_chat_template(m, tokenize=False) for m in ds['messages']" in script
    assert "max_length=512, add_special_tokens=False" in script
    assert "from_pretrained(MODEL, dtype='bfloat16', device_map=None)" in script
    assert "save_compressed=True" in script
    # oneshot's arguments are the flow's own (quantize/worker.py), its measured pipeline included
    assert params["arguments"] == calibration_arguments(recipe, None)
    assert params["arguments"]["pipeline"] == "sequential" and not params["arguments"]["propagate_error"]
    assert f"**{params['arguments']!r})" in script


def test_on_a_gpu_the_oneshot_script_places_the_model_as_the_flow_does(tmp_path):
    recipe, _ = manual_path.manual_recipe(PRODUCTION, "org/repo")
    params = manual.oneshot_params(recipe, tmp_path / "b", tmp_path / "c", tmp_path / "r", device="cuda:0")
    script = manual.oneshot_script(params)
    ast.parse(script)
    assert "device_map='cuda:0')" in script
    assert params["arguments"]["sequential_offload_device"] == "cuda:0"
    assert params["arguments"]["num_calibration_samples"] == 256 and params["arguments"]["batch_size"] == 4


def test_the_cpu_benchmarks_oneshot_reads_the_tiny_recipes_local_file():
    recipe = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    params = manual.oneshot_params(recipe, Path("b"), Path("c"), Path("r"))
    assert (params["dataset"], params["split"], params["text_field"], params["arguments"]["batch_size"]) == (
        "json",
        "train",
        "text",
        8,
    )
    assert params["data_files"] == [str(ROOT / "data/calibration/tiny_calibration.jsonl")]
    script = manual.oneshot_script(params)
    assert "data_files=[" in script and "add_special_tokens=True" in script and "select(range(64))" in script


def test_the_stress_test_by_hand_is_the_flows_ramp_and_final_bench():
    recipe, _ = manual_path.manual_recipe(PRODUCTION, "org/repo")
    ramp, final = manual.stress_steps(recipe, ROOT / "models/tiny-llama")
    assert [s["concurrency"] for s in ramp] == [1, 32, 64, 128]
    assert sum(s["num_prompts"] for s in ramp) == 512 and sum(s["overlong"] for s in ramp) == 4
    assert ramp[-1]["overlong"] == 4  # the over-long prompts go into the peak
    assert final == {"concurrency": 128, "num_prompts": 512, "input_len": 1749, "output_len": 277}
    argv = manual.bench_argv("http://h", "ckpt", "out", name="bench", **{k: v for k, v in final.items()})
    assert manual.typed(argv).startswith("vllm bench serve --backend openai --base-url http://h ")
    assert value(argv, "--max-concurrency") == "128" and value(argv, "--num-prompts") == "512"


def test_the_hub_steps_are_the_hf_cli():
    assert manual.typed(manual.download_argv("meta-llama/Meta-Llama-3-8B-Instruct", Path("w/base"))) == (
        "hf download meta-llama/Meta-Llama-3-8B-Instruct --exclude 'original/*' --local-dir w/base"
    )
    assert manual.typed(manual.upload_argv("org/r-manual", Path("w/ckpt"), private=True)).startswith(
        "hf upload org/r-manual w/ckpt . --private --commit-message"
    )
    assert manual.typed(manual.tag_argv("org/r-manual", "production")).startswith(
        "hf repos tag create org/r-manual production"
    )
    assert manual.tag_argv("org/r", "production", "branch")[1:] == [
        "repos",
        "branch",
        "create",
        "org/r",
        "production",
    ]


def test_the_hub_cli_is_the_environments_own_else_the_hosts(tmp_path, monkeypatch):
    if (ROOT / ".venv/bin/hf").is_file():
        assert Path(manual.HF) == ROOT / ".venv/bin/hf"
    host_bin, env_bin = tmp_path / "host-bin", tmp_path / "env-bin"
    host_bin.mkdir()
    env_bin.mkdir()
    (host_bin / "hf").write_text("#!/bin/sh\n")
    (host_bin / "hf").chmod(0o755)
    monkeypatch.setenv("PATH", str(host_bin))
    assert manual.console_script("hf", env_bin) == str(host_bin / "hf")  # set-up reused the host's package
    (env_bin / "hf").write_text("#!/bin/sh\n")
    (env_bin / "hf").chmod(0o755)
    assert manual.console_script("hf", env_bin) == str(env_bin / "hf")


def test_a_published_base_leaves_no_built_marker_without_its_weights(tmp_path):
    class Hub:  # the stack's local Hub, as far as publish_base needs it: what is left on disk is the test
        def create_repo(self, *a, **k):
            pass

        def upload_folder(self, **k):
            return type("Commit", (), {"oid": "c0ffee"})()

    for keep in (True, False):
        model = tmp_path / f"model-{keep}"
        model.mkdir()
        for name in ("build.json", "config.json", "model-00001-of-00001.safetensors"):
            (model / name).write_text("{}")
        assert production.publish_base(Hub(), model, tmp_path / "scratch", keep=keep) == "c0ffee"
        left = sorted(p.name for p in model.iterdir())
        assert left == (
            ["build.json", "config.json", "model-00001-of-00001.safetensors"] if keep else ["config.json"]
        )  # without the marker the next driver on the host builds again


def run(wall, session, **extra):
    return {"wall_seconds": wall, "measured": session, "session_started": session, "device": "H200", **extra}


def test_the_ratio_is_the_first_releases_wall_over_the_manual_wall_with_where_each_came_from():
    runs = {
        "first_release": run(540.0, "2026-12-02T10:00:00", decision="rejected"),
        "manual": run(900.0, "2026-12-03T09:00:00", complete=True),
    }
    ratio = manual.careful_manual_ratio(runs)
    assert ratio == {
        "ratio": 0.6,
        "same_session": False,
        "first_release": {
            "wall_seconds": 540.0,
            "measured": "2026-12-02T10:00:00",
            "session_started": "2026-12-02T10:00:00",
            "device": "H200",
        },
        "manual": {
            "wall_seconds": 900.0,
            "measured": "2026-12-03T09:00:00",
            "session_started": "2026-12-03T09:00:00",
            "device": "H200",
        },
    }
    runs["manual"]["session_started"] = "2026-12-02T10:00:00"
    assert manual.careful_manual_ratio(runs)["same_session"] is True
    del runs["first_release"]["session_started"]  # a run recorded before sessions were: unknown
    assert manual.careful_manual_ratio(runs)["same_session"] is None


def test_a_manual_run_cut_short_bounds_the_ratio_from_above():
    runs = {
        "first_release": run(540.0, "a", decision="passed"),
        "manual": run(None, "b", complete=False, elapsed_seconds=1200.0),
    }
    ratio = manual.careful_manual_ratio(runs)
    assert ratio["ratio"] is None and ratio["ratio_at_most"] == 0.45
    assert ratio["manual_cut_short_after_seconds"] == 1200.0 and ratio["same_session"] is False


def test_runs_on_two_cards_are_not_paired():
    runs = {
        "first_release": run(540.0, "a", decision="rejected", device="NVIDIA H200"),
        "manual": run(None, "b", complete=False, elapsed_seconds=1200.0, device="NVIDIA H100 80GB HBM3"),
    }
    ratio = manual.careful_manual_ratio(runs)
    assert ratio["ratio"] is None and "ratio_at_most" not in ratio
    assert ratio["not_paired"] == "the two runs are on different cards"
    assert ratio["manual"]["device"] == "NVIDIA H100 80GB HBM3"
    runs["manual"].update(complete=True, wall_seconds=900.0)
    assert manual.careful_manual_ratio(runs)["ratio"] is None
    runs["manual"]["device"] = "NVIDIA H200"
    assert manual.careful_manual_ratio(runs)["ratio"] == 0.6


def test_runs_of_two_sessions_on_hosts_of_differing_speed_are_not_paired():
    def runs(flow_download, manual_download, manual_session):
        return {
            "first_release": run(
                571.9, "a", decision="passed", stage_seconds={"base resolved": flow_download}
            ),
            "manual": run(
                None,
                manual_session,
                complete=False,
                elapsed_seconds=1301.0,
                step_seconds={"download": manual_download},
            ),
        }

    slower = manual.careful_manual_ratio(runs(30.9, 48.1, "b"))  # the 2026-12-06 hosts
    assert slower["ratio"] is None and "ratio_at_most" not in slower
    assert "differ in speed" in slower["not_paired"] and "30.9 s" in slower["not_paired"]
    assert slower["base_download_seconds"] == {"first_release": 30.9, "manual": 48.1}
    alike = manual.careful_manual_ratio(runs(30.9, 30.3, "b"))
    assert alike["ratio_at_most"] == 0.44 and alike["base_download_seconds"]["manual"] == 30.3
    one_host = manual.careful_manual_ratio(runs(30.9, 48.1, "a"))  # a warmer page cache, the same host
    assert one_host["ratio_at_most"] == 0.44 and one_host["same_session"] is True


@pytest.mark.parametrize(
    "runs",
    [
        {"first_release": run(540.0, "s", decision="passed")},  # no manual run yet
        {
            "first_release": run(540.0, "s", decision="passed"),
            "manual": run(None, "s", complete=False, elapsed_seconds=0.0),
        },  # it failed at once
        {
            "first_release": run(540.0, "s", decision=None),
            "manual": run(900.0, "s", complete=True),
        },  # flow broke off
        {"manual": run(900.0, "s", complete=True)},
    ],
)
def test_no_ratio_without_both_walls(runs):
    assert manual.careful_manual_ratio(runs) is None


def test_a_flow_runs_wall_ends_with_the_watchs_last_line_not_the_harness_stopping_its_worker(tmp_path):
    import time

    from benchmarks.harness import Results

    class Stack:  # prefect deployment run --watch: its final line, then the worker's stop (here 0.5 s)
        home = tmp_path

        def run_deployment(self, name, *, echo, **kwargs):
            time.sleep(0.2)
            echo("Flow run finished successfully in 'Completed'.")
            time.sleep(0.5)
            return 0, "watch output", None

    res = Results(tmp_path / "out.json")
    res.data["runs"] = {}
    release_time.one_run(
        Stack(),
        res,
        "first_release",
        overrides={},
        env={},
        runs=tmp_path / "runs",
        timeout_s=60,
        session="2026-12-02T05:00:00",
    )
    record = json.loads((tmp_path / "out.json").read_text())["runs"]["first_release"]
    assert 0.2 <= record["wall_seconds"] < 0.5 <= record["driver_seconds"]
    assert record["session_started"] == "2026-12-02T05:00:00"


def test_a_run_cut_short_by_the_sessions_end_leaves_its_stages_on_disk(tmp_path):
    """A production-shaped first release outlasted a session's device time on the H200 and left nothing in
    the JSON. Each stage mark and progress line of the streamed log is saved as it comes ("cut_short");
    the run's final record replaces it."""
    from benchmarks.harness import Results

    out = tmp_path / "out.json"
    seen_mid_run = {}

    class Stack:  # the flow's log lines as `prefect deployment run --watch` relays them
        home = tmp_path

        def run_deployment(self, name, *, echo, **kwargs):
            for line in (
                "▪ 13:58:58.808 5801cabdf5c6 stage done: validated",
                "▪      :47.857 4f23b0b8acc8  256 calibration samples, 300737 tokens",
                "▪ 14:02:45.260 5801cabdf5c6 stage done: quantized",
                "▪ 14:04:36.945 5801cabdf5c6 vLLM (base) healthy at http://127.0.0.1:49643 after 112 s",
                "▪ 14:10:02.107 c6fa532a2d7e lm-eval: arc_challenge look 1 of 4: 213 documents against http://x",
                "▪ 14:10:37.402 c6fa532a2d7e lm-eval: arc_challenge look 1 of 4 done in 35.3 s",
                "▪ 14:16:51.344 c6fa532a2d7e lm-eval arc_challenge: 500 documents in 186 s: acc 0.222",
                "▪ 14:16:52.001 c6fa532a2d7e stress: 419 requests at concurrency 128",
                "▪ 14:17:40.127 c6fa532a2d7e stress: vllm bench serve, 1536 -> 277 tokens, concurrency 128",
                "▪ 14:18:31.950 c6fa532a2d7e stress: passed",
                "▪ 14:16:51.350 c6fa532a2d7e Finished in state Completed()",
            ):
                echo(line)
            seen_mid_run.update(json.loads(out.read_text()))  # what a session's end would leave
            return 0, "▪      :47.857 4f23b0b8acc8  256 calibration samples, 300737 tokens", None

    res = Results(out)
    res.data["runs"] = {}
    release_time.one_run(
        Stack(),
        res,
        "first_release",
        overrides={},
        env={},
        runs=tmp_path / "runs",
        timeout_s=60,
        session="2026-12-02T13:57:23",
    )
    cut = seen_mid_run["cut_short"]["first_release"]
    assert list(cut["stage_done_at"]) == ["validated", "quantized"]
    assert [line.split(": ", 1)[1] for line in cut["log"]] == [
        "256 calibration samples, 300737 tokens",
        "vLLM (base) healthy at http://127.0.0.1:PORT after 112 s",
        "lm-eval: arc_challenge look 1 of 4: 213 documents against http://x",
        "lm-eval: arc_challenge look 1 of 4 done in 35.3 s",
        "lm-eval arc_challenge: 500 documents in 186 s: acc 0.222",
        "stress: 419 requests at concurrency 128",
        "stress: vllm bench serve, 1536 -> 277 tokens, concurrency 128",
        "stress: passed",
    ]
    assert cut["session_started"] == "2026-12-02T13:57:23" and cut["state"].startswith("cut short")
    final = json.loads(out.read_text())
    assert final["cut_short"] == {}  # the finished run's record replaces it
    assert final["runs"]["first_release"]["calibration"] == {"samples": 256, "tokens": 300737}
    assert final["runs"]["first_release"]["log"] == cut["log"]  # where the stages' seconds went, kept


def test_the_task_rows_cost_the_tokens_the_real_datasets_words_would():
    """The served tokenizer's small vocabulary spends ~1.8 tokens on one of the project's words, Llama-3's
    ~TOKENS_PER_WORD on a real one: scaled, an ARC question of 12-40 real words (mean 26) costs what it
    would in production, not ~1.4x that (the H200's first production-shaped run scored 13.2M tokens a
    model)."""
    from transformers import AutoTokenizer

    from localhub.datasets import TOKENS_PER_WORD, arc_rows, tokens_per_word

    tok = AutoTokenizer.from_pretrained(ROOT / "models" / "tiny-llama")
    k = TOKENS_PER_WORD / tokens_per_word(tok)
    assert 0.6 < k < 0.8

    def mean_tokens(rows):
        return sum(len(tok(r["question"], add_special_tokens=False)["input_ids"]) for r in rows) / len(rows)

    production = TOKENS_PER_WORD * 26
    assert abs(mean_tokens(arc_rows(300, seed=5, scale=k)) / production - 1) < 0.1
    assert mean_tokens(arc_rows(300, seed=5)) / production > 1.3  # unscaled: the inflated work


def test_a_run_measured_again_replaces_its_record_and_nothing_else(tmp_path):
    """A run that a session measures again replaces its record as the new one is written; the others stay
    put, and so does a run this session never reached. The file keeps no earlier sessions: git's history
    of the result file does."""
    first = {"measured": "2026-12-04T07:49:05", "wall_seconds": 1022.4}
    warm = {"measured": "2026-12-05T16:10:00", "wall_seconds": 430.2}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"runs": {"first_release": first, "re_release_warm": warm}}))
    res = Results(path)
    res.replace_run("first_release", {"measured": "2026-12-06T09:12:00"})
    assert res.data["runs"] == {"first_release": {"measured": "2026-12-06T09:12:00"}, "re_release_warm": warm}
    res.save()
    assert "earlier_sessions" not in json.loads(path.read_text())
