"""The README, docs/ and the GPU host's procedure (scripts/gpu/README.md) hold together: every relative
link names a file (and a heading) that exists, no page names a path of this machine, dated run figures live in
the evidence folders (benchmarks/results/<question>/README.md) and not in those pages, the README's
first-release commands are the tested guide's, and its minimal recipe is valid. docs/gates.md is left to its
own tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantize_serve.cli import main
from scripts.reference_docs import slug
from tests import first_release_guide as guide
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "scripts" / "gpu" / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
EVIDENCE = sorted((ROOT / "benchmarks" / "results").glob("*/README.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
CODE = re.compile(r"^```.*?^```", re.M | re.S)


def name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def anchors(path: Path) -> set[str]:
    text = CODE.sub("", path.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES + EVIDENCE, ids=name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(CODE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists() or ROOT.resolve() not in path.parents:
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(target)
    assert not broken, f"{name(page)}: broken links {broken}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_no_dated_figure_and_no_machine_path(page: Path) -> None:
    """A dated measurement goes to an evidence README under benchmarks/results/, with a conclusion and a
    link left in the page."""
    text = page.read_text(encoding="utf-8")
    assert not DATE.findall(text), f"{name(page)}: dated figures {DATE.findall(text)}: move them to evidence"
    for machine in ("/work/", "/tmp/", "/root/", "/home/", str(ROOT)):
        assert machine not in text, f"{name(page)} names {machine}"


def test_the_evidence_is_linked_from_the_docs() -> None:
    linked = " ".join(p.read_text(encoding="utf-8") for p in PAGES)
    for readme in EVIDENCE:
        assert f"benchmarks/results/{readme.parent.name}/README.md" in linked, name(readme)


def section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_s_first_release_is_the_tested_guide_s() -> None:
    readme = section((ROOT / "README.md").read_text(encoding="utf-8"), "Your first release")
    steps = guide.commands(readme)
    assert steps and set(steps) <= set(guide.commands()), set(steps) - set(guide.commands())
    assert "docs/getting-started/first-release.md" in readme


def test_the_readme_s_minimal_recipe_is_valid(tmp_path: Path, monkeypatch, capsys) -> None:
    readme = section((ROOT / "README.md").read_text(encoding="utf-8"), "A minimal recipe")
    (recipe,) = re.findall(r"^```yaml\n(.*?)^```", readme, re.M | re.S)
    (tmp_path / "minimal.yaml").write_text(recipe)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["validate", str(tmp_path / "minimal.yaml")]) == 0
    assert "valid offline" in capsys.readouterr().out


def test_the_readme_starts_with_the_two_commands_that_work_on_a_fresh_machine() -> None:
    """CI (.ci/run) runs the README's test command: `make test`."""
    head = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert guide.commands(head)[:2] == [
        "make demo   # set up both environments, then run the offline demo release on the tiny model",
        "make test   # set up both environments, then run the test suite",
    ]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
