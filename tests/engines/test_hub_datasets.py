"""Dataset repos on the local hub, through the REAL clients: ``huggingface_hub`` publishes them,
``datasets.load_dataset`` reads them by id, config and split; then calibration by Hub dataset id.

The hub (``datasets_hub``) and the client settings (``hub_env``: online against it, fresh caches per
test) come from conftest.py. The rows are the project's own (``localhub.datasets``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from huggingface_hub import HfApi

from localhub.datasets import (
    GSM8K_CONFIG,
    GSM8K_ID,
    ULTRACHAT_ID,
    gsm8k_splits,
    publish_parquet_dataset,
    ultrachat_rows,
)
from quantize_serve.core.errors import RecipeError
from quantize_serve.quantize.calibration import (
    calibration_fingerprint,
    check_samples,
    fingerprint,
    load_calibration,
    render_texts,
    select_samples,
)
from quantize_serve.recipe.load import parse_recipe
from quantize_serve.recipe.model import Recipe
from tests.conftest import ROOT

CHAT_ID, CHAT_CONFIG = "some-org/ultrachat-like", "sft-small"


def requests_to(hub, fragment: str) -> list[str]:
    return [f"{r.method} {r.path}" for r in hub.requests if fragment in r.path]


def chat_recipe(**calibration) -> Recipe:
    """The tiny AWQ recipe, calibrated on chat messages from a Hub dataset instead of a local file."""
    data = yaml.safe_load((ROOT / "recipes" / "tiny-llama-awq.yaml").read_text())
    data["calibration"] = {
        "dataset": CHAT_ID,
        "subset": CHAT_CONFIG,
        "split": "train_sft",
        "messages_field": "messages",
        "num_samples": 16,
        "max_seq_len": 128,
        **calibration,
    }
    return parse_recipe(data, source="chat.yaml", base_dir=ROOT / "recipes")


@pytest.fixture
def chat_dataset(hub_env) -> list[dict]:
    """UltraChat-shaped rows as some-org/ultrachat-like, config sft-small (layout sft-small/...)."""
    rows = ultrachat_rows(40, seed=7)
    publish_parquet_dataset(
        HfApi(endpoint=hub_env.endpoint),
        CHAT_ID,
        {"train_sft": rows[:32], "test_sft": rows[32:]},
        config=CHAT_CONFIG,
    )
    return rows[:32]


# --------------------------------------------------------------------------------------------
# The protocol: publish with huggingface_hub, read with datasets
# --------------------------------------------------------------------------------------------


def test_a_named_config_loads_by_id_config_and_split(hub_env):
    import datasets

    published = gsm8k_splits()  # what conftest published as openai/gsm8k, config main
    for split, rows in published.items():
        ds = datasets.load_dataset(GSM8K_ID, GSM8K_CONFIG, split=split)
        assert ds.column_names == ["question", "answer"] and ds.to_list() == rows
    assert all(r["answer"].splitlines()[-1].startswith("#### ") for r in published["test"])
    assert len(published["train"]) + len(published["test"]) == 20

    api = HfApi(endpoint=hub_env.endpoint)
    files = sorted(api.list_repo_files(GSM8K_ID, repo_type="dataset"))
    assert files == [
        ".gitattributes",
        "README.md",
        "main/test-00000-of-00001.parquet",
        "main/train-00000-of-00001.parquet",
    ]
    info = api.dataset_info(GSM8K_ID)
    assert info.id == GSM8K_ID and info.card_data.configs[0]["config_name"] == "main"
    # the data came from the hub: the dataset API, then the parquet files (no other source exists)
    assert requests_to(hub_env, f"/api/datasets/{GSM8K_ID}/tree/")
    fetched = requests_to(hub_env, f"/datasets/{GSM8K_ID}/resolve/")
    assert any(r.startswith("GET") and r.endswith("main/test-00000-of-00001.parquet") for r in fetched)


def test_a_second_config_keeps_the_first_and_a_model_repo_is_another_repo(hub_env):
    import datasets

    api = HfApi(endpoint=hub_env.endpoint)
    repo = "some-org/two-configs"
    publish_parquet_dataset(api, repo, {"train": [{"x": 1}, {"x": 2}]}, config="a")
    publish_parquet_dataset(api, repo, {"train": [{"y": "three"}]}, config="b")
    publish_parquet_dataset(api, repo, {"train": [{"x": 4}]}, config="a")  # a republished config replaces
    assert datasets.get_dataset_config_names(repo) == ["a", "b"]
    assert datasets.load_dataset(repo, "a", split="train").to_list() == [{"x": 4}]
    assert datasets.load_dataset(repo, "b", split="train").to_list() == [{"y": "three"}]

    from huggingface_hub.errors import RepositoryNotFoundError

    with pytest.raises(RepositoryNotFoundError):  # same id, other type: not the same repo
        api.model_info(repo)
    api.create_repo(repo)  # a model repo of the same name lives beside it
    assert api.model_info(repo).id == repo and api.dataset_info(repo).id == repo


def test_the_default_config_in_the_data_folder_like_ultrachat_200k(hub_env):
    import datasets

    ds = datasets.load_dataset(ULTRACHAT_ID, split="train_sft")  # no config: the only one, "default"
    assert len(ds) == 256 and ds.column_names == ["prompt", "prompt_id", "messages"]
    first = ds[0]
    assert first["messages"][0] == {"content": first["prompt"], "role": "user"}
    assert [m["role"] for m in first["messages"]][:2] == ["user", "assistant"]
    assert datasets.get_dataset_split_names(ULTRACHAT_ID) == ["train_sft", "test_sft"]
    files = HfApi(endpoint=hub_env.endpoint).list_repo_files(ULTRACHAT_ID, repo_type="dataset")
    assert "data/train_sft-00000-of-00001.parquet" in files


def test_streaming_and_snapshot_download_of_a_dataset_repo(hub_env, tmp_path):
    """The other two ways to read a dataset repo: streamed (HfFileSystem, ranged reads of the parquet
    file) and as a folder (snapshot_download)."""
    import datasets
    from huggingface_hub import snapshot_download

    stream = datasets.load_dataset(GSM8K_ID, GSM8K_CONFIG, split="test", streaming=True)
    assert list(stream) == gsm8k_splits()["test"]
    folder = Path(snapshot_download(GSM8K_ID, repo_type="dataset", local_dir=tmp_path / "gsm8k"))
    assert sorted(str(f.relative_to(folder)) for f in folder.rglob("*.parquet")) == [
        "main/test-00000-of-00001.parquet",
        "main/train-00000-of-00001.parquet",
    ]


# --------------------------------------------------------------------------------------------
# Calibration by Hub dataset id (recipe: dataset, subset, split, messages_field)
# --------------------------------------------------------------------------------------------


def test_calibration_by_hub_id_renders_the_published_chats(chat_dataset, tmp_path):
    from transformers import AutoTokenizer

    recipe = chat_recipe()
    assert not recipe.calibration_is_local
    ds = load_calibration(recipe, source="chat.yaml")
    assert len(ds) == 32 and ds.to_list() == chat_dataset  # train_sft of config sft-small, as published
    rows = select_samples(recipe, ds)
    check_samples(recipe, rows, source="chat.yaml")
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "models" / "tiny-llama")
    texts = render_texts(recipe, rows, tokenizer)
    assert len(texts) == 16
    first = rows[0]["messages"]
    assert texts[0] == tokenizer.apply_chat_template(first, tokenize=False)
    assert f"User: {first[0]['content']}" in texts[0] and f"Assistant: {first[1]['content']}" in texts[0]

    # The same rows from a local file give the same fingerprint: the Hub path loses nothing.
    local = tmp_path / "chats.jsonl"
    local.write_text("".join(json.dumps(r) + "\n" for r in chat_dataset))
    assert calibration_fingerprint(recipe) == fingerprint(render_texts(recipe, rows))
    assert calibration_fingerprint(
        chat_recipe(dataset=str(local), subset=None, split="train")
    ) == calibration_fingerprint(recipe)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"dataset": "some-org/no-such-data"}, "calibration.dataset", ["no such dataset", "owner/name"]),
        ({"subset": "sft-large"}, "calibration.subset", ["has no config 'sft-large'", "one of: sft-small"]),
        ({"split": "train"}, "calibration.split", ["has no split 'train'", "one of: train_sft, test_sft"]),
        (
            {"messages_field": "conversation"},
            "calibration.messages_field",
            ["has no such field", "one of: prompt, prompt_id, messages"],
        ),
        ({"messages_field": None, "text_field": "text"}, "calibration.text_field", ["has no such field"]),
        ({"num_samples": 64}, "calibration.num_samples", ["only 32 rows"]),
    ],
)
def test_hub_calibration_errors_name_field_value_and_fix(chat_dataset, change, field, words):
    recipe = chat_recipe(**change)
    with pytest.raises(RecipeError) as err:
        load_calibration(recipe, source="chat.yaml")
    assert err.value.field == field and "Fix:" in str(err.value)
    assert str(err.value).startswith(f"chat.yaml: {field} = ")
    for w in words:
        assert w in str(err.value)


def test_hub_calibration_offline_says_how_to_reach_the_hub(chat_dataset, monkeypatch):
    import datasets.config
    from huggingface_hub import constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RecipeError, match="cannot be reached.*unset HF_HUB_OFFLINE") as err:
        load_calibration(chat_recipe(), source="chat.yaml")
    assert err.value.field == "calibration.dataset" and err.value.value == CHAT_ID
