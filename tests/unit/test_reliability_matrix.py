"""The fault matrix (docs/reliability.md) stays true: 30+ rows, each naming a test that exists."""

from __future__ import annotations

import importlib.util

from tests.conftest import ROOT


def load_benchmark():
    spec = importlib.util.spec_from_file_location("reliability", ROOT / "benchmarks" / "reliability.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_row_names_a_test_that_exists() -> None:
    rows = load_benchmark().fault_rows()
    assert len(rows) >= 30
    assert [r["case"] for r in rows] == list(range(1, len(rows) + 1))
    for row in rows:
        path, name = row["test"].split("::")
        assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), row
        assert row["fault"] and row["user_sees"] and row["left_behind"], row
