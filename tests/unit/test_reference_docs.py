"""The reference pages in docs/reference/ are generated from the code (scripts/reference_docs.py): the
recipe's fields from its pydantic models, the QS_* settings from core/settings.py, the CLI from its
parser. A committed page that differs from what the code generates fails here, naming the command."""

from __future__ import annotations

import sys

from quantize_serve.core.settings import Settings
from scripts import reference_docs
from tests.conftest import ROOT


def test_the_committed_reference_pages_are_current() -> None:
    stale = reference_docs.stale(ROOT)
    assert not stale, (
        f"stale generated pages: {', '.join(stale)}. Run `{reference_docs.COMMAND}` and commit the result"
    )


def test_the_pages_name_every_field_setting_and_subcommand() -> None:
    pages = {path.name: text for path, text in reference_docs.pages().items()}
    for key, model in reference_docs.sections(reference_docs.Recipe):
        for name in model.model_fields:
            assert f"| `{f'{key}.{name}'.lstrip('.')}` |" in pages["recipe.md"]
    for name, field in Settings.model_fields.items():
        assert f"| `{reference_docs.variable(name, field)}` |" in pages["settings.md"]
    for name, _, _ in reference_docs.subcommands(reference_docs.cli.build_parser()):
        assert f"## quantize-serve {name}\n" in pages["cli.md"]


def test_the_pages_hold_no_path_of_this_machine() -> None:
    """Generated on any machine, a page reads the same: no project root, no interpreter's path."""
    for path, text in reference_docs.pages().items():
        for machine in {str(ROOT), sys.executable, str(ROOT.resolve())}:
            assert machine not in text, f"{path} holds {machine}"
