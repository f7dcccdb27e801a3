"""Broken inputs fail at validation, before any weights load: model files and calibration data.

Each case names the file or field, the problem and the fix, the way a recipe error does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from quantize_serve.core.errors import RecipeError
from quantize_serve.validate.preflight import validate_recipe
from tests.conftest import ROOT

MODEL = ROOT / "models" / "tiny-llama"


def recipe_at(tmp_path: Path, *, model: Path = MODEL, calibration: dict | None = None) -> Path:
    data = yaml.safe_load((ROOT / "recipes" / "tiny-llama-awq.yaml").read_text())
    data["model"]["id"] = str(model)
    data["calibration"]["dataset"] = str(ROOT / "data/calibration/tiny_calibration.jsonl")
    data["calibration"].update(calibration or {})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def model_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(MODEL, folder)
    return folder


def expect(path: Path, field: str, *needles: str) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        validate_recipe(path)
    text = str(info.value)
    assert info.value.field == field and "Fix:" in text, text
    for needle in needles:
        assert needle in text, text
    return info.value


# --------------------------------------------------------------------------------------------
# The model folder
# --------------------------------------------------------------------------------------------


def test_truncated_safetensors(tmp_path: Path, model_copy: Path) -> None:
    weights = model_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    expect(
        recipe_at(tmp_path, model=model_copy),
        "model.id",
        "model.safetensors is corrupt",
        f"{len(data) // 2} bytes on disk, {len(data)} expected",
        "download the model again",
    )


def test_garbage_safetensors_header(tmp_path: Path, model_copy: Path) -> None:
    (model_copy / "model.safetensors").write_bytes(
        b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + b"\0" * 64
    )
    expect(recipe_at(tmp_path, model=model_copy), "model.id", "JSON header does not parse")


def test_missing_weights(tmp_path: Path, model_copy: Path) -> None:
    (model_copy / "model.safetensors").unlink()
    expect(recipe_at(tmp_path, model=model_copy), "model.id", "no weights")


def test_missing_shard_named_by_the_index(tmp_path: Path, model_copy: Path) -> None:
    (model_copy / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "metadata": {},
                "weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"},
            }
        )
    )
    expect(
        recipe_at(tmp_path, model=model_copy),
        "model.id",
        "1 of 2 weight shards",
        "model-00002-of-00002.safetensors",
    )


def test_missing_tokenizer(tmp_path: Path, model_copy: Path) -> None:
    (model_copy / "tokenizer.json").unlink()
    expect(recipe_at(tmp_path, model=model_copy), "model.id", "no tokenizer", "add the tokenizer files")


def test_corrupt_config_json(tmp_path: Path, model_copy: Path) -> None:
    (model_copy / "config.json").write_text('{"hidden_size": 128,')
    expect(recipe_at(tmp_path, model=model_copy), "model.id", "config.json", "cannot be read as JSON")


# --------------------------------------------------------------------------------------------
# Calibration data
# --------------------------------------------------------------------------------------------


def calibration_file(tmp_path: Path, rows: list, name: str = "calib.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_empty_calibration_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    expect(recipe_at(tmp_path, calibration={"dataset": str(empty)}), "calibration.dataset", "empty file")


def test_calibration_file_that_is_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": unquoted}\n')
    expect(
        recipe_at(tmp_path, calibration={"dataset": str(bad)}),
        "calibration.dataset",
        "cannot be read as json",
    )


def test_calibration_too_short(tmp_path: Path) -> None:
    data = calibration_file(tmp_path, [{"text": f"row {i}"} for i in range(10)])
    expect(
        recipe_at(tmp_path, calibration={"dataset": data, "num_samples": 64}),
        "calibration.num_samples",
        "has only 10 rows",
        "lower calibration.num_samples to at most 10",
    )


def test_calibration_empty_texts(tmp_path: Path) -> None:
    data = calibration_file(tmp_path, [{"text": "  "} for _ in range(8)])
    expect(
        recipe_at(tmp_path, calibration={"dataset": data, "num_samples": 8}),
        "calibration.text_field",
        "is not a non-empty string",
    )


def test_calibration_wrong_field(tmp_path: Path) -> None:
    data = calibration_file(tmp_path, [{"content": "some text"} for _ in range(8)])
    expect(
        recipe_at(tmp_path, calibration={"dataset": data, "num_samples": 8}),
        "calibration.text_field",
        "has no such field (it has: content)",
    )


@pytest.mark.parametrize(
    "messages",
    [
        "a plain string, not a list",
        [{"role": "user"}],  # no content
        [{"speaker": "user", "text": "hi"}],  # another schema
        [],
    ],
)
def test_calibration_malformed_chat(tmp_path: Path, messages) -> None:
    data = calibration_file(tmp_path, [{"messages": messages} for _ in range(8)])
    calibration = {"dataset": data, "num_samples": 8, "text_field": None, "messages_field": "messages"}
    expect(
        recipe_at(tmp_path, calibration=calibration),
        "calibration.messages_field",
        'a non-empty list of {"role": ..., "content": ...} messages',
    )


def test_well_formed_chat_validates(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
        for i in range(8)
    ]
    calibration = {
        "dataset": calibration_file(tmp_path, rows),
        "num_samples": 8,
        "text_field": None,
        "messages_field": "messages",
    }
    assert len(validate_recipe(recipe_at(tmp_path, calibration=calibration)).calibration_fingerprint) == 64
