"""A Hub calibration dataset is pinned to a commit, as the base model is: the validate stage resolves
its revision to the commit sha (the real client against the local Hub), every load reads that commit
even after the dataset moves on, and the card names the sha (issue 26, item 4)."""

from __future__ import annotations

import pytest
import yaml
from huggingface_hub import HfApi

from localhub.datasets import publish_parquet_dataset, ultrachat_rows
from quantize_serve.core.errors import RecipeError
from quantize_serve.quantize.calibration import calibration_fingerprint, describe, load_calibration
from quantize_serve.recipe.load import parse_recipe
from quantize_serve.release.card import calibration_summary, render_model_card
from quantize_serve.validate.preflight import ValidatedRecipe, pin_calibration_commit
from tests.conftest import ROOT
from tests.engines.test_hub import card_inputs

REPO, CONFIG = "some-org/chats-pinned", "sft-small"


def recipe(**calibration):
    data = yaml.safe_load((ROOT / "recipes" / "tiny-llama-awq.yaml").read_text())
    data["calibration"] = {
        "dataset": REPO,
        "subset": CONFIG,
        "split": "train_sft",
        "messages_field": "messages",
        "num_samples": 8,
        "max_seq_len": 128,
        **calibration,
    }
    return parse_recipe(data, source="chat.yaml", base_dir=ROOT / "recipes")


def test_the_calibration_dataset_is_pinned_to_its_commit_and_the_card_names_it(hub_env):
    api = HfApi(endpoint=hub_env.endpoint)
    first = publish_parquet_dataset(api, REPO, {"train_sft": ultrachat_rows(16, seed=1)}, config=CONFIG)
    pinned = pin_calibration_commit(recipe(), source="chat.yaml")
    assert pinned.calibration.revision == first == api.dataset_info(REPO).sha
    before = calibration_fingerprint(pinned)

    publish_parquet_dataset(
        api, REPO, {"train_sft": ultrachat_rows(16, seed=2)}, config=CONFIG
    )  # main moves on
    assert api.dataset_info(REPO).sha != first
    assert calibration_fingerprint(pinned) == before  # still the pinned commit's rows
    assert calibration_fingerprint(recipe()) != before  # main's rows now
    assert len(load_calibration(pinned)) == 16

    assert describe(pinned)["revision"] == first
    validated = ValidatedRecipe(
        recipe=pinned, source="chat.yaml", recipe_sha256="0" * 64, calibration_fingerprint=before
    )
    card = render_model_card(card_inputs("org/m", calibration=calibration_summary(validated)))
    assert f"| calibration revision | `{first}` |" in card.text
    assert f"| calibration dataset | {REPO} |" in card.text


def test_a_revision_the_dataset_does_not_have_names_the_field(hub_env):
    publish_parquet_dataset(
        HfApi(endpoint=hub_env.endpoint), REPO, {"train_sft": ultrachat_rows(8, seed=3)}, config=CONFIG
    )
    with pytest.raises(RecipeError) as err:
        pin_calibration_commit(recipe(revision="no-such-branch"), source="chat.yaml")
    assert err.value.field == "calibration.revision" and err.value.value == "no-such-branch"
    assert "Fix:" in str(err.value)
