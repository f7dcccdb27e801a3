"""Committed benchmark results carry no absolute path of the machine they ran on and no port of a
throwaway server: they name things relative to the repository (or to the benchmark's scratch
folder) and by repo id."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.evidence import portable_text
from tests.conftest import ROOT

RESULTS = ROOT / "benchmarks" / "results"
MACHINE_FOLDERS = ("/work/", "/tmp/", "/root/", "/home/", "/Users/", "/mnt/", "/var/")
# "/a/..." at the start of a token: not "https://host/a/" (":" or "/" before it), not a
# relative "runs/a/" (a word character before it), not "</s>"; vLLM's API paths are not files.
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/<>-])/(?!v1/)[\w.-]+/")
PORT = re.compile(r"\b(127\.0\.0\.1|localhost|0\.0\.0\.0):\d+")


def machine_leaks(text: str) -> list[str]:
    # a machine folder at the start of a path, not inside a relative one (".cache/work/...")
    found = [f for f in MACHINE_FOLDERS if re.search(r"(?<![\w.-])" + re.escape(f), text)]
    found += [m.group(0) for m in ABSOLUTE_PATH.finditer(text)]
    found += [m.group(0) for m in PORT.finditer(text)]
    return found


def text_files() -> list[Path]:
    out = []
    for f in sorted(RESULTS.rglob("*")):
        if f.is_file():
            try:
                f.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # a chart
            out.append(f)
    return out


def test_the_check_catches_paths_and_ports_but_not_urls() -> None:
    assert machine_leaks("vllm serve /srv/models/x --port 8000")
    assert machine_leaks('"log": "/tmp/qs/vllm.log"') and machine_leaks("http://127.0.0.1:56413/v1")
    assert not machine_leaks('see https://huggingface.co/org/model/tree/main and "runs/x/report.md"')
    assert not machine_leaks("--tokenizer .cache/work/checkpoints/awq-1") and machine_leaks('"/work/main/x"')
    assert not machine_leaks("--endpoint /v1/completions --base-url http://127.0.0.1:PORT </s>")


def test_portable_text_rewrites_what_the_check_flags(tmp_path: Path) -> None:
    from quantize_serve.core.settings import PROJECT_ROOT

    text = (
        f"vllm serve {PROJECT_ROOT}/.cache/work/checkpoints/awq-1 --tokenizer {tmp_path}/model "
        "--base-url http://127.0.0.1:41234 --endpoint /v1/completions"
    )
    assert portable_text(text, roots=[tmp_path]) == (
        "vllm serve .cache/work/checkpoints/awq-1 --tokenizer model "
        "--base-url http://127.0.0.1:PORT --endpoint /v1/completions"
    )


@pytest.mark.parametrize("path", text_files(), ids=lambda p: p.name)
def test_committed_results_name_no_machine_path_or_port(path: Path) -> None:
    leaks = machine_leaks(path.read_text(encoding="utf-8"))
    assert not leaks, f"{path.relative_to(RESULTS.parent.parent)}: {sorted(set(leaks))[:5]}"


def test_every_committed_result_says_what_made_it() -> None:
    """Each result is in its question's folder, whose README names it with the command that made it;
    nothing but the index README sits at the top."""
    unlisted = []
    for folder in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        readme = folder / "README.md"
        listed = readme.read_text(encoding="utf-8") if readme.is_file() else ""
        files = [f for f in sorted(folder.iterdir()) if f.is_file() and f.name != "README.md"]
        if folder.name != "gpu-smoke":  # the GPU smoke's folder is scripts/gpu/README.md's
            unlisted += [f.relative_to(RESULTS).as_posix() for f in files if f"`{f.name}`" not in listed]
    assert not unlisted, f"no README under benchmarks/results/ names {unlisted}: add each with its command"
    loose = [f.name for f in sorted(RESULTS.iterdir()) if f.is_file() and f.name != "README.md"]
    assert not loose, f"{loose} at the top of benchmarks/results/: move each into its question's folder"
