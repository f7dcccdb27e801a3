"""The first-release guide (docs/getting-started/first-release.md) cannot drift from the product: its
commands, read from the page's bash blocks (tests/first_release_guide.py), are the product's. The cheap
ones run here for real: the step that writes the recipe, `quantize-serve validate` on what it wrote, and
`quantize-serve plan` (the planner; the Llama-3-8B config stands in for the Hub's). Every
`quantize-serve` command parses with the real command line, every `make` target exists, and the
deployment path's pool, concurrency limit, deployment and job variables are prefect.yaml's. The heavy
step, `quantize-serve run`, is tests/flows/test_cli.py's whole run, whose command line comes from the
page (`first_release_guide.run_argv`)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from quantize_serve.cli import build_parser, main
from quantize_serve.core.settings import Settings
from tests import first_release_guide as guide
from tests.conftest import ROOT

SHIPPED = ROOT / "recipes" / "llama3-8b-instruct-awq.yaml"
REPO = "guide-test/first-release"  # a reader's repo, in place of the page's placeholder
PROGRAMS = {"make", "source", "export", "sed", "quantize-serve", "prefect", "vllm"}


def test_every_command_is_one_the_product_has() -> None:
    commands = guide.commands()
    assert commands, f"{guide.GUIDE}: no ```bash block"
    assert {c.split()[0] for c in commands} <= PROGRAMS, commands
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    for command in commands:
        if command.startswith("make "):
            assert command.split()[1] in targets, command
    subcommands = [argv[0] for argv in guide.quantize_serve_argvs()]
    assert {"validate", "plan", "run", "releases"} <= set(subcommands), subcommands
    parser = build_parser()
    for argv in guide.quantize_serve_argvs():
        parser.parse_args(argv)  # an option the command line lost exits 2 here
    assert ["validate", "--remote", guide.RECIPE] in guide.quantize_serve_argvs("validate")
    assert ["plan", guide.RECIPE, "--measure"] in guide.quantize_serve_argvs("plan")


def write_recipe(folder: Path) -> dict:
    """Step 3 as the page gives it, run by bash in ``folder`` (the shipped recipes beside it), the reader's
    repo ``REPO``."""
    (folder / "recipes").symlink_to(ROOT / "recipes", target_is_directory=True)
    step = [c for c in guide.commands() if c.startswith("export REPO=") or c.startswith("sed ")]
    assert len(step) == 2 and guide.RECIPE in step[1], step
    step[0] = f"export REPO={REPO}"
    subprocess.run(["bash", "-euc", "\n".join(step)], cwd=folder, check=True, timeout=30)
    return yaml.safe_load((folder / guide.RECIPE).read_text())


def test_the_recipe_step_changes_only_the_hub_repo(tmp_path: Path) -> None:
    written = write_recipe(tmp_path)
    shipped = yaml.safe_load(SHIPPED.read_text())
    assert written["hub"]["repo_id"] == REPO
    written["hub"]["repo_id"] = shipped["hub"]["repo_id"]
    assert written == shipped
    # step 7: the run folder the page names is the recipe's
    assert f"runs/{written['name']}-<time>-<run>/" in guide.GUIDE.read_text()


def test_validate_and_plan_run_on_the_written_recipe(tmp_path: Path, monkeypatch, capsys) -> None:
    """`validate` offline (`--remote` reaches the Hub: the same checks plus config.json), and `plan`
    without `--measure` (which boots vLLM on a GPU) with the model's config.json read from a folder."""
    write_recipe(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for argv in guide.quantize_serve_argvs("validate"):
        assert main([a for a in argv if a != "--remote"]) == 0
        out = capsys.readouterr().out
        assert f"{guide.RECIPE}: valid offline" in out and "not checked:" in out, out
    model = tmp_path / "llama-3-8b"
    model.mkdir()
    (model / "config.json").write_text((ROOT / "benchmarks" / "configs" / "llama-3-8b.json").read_text())
    data = yaml.safe_load((tmp_path / guide.RECIPE).read_text())
    data["model"]["id"] = str(model)
    local = tmp_path / "local-config.yaml"
    local.write_text(yaml.safe_dump(data))
    plans = [argv for argv in guide.quantize_serve_argvs("plan") if "--measure" not in argv]
    assert plans
    for argv in plans:
        assert main([str(local) if a == guide.RECIPE else a for a in argv]) == 0
        out = capsys.readouterr().out
        assert "w4a16-fp8kv" in out and "8.03 B parameters" in out, out


def test_the_deployment_path_is_prefect_yaml_s(tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    argvs = [
        shlex.split(c.replace("$PWD", str(tmp_path)).removesuffix("&"))
        for c in guide.commands()
        if c.startswith("prefect ")
    ]
    by_verb = {" ".join(a[1:3]) if a[1] != "--no-prompt" else "deploy": a for a in argvs}
    deploy = by_verb["deploy"]
    name = deploy[deploy.index("--name") + 1]
    (deployment,) = [d for d in spec["deployments"] if d["name"] == name]
    pool = deployment["work_pool"]["name"]
    assert by_verb["work-pool create"][3:] == [pool, "--type", "process"]
    assert by_verb["worker start"][3:] == ["--pool", pool]
    limit = Settings.model_fields["gpu_concurrency_limit"].default
    assert by_verb["gcl create"][3:] == [limit, "--limit", "1"]
    assert by_verb["deployment run"][3:] == [f"{spec['name']}/{name}", "--watch"]
    assert f"recipe={guide.RECIPE}" in deploy and "recipe" in deployment["parameters"]
    # the job variables keep every variable the deployment sets, with this checkout's serving Python
    env = json.loads(deploy[deploy.index("--job-variable") + 1])["env"]
    assert env == {
        **deployment["work_pool"]["job_variables"]["env"],
        "QS_SERVING_PYTHON": f"{tmp_path}/.venv-serve/bin/python",
    }


def test_the_flows_tier_runs_the_page_s_run_command() -> None:
    assert guide.run_argv("x.yaml")[0] == "run" and "x.yaml" in guide.run_argv("x.yaml")
    assert "guide.run_argv(" in (ROOT / "tests" / "flows" / "test_cli.py").read_text()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("```bash\nmake setup\n```\n", ["make setup"]),
        ("   ```bash\n   a \\\n       b  c\n   ```\n", ["a b  c"]),
        ("```python\nx\n```\n", []),
    ],
)
def test_commands_are_read_as_a_shell_reads_them(text: str, expected: list[str]) -> None:
    assert guide.commands(text) == expected
