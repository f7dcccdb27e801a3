"""The quantize-serve command line: one screen per user error (field, value, fix; exit 2, no
traceback), `validate` and `plan` (tests/flows/test_cli.py: `run` through the flow)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from quantize_serve.capacity import plan_table, planner
from quantize_serve.cli import _WithoutUserTraceback, main
from quantize_serve.core.errors import HubError, RecipeError, RecipeErrors
from quantize_serve.recipe.load import load_recipe, parse_recipe
from tests.conftest import ROOT, local_hub_server
from tests.unit.malformed_recipes import CROSS_SECTION_CASES, ISSUE_CASES, Case, recipe_data, write_case

SHIPPED = sorted((ROOT / "recipes").glob("*.yaml"))


SCRIPT = Path(sys.executable).parent / "quantize-serve"


HEAVY = ("torch", "prefect", "datasets", "transformers", "vllm", "llmcompressor", "lm_eval")


MAX_LINES_ONE_ERROR = 15


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The installed console script (``pip install -e .`` puts it next to the interpreter)."""
    assert SCRIPT.is_file(), f"{SCRIPT} is missing: run `{sys.executable} -m pip install --no-deps -e .`"
    return subprocess.run(
        [str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out + out.err


def assert_one_screen(case: Case, rc: int, text: str) -> None:
    assert rc == 2, text
    assert "Traceback" not in text, text
    assert case.field in text, f"the field {case.field!r} is not named:\n{text}"
    assert case.fix in text, f"the fix does not mention {case.fix!r}:\n{text}"
    assert "fix: " in text
    assert len(text.splitlines()) <= MAX_LINES_ONE_ERROR, text


@pytest.mark.parametrize("case", ISSUE_CASES, ids=lambda c: c.name)
def test_issue_cases_fail_with_one_screen(case: Case, tmp_path: Path, capsys) -> None:
    rc, text = run_main(capsys, "validate", str(write_case(case, tmp_path)))
    assert_one_screen(case, rc, text)
    assert text.count("fix: ") == 1, "one mistake, one problem"


@pytest.mark.parametrize("case", CROSS_SECTION_CASES, ids=lambda c: c.name)
def test_recipe_only_rules_fail_at_load(case: Case, tmp_path: Path, capsys) -> None:
    rc, text = run_main(capsys, "validate", str(write_case(case, tmp_path)))
    assert_one_screen(case, rc, text)


@pytest.mark.parametrize("name", ["yaml-syntax-error", "misspelled-section", "bad-recovery-1.5"])
def test_console_script_exits_2_with_one_screen(name: str, tmp_path: Path) -> None:
    case = next(c for c in ISSUE_CASES if c.name == name)
    t0 = time.monotonic()
    done = cli("validate", str(write_case(case, tmp_path)))
    assert_one_screen(case, done.returncode, done.stdout + done.stderr)
    assert time.monotonic() - t0 < 5  # about 0.3 s here; the bound leaves room for a loaded machine


def test_yaml_error_shows_line_column_and_the_line(tmp_path: Path, capsys) -> None:
    case = next(c for c in ISSUE_CASES if c.name == "yaml-syntax-error")
    rc, text = run_main(capsys, "validate", str(write_case(case, tmp_path)))
    assert "mapping values are not allowed here" in text
    lines = text.splitlines()
    offending = next(i for i, line in enumerate(lines) if line.endswith("|     bits: 4"))
    caret = lines[offending + 1]
    assert caret.index("^") == lines[offending].index("bits: 4") + len("bits")  # under the ':'


def test_misspelled_section_is_one_error_not_two(tmp_path: Path) -> None:
    data = recipe_data(tmp_path)
    data["quantisation"] = data.pop("quantization")
    with pytest.raises(RecipeErrors) as info:
        parse_recipe(data, source="x.yaml", base_dir=tmp_path)
    (err,) = info.value.errors
    assert (err.field, err.problem) == ("quantisation", "unknown key; did you mean 'quantization'?")
    assert str(err).startswith(
        "x.yaml: quantisation = '{...}': unknown key; did you mean 'quantization'? Fix:"
    )


def test_unknown_key_without_a_near_miss_lists_the_allowed_keys(tmp_path: Path) -> None:
    data = recipe_data(tmp_path)
    data["serve"]["zzz"] = 1
    with pytest.raises(RecipeErrors) as info:
        parse_recipe(data, source="x.yaml", base_dir=tmp_path)
    (err,) = info.value.errors
    assert err.field == "serve.zzz" and "max_model_len" in err.fix and "did you mean" not in err.problem


def test_a_genuinely_missing_section_is_still_reported(tmp_path: Path) -> None:
    data = recipe_data(tmp_path)
    del data["quantization"]
    with pytest.raises(RecipeErrors) as info:
        parse_recipe(data, source="x.yaml", base_dir=tmp_path)
    assert [e.field for e in info.value.errors] == ["quantization"]
    assert "add the field" in info.value.errors[0].fix


def test_token_is_never_echoed(tmp_path: Path, capsys) -> None:
    case = next(c for c in ISSUE_CASES if c.name == "token-in-recipe")
    rc, text = run_main(capsys, "validate", "--debug", str(write_case(case, tmp_path)))
    assert rc == 2 and "hf_abcdefghijklmnopqrstuvwxyz" not in text


def test_debug_prints_the_traceback(tmp_path: Path, capsys) -> None:
    case = next(c for c in ISSUE_CASES if c.name == "odd-group-size")
    rc, text = run_main(capsys, "validate", "--debug", str(write_case(case, tmp_path)))
    assert rc == 2 and "Traceback" in text and "quantization.group_size" in text


def test_several_recipes_report_each_and_exit_2(tmp_path: Path, capsys) -> None:
    bad = [write_case(c, tmp_path) for c in ISSUE_CASES[:3]]
    rc, text = run_main(capsys, "validate", str(SHIPPED[0]), *map(str, bad))
    assert rc == 2
    assert text.count("1 problem") == 3 and "1 of 4 recipes valid" in text
    assert text.count("--debug prints the traceback") == 1


def test_model_and_calibration_problems_are_reported_together(tmp_path: Path, capsys) -> None:
    data = recipe_data(tmp_path)
    data["serve"]["max_model_len"] = 4096
    data["calibration"]["num_samples"] = 10_000
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(data))
    rc, text = run_main(capsys, "validate", str(path))
    assert rc == 2 and "2 problems" in text
    assert "serve.max_model_len = 4096" in text and "calibration.num_samples = 10000" in text


def test_shipped_recipes_validate(capsys) -> None:
    rc, text = run_main(capsys, "validate", *map(str, SHIPPED))
    assert rc == 0, text
    assert f"{len(SHIPPED)} of {len(SHIPPED)} recipes valid" in text
    production = next(line for line in text.splitlines() if "llama3-8b-instruct-awq.yaml" in line)
    assert "valid offline" in production  # a Hub model and a Hub dataset: said, not failed
    assert "not checked: model.id 'meta-llama/Meta-Llama-3-8B-Instruct' is a Hub repo" in text
    assert "not checked: calibration.dataset 'HuggingFaceH4/ultrachat_200k' is a Hub dataset" in text
    tiny = next(line for line in text.splitlines() if "tiny-llama-awq.yaml" in line)
    assert "512 rows, field 'text'" in tiny and "not checked" not in tiny


def test_shipped_recipes_through_the_console_script() -> None:
    done = cli("validate", *(str(p.relative_to(ROOT)) for p in SHIPPED))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_validate_and_plan_import_neither_prefect_nor_torch() -> None:
    code = (
        "import sys\n"
        "from quantize_serve.cli import main\n"
        f"assert main(['validate', *{[str(p) for p in SHIPPED]!r}]) == 0\n"
        "assert main(['plan', 'recipes/tiny-llama-awq.yaml']) == 0\n"
        "assert main(['plan', '--model', 'models/tiny-llama', '--gpu', 'h100-80gb']) == 0\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout


def test_peek_counts_rows_and_columns_like_datasets(tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from quantize_serve.quantize.calibration import _peek_file

    files = {
        "rows.jsonl": ('{"text": "a", "n": 1}\n\n{"text": "b", "n": 2}\n', "json"),
        "rows.json": (json.dumps([{"text": "a"}, {"text": "b"}, {"text": "c"}]), "json"),
        "rows.csv": ('text,id\n"two\nlines",1\nplain,2\n\n', "csv"),
        "rows.txt": ("one\n\nthree\n", "text"),
    }
    for name, (content, _) in files.items():
        (tmp_path / name).write_text(content)
    pq.write_table(pa.table({"text": ["x", "y"], "k": [1, 2]}), tmp_path / "rows.parquet")
    files["rows.parquet"] = ("", "parquet")
    shipped = ROOT / "data" / "calibration"
    cases = [(tmp_path / n, b) for n, (_, b) in files.items()] + [
        (p, "json") for p in shipped.glob("*.jsonl")
    ]
    for path, builder in cases:
        ds = datasets.load_dataset(
            builder, data_files=[str(path)], split="train", cache_dir=str(tmp_path / "c")
        )
        assert _peek_file(path, builder) == (list(ds.column_names), len(ds)), path.name


def test_plan_prints_the_planners_own_table(capsys) -> None:
    rc, text = run_main(
        capsys,
        "plan",
        "--model",
        "models/tiny-llama",
        "--gpu",
        "h100-80gb",
        "--tp",
        "2",
        "--max-model-len",
        "512",
        "--kv-cache-dtype",
        "fp8_e5m2",
    )
    assert rc == 0
    expected = plan_table.format_table(
        plan_table.plan_table(
            planner.ModelShape.from_config(ROOT / "models/tiny-llama"),
            device_memory_bytes=planner.GPU_MEMORY_BYTES["h100-80gb"],
            max_model_len=512,
            tensor_parallel_size=2,
            fp8_kv_cache_dtype="fp8_e5m2",
            model="models/tiny-llama",
        )
    )
    assert text.strip() == expected.strip()


def test_plan_of_a_recipe_uses_its_serve_settings(capsys, monkeypatch) -> None:
    from quantize_serve.serving import gpu

    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: None)  # a CPU host: its budget applies
    rc, text = run_main(capsys, "plan", "recipes/tiny-llama-awq.yaml", "--json")
    assert rc == 0
    table = plan_table.PlanTable.model_validate_json(text)
    row = table.rows["w4a16-fp8kv"]
    recipe = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    assert (row.mode, row.device_memory_bytes, row.max_model_len) == (
        "fixed_budget",
        int(recipe.serve.memory_budget),
        recipe.serve.max_model_len,
    )
    assert row.scheme == "W4A16_ASYM" and row.block_size == planner.BLOCK_SIZE_CPU
    rc, text = run_main(capsys, "plan", "recipes/tiny-llama-awq.yaml", "--gpu", "150109880320", "--json")
    row = plan_table.PlanTable.model_validate_json(text).rows["base"]
    assert (row.mode, row.device_memory_bytes, row.gpu_memory_utilization) == ("gpu", 150109880320, 0.90)


def test_plan_rejects_unknown_gpu_and_missing_model(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", "--model", "models/tiny-llama", "--gpu", "a100"])
    assert info.value.code == 2 and "h100-80gb, h200" in capsys.readouterr().err
    rc, text = run_main(capsys, "plan", "--model", "./models/no-such-model")  # ./: a folder, not a Hub id
    assert rc == 2 and "--model" in text and "fix: " in text and "Traceback" not in text


def test_plan_of_a_hub_model_when_the_hub_is_away() -> None:
    t0 = time.monotonic()
    done = cli("plan", "--model", "org/some-model", env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "fetch config.json on org/some-model failed" in done.stderr
    assert time.monotonic() - t0 < 10


def test_plan_of_a_hub_model_fetches_config_json_only(tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub import constants as hf_constants

    token = "hf_CliTestToken0123456789abcdef"
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)  # the local hub speaks plain LFS
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)  # the suite sets HF_HUB_OFFLINE=1
    with local_hub_server(tmp_path, tokens=(token,)) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("org/tiny-llama", private=True)
        api.upload_file(
            path_or_fileobj=str(ROOT / "models/tiny-llama/config.json"),
            path_in_repo="config.json",
            repo_id="org/tiny-llama",
        )
        env = {
            "HF_ENDPOINT": hub.endpoint,
            "HF_TOKEN": token,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_OFFLINE": "0",
        }
        done = cli("plan", "--model", "org/tiny-llama", "--gpu", "h200", "--json", env=env)
        assert done.returncode == 0, done.stderr
        assert plan_table.PlanTable.model_validate_json(done.stdout).model == "org/tiny-llama"
        assert [p.name for p in (tmp_path / "hf").rglob("snapshots/*/*")] == ["config.json"]
        missing = cli("plan", "--model", "org/nothing-here", env=env)
        assert missing.returncode == 2 and "Traceback" not in missing.stderr
        assert "not found" in missing.stderr and len(missing.stderr.splitlines()) <= MAX_LINES_ONE_ERROR


def test_run_of_a_bad_recipe_fails_before_prefect_starts(tmp_path: Path) -> None:
    case = next(c for c in ISSUE_CASES if c.name == "bad-recovery-1.5")
    path = write_case(case, tmp_path)
    # before any heavy work: none of the engines is imported (a bound on seconds would be a timed test)
    code = (
        "import sys\n"
        "from quantize_serve.cli import main\n"
        f"rc = main(['run', {str(path)!r}])\n"
        "heavy = [m for m in ('prefect', 'torch', 'transformers', 'vllm', 'lm_eval') if m in sys.modules]\n"
        "print('RESULT', rc, ','.join(heavy) or '-')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    rc, heavy = done.stdout.split("RESULT ")[1].split()
    assert (rc, heavy) == ("2", "-"), done.stderr
    assert_one_screen(case, int(rc), done.stderr)


def test_console_log_drops_the_traceback_of_user_errors_only() -> None:
    formatter = _WithoutUserTraceback(logging.Formatter("%(message)s"))

    def record(exc: BaseException) -> logging.LogRecord:
        try:
            raise exc
        except BaseException:
            return logging.LogRecord(
                "prefect.flow_runs",
                logging.ERROR,
                __file__,
                1,
                "Encountered exception during execution: %r",
                (exc,),
                sys.exc_info(),
            )

    user = record(RecipeError("r.yaml", "serve.max_model_len", 9, "too long", "lower it"))
    assert "Traceback" not in formatter.format(user) and "too long" in formatter.format(user)
    assert user.exc_info is not None  # the record itself (what the API handler sends) is untouched
    assert "Traceback" in formatter.format(record(HubError("the Hub is down")))
    assert "Traceback" in formatter.format(record(KeyError("bug")))


def test_release_ref_rules_match_the_hub_module() -> None:
    from quantize_serve.hub import publish as hub
    from quantize_serve.recipe.section import CANDIDATE_BRANCH, REJECTION_TAG_PREFIX

    assert hub.rejection_tag("a" * 40).startswith(REJECTION_TAG_PREFIX)
    assert CANDIDATE_BRANCH == "main"


def test_plan_takes_a_bare_config_json_and_says_where_the_base_fits(capsys) -> None:
    assert main(["plan", "--model", str(ROOT / "benchmarks" / "configs" / "llama-3-70b.json")]) == 0
    out = capsys.readouterr().out
    assert "- base does not fit at TP 1: weights 131.42 GiB/GPU" in out and "; fits at TP 2" in out


def test_plan_says_what_config_json_left_out_and_labels_the_production_row_by_its_kv_dtype(
    capsys, tmp_path
) -> None:
    """Issue 43: a Llama config without num_key_value_heads, and --kv-cache-dtype auto."""
    config = json.loads((ROOT / "benchmarks" / "configs" / "llama-3-8b.json").read_text())
    del config["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    rc, text = run_main(capsys, "plan", "--model", str(tmp_path / "config.json"))
    assert rc == 0, text
    assert (
        "- note: config.json has no num_key_value_heads: planned with 32 KV heads, one per attention head"
        in text
    ), text
    assert (
        "| 524,288 |" in text
    )  # 2 x 32 layers x 32 heads x 128 x 2 bytes: the base row's KV bytes per token
    rc, text = run_main(capsys, "plan", "--model", "models/tiny-llama", "--kv-cache-dtype", "auto")
    assert rc == 0 and "| w4a16-16bitkv |" in text and "| w4a16-fp8kv |" not in text, text


FIXTURE_CONFIGS = ROOT / "tests" / "fixtures" / "configs"


def test_plan_of_an_moe_config_prints_the_moe_plan(capsys) -> None:
    rc, text = run_main(capsys, "plan", "--model", str(FIXTURE_CONFIGS / "qwen3-30b-a3b.json"))
    assert rc == 0, text
    for needle in (
        "mixture of experts: 30.53 B parameters, 3.35 B active per token",
        "128 experts in 48 of 48",
        "Expert weights (routed and shared, whole checkpoint): 54.00 GiB bf16, 13.92 GiB W4A16",
        "| base | 56.87 |",
        "| 0.56 est. + 0.94 pool |",
    ):
        assert needle in text, text
    rc, text = run_main(capsys, "plan", "--model", str(FIXTURE_CONFIGS / "qwen3-30b-a3b.json"), "--json")
    table = plan_table.PlanTable.model_validate_json(text)
    assert table.summary is not None and table.summary.active_parameters == 3_353_032_704
    w4a16 = table.rows["w4a16"].weights
    assert w4a16 is not None and w4a16.routed_experts == 14_948_646_912


def test_plan_cuda_graph_options(capsys) -> None:
    config = str(FIXTURE_CONFIGS / "qwen2-72b.json")
    rc, text = run_main(capsys, "plan", "--model", config, "--enforce-eager", "--json")
    rows = plan_table.PlanTable.model_validate_json(text).rows.values()
    assert rc == 0 and all(r.cudagraph_source == "off" for r in rows)
    rc, text = run_main(capsys, "plan", "--model", config, "--cudagraph-memory", "0.72GiB")
    assert rc == 0 and "| 0.72 est. + 1.56 pool |" in text and "as given" in text, text
    with pytest.raises(SystemExit) as info:
        main(["plan", "--model", config, "--enforce-eager", "--cudagraph-memory", "1GiB"])
    assert info.value.code == 2 and "not allowed with" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["plan", "--model", config, "--cudagraph-memory", "lots"])
    assert info.value.code == 2 and "is not a memory size" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, field",
    [
        ("deepseek-v3.json", "kv_lora_rank"),
        ("mistral-7b-v0.1.json", "sliding_window"),
        ("gemma-2-9b.json", "sliding_window"),
        ("no-intermediate", "intermediate_size"),
    ],
)
def test_plan_of_a_config_it_cannot_model_exits_2_with_one_screen(
    name: str, field: str, tmp_path: Path, capsys
) -> None:
    path = FIXTURE_CONFIGS / name
    if name == "no-intermediate":  # the KeyError traceback of issue 25
        config = json.loads((ROOT / "benchmarks/configs/llama-3-8b.json").read_text())
        del config["intermediate_size"]
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
    rc, text = run_main(capsys, "plan", "--model", str(path))
    assert rc == 2 and "Traceback" not in text and "KeyError" not in text, text
    assert f"  {field} = " in text and "fix: " in text and str(path) in text, text
    assert len(text.splitlines()) <= MAX_LINES_ONE_ERROR, text


def test_console_script_refuses_an_unplannable_config() -> None:
    done = cli("plan", "--model", str(FIXTURE_CONFIGS / "deepseek-v3.json"))
    assert done.returncode == 2 and "Traceback" not in done.stderr and "kv_lora_rank = 512" in done.stderr


def test_validate_refuses_a_base_model_the_planner_cannot_model(tmp_path: Path, capsys) -> None:
    """Every run plans its boots from config.json: a model the planner cannot model stops at validation,
    not at the capacity stage after quantizing."""
    model = tmp_path / "model"
    shutil.copytree(ROOT / "models" / "tiny-llama", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "sliding_window": 256}))
    data = recipe_data(tmp_path)
    data["model"]["id"] = "model"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data))
    rc, text = run_main(capsys, "validate", str(recipe))
    assert rc == 2 and "Traceback" not in text, text
    assert text.count("fix: ") == 1 and "config.json: 1 problem\n  sliding_window = 256: " in text, text
