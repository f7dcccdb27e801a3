"""The commands of docs/getting-started/first-release.md, read from its ```bash blocks, so that the tests run
what the page tells a user to run: tests/unit/test_first_release_guide.py runs the cheap ones, and the whole
run in tests/flows/test_cli.py takes its command line from `run_argv`."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

from tests.conftest import ROOT

GUIDE = ROOT / "docs" / "getting-started" / "first-release.md"
RECIPE = "my-release.yaml"  # the recipe the guide writes (step 3) and every later step names
BLOCK = re.compile(r"^([ \t]*)```bash\n(.*?)^\1```", re.M | re.S)


def commands(text: str | None = None) -> list[str]:
    """Every command of the page's bash blocks, in order (a backslash-continued line joined to the next)."""
    text = GUIDE.read_text(encoding="utf-8") if text is None else text
    out = []
    for match in BLOCK.finditer(text):
        block = re.sub(r"[ \t]*\\\n[ \t]*", " ", textwrap.dedent(match.group(2)))
        out += [line.strip() for line in block.splitlines() if line.strip()]
    return out


def exports() -> dict[str, str]:
    """The variables the page exports (`export NAME=value`) whose value is literal."""
    found = {}
    for command in commands():
        if command.startswith("export ") and "$" not in command:
            name, _, value = command.removeprefix("export ").partition("=")
            found[name] = value
    return found


def quantize_serve_argvs(subcommand: str | None = None) -> list[list[str]]:
    """The argv (after `quantize-serve`) of each `quantize-serve` command, the page's variables filled in."""
    variables = exports()
    out = []
    for command in commands():
        if not command.startswith("quantize-serve "):
            continue
        for name, value in variables.items():
            command = command.replace(f"${name}", value)
        argv = shlex.split(command)[1:]
        if subcommand is None or argv[0] == subcommand:
            out.append(argv)
    return out


def run_argv(recipe: Path | str) -> list[str]:
    """The page's one `quantize-serve run` command line, its recipe (RECIPE) replaced by ``recipe``."""
    (argv,) = quantize_serve_argvs("run")
    assert RECIPE in argv, f"{GUIDE.name}: `quantize-serve {' '.join(argv)}` does not run {RECIPE}"
    return [str(recipe) if arg == RECIPE else arg for arg in argv]
