"""`quantize-serve run`: a user error inside the flow fails the run and prints one screen."""


from __future__ import annotations

import json
from pathlib import Path

import yaml

from quantize_serve.cli import main
from tests.unit.malformed_recipes import recipe_data


def test_run_a_user_error_inside_the_flow_fails_the_run_and_prints_one_screen(tmp_path: Path, capsys,
                                                                             monkeypatch) -> None:
    # Every row's text is empty: `validate` (columns, rows) passes, the flow's validate stage (which
    # reads the selected samples) raises a RecipeError inside the Prefect run. The serving-host check
    # (which stops `run` earlier on a CPU without AVX-512, tests/unit/test_cpu_support.py) is set aside.
    from quantize_serve.serving import host as cpu_support

    monkeypatch.setattr(cpu_support, "cpu_serving_gap", lambda *a, **k: None)
    calibration = tmp_path / "blank.jsonl"
    calibration.write_text("\n".join(json.dumps({"text": ""}) for _ in range(64)) + "\n")
    data = recipe_data(tmp_path)
    data["calibration"]["dataset"] = calibration.name
    path = tmp_path / "blank-texts.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", str(path)]) == 0
    capsys.readouterr()
    rc = main(["run", str(path)])
    out = capsys.readouterr()
    assert rc == 2, out.err
    assert "calibration.text_field" in out.err and "fix: " in out.err
    assert "Traceback" not in out.out + out.err
