"""Publish dataset repos the way the Hub lays them out, through the real ``huggingface_hub`` client.

Tests publish to the local hub (``localhub.server``); scripts on a GPU host can publish to theirs.
The rows are made here, deterministically, from nothing or from the project's own data: no public
dataset is downloaded, and none is claimed. A repo published under a public id (``openai/gsm8k``,
``HuggingFaceH4/ultrachat_200k``) has that dataset's *shape* (configs, splits, columns), so code
that names it (an lm-eval task, a recipe) runs unchanged, on the project's rows.

Layout, as the Hub has it for parquet datasets: each config's splits are one parquet file each,
``data/{split}-00000-of-00001.parquet`` for the ``default`` config and
``{config}/{split}-00000-of-00001.parquet`` for a named one, declared in the README's YAML
``configs:`` block (the block ``datasets`` reads to map files to configs and splits). Publishing a
second config keeps the first: the README's ``configs:`` is merged, that config's folder replaced.

The client must be online against the endpoint and upload through plain LFS (``HF_HUB_DISABLE_XET=1``
or ``localhub.client.hub_client_env``): the local hub does not speak Xet.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parent.parent / "data"
CHAT_SOURCE = DATA / "calibration" / "tiny_chat_calibration.jsonl"
GSM8K_ID, GSM8K_CONFIG = "openai/gsm8k", "main"  # what lm-eval's gsm8k task reads (dataset_path/_name)
ULTRACHAT_ID = "HuggingFaceH4/ultrachat_200k"  # the production recipe's calibration.dataset
SHARD = "{split}-00000-of-00001.parquet"


def publish_parquet_dataset(api: Any, repo_id: str, splits: dict[str, list[dict[str, Any]]], *,
                            config: str = "default", private: bool = False,
                            commit_message: str | None = None) -> str:
    """Create (if needed) the dataset repo ``repo_id`` and commit ``splits`` as config ``config``.

    ``api`` is an ``HfApi`` pointed at the hub (``HfApi(endpoint=..., token=...)``); ``splits`` maps a
    split name to its rows (dicts with the same keys; nested lists and dicts become parquet lists
    and structs, which ``datasets`` reads back as lists and dicts). One commit holds the parquet
    files and the README. Returns the commit's sha.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not splits or any(not rows for rows in splits.values()):
        raise ValueError(f"publish_parquet_dataset({repo_id!r}): every split needs rows, got "
                         f"{ {name: len(rows) for name, rows in splits.items()} }")
    folder = "data" if config == "default" else config
    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    configs = [c for c in _published_configs(api, repo_id) if c.get("config_name") != config]
    configs.append({"config_name": config,
                    "data_files": [{"split": s, "path": f"{folder}/{s}-*"} for s in splits]})
    configs.sort(key=lambda c: (c["config_name"] != "default", c["config_name"]))
    with tempfile.TemporaryDirectory(prefix="qs-dataset-") as tmp:
        root = Path(tmp)
        (root / folder).mkdir()
        for split, rows in splits.items():
            pq.write_table(pa.Table.from_pylist(rows), root / folder / SHARD.format(split=split))
        (root / "README.md").write_text(_card(repo_id, configs))
        info = api.upload_folder(
            folder_path=root, repo_id=repo_id, repo_type="dataset",
            delete_patterns=[f"{folder}/*"],  # the config's old shards go; other configs stay
            commit_message=commit_message or f"Publish config {config!r}: "
            + ", ".join(f"{s} ({len(r)} rows)" for s, r in splits.items()))
    return info.oid


def _published_configs(api: Any, repo_id: str) -> list[dict[str, Any]]:
    """The ``configs:`` of the repo's README as it is on the hub now (none for a new repo)."""
    from huggingface_hub.errors import EntryNotFoundError

    with tempfile.TemporaryDirectory(prefix="qs-card-") as tmp:
        try:
            path = api.hf_hub_download(repo_id, "README.md", repo_type="dataset", cache_dir=tmp)
        except EntryNotFoundError:
            return []
        text = Path(path).read_text()
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    data = yaml.safe_load(match[1]) if match else None
    return list(data.get("configs") or []) if isinstance(data, dict) else []


def _card(repo_id: str, configs: list[dict[str, Any]]) -> str:
    header = yaml.safe_dump({"configs": configs}, sort_keys=False)
    return (f"---\n{header}---\n# {repo_id} (made by the project)\n\n"
            "Rows made by quantize-serve's `localhub.datasets`, deterministic and offline. They have "
            "the shape of the dataset this id names on the public Hub, not its content.\n")


# --------------------------------------------------------------------------------------------
# gsm8k-shaped rows: question / answer with a "#### N" final answer
# --------------------------------------------------------------------------------------------

NAMES = ("Mara", "Tobin", "Lodra", "Vimir", "Katha", "Zosko", "Rizan", "Molio", "Yadra", "Monor")
THINGS = ("apples", "pencils", "marbles", "stamps", "cookies", "shells", "books", "coins")


def gsm8k_rows(n: int, *, seed: int = 0) -> list[dict[str, str]]:
    """``n`` grade-school word problems in gsm8k's format: ``question``, and an ``answer`` whose
    steps carry ``<<a+b=c>>`` calculator annotations and whose last line is ``#### <number>``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        start, bought, given = rng.randint(5, 40), rng.randint(2, 30), rng.randint(1, 10)
        after_buy = start + bought
        final = after_buy - given
        question = (f"{name} has {start} {thing}. {name} buys {bought} more and then gives {given} "
                    f"to a friend. How many {thing} does {name} have now?")
        answer = (f"After buying, {name} has {start} + {bought} = <<{start}+{bought}={after_buy}>>"
                  f"{after_buy} {thing}.\nAfter giving some away, {name} has {after_buy} - {given} = "
                  f"<<{after_buy}-{given}={final}>>{final} {thing}.\n#### {final}")
        rows.append({"question": question, "answer": answer})
    return rows


def gsm8k_splits(*, train: int = 12, test: int = 8, seed: int = 0) -> dict[str, list[dict[str, str]]]:
    """gsm8k's two splits (lm-eval's gsm8k takes its few-shot examples from ``train``)."""
    rows = gsm8k_rows(train + test, seed=seed)
    return {"train": rows[:train], "test": rows[train:]}


def publish_gsm8k(api: Any, *, repo_id: str = GSM8K_ID, config: str = GSM8K_CONFIG, train: int = 12,
                  test: int = 8) -> str:
    """gsm8k-shaped rows where lm-eval's ``gsm8k`` task looks for them (``openai/gsm8k``, ``main``)."""
    return publish_parquet_dataset(api, repo_id, gsm8k_splits(train=train, test=test), config=config)


# --------------------------------------------------------------------------------------------
# UltraChat-shaped rows: prompt, prompt_id, messages [{content, role}, ...]
# --------------------------------------------------------------------------------------------


def ultrachat_rows(n: int, *, seed: int = 0, source: Path = CHAT_SOURCE) -> list[dict[str, Any]]:
    """``n`` multi-turn conversations in HuggingFaceH4/ultrachat_200k's columns (``prompt``,
    ``prompt_id`` = sha256 of the prompt, ``messages`` = alternating user/assistant turns), each
    made of 1 to 3 question/answer pairs of the project's chat data (``source``, JSON lines with a
    ``messages`` column), drawn with a seeded generator."""
    pairs = [json.loads(line)["messages"] for line in source.read_text().splitlines() if line.strip()]
    if not pairs:
        raise ValueError(f"no chat rows in {source}")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        messages = [{"content": m["content"], "role": m["role"]}
                    for pair in rng.sample(pairs, rng.randint(1, 3)) for m in pair]
        prompt = messages[0]["content"]
        rows.append({"prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(),
                     "messages": messages})
    return rows


def publish_ultrachat(api: Any, *, repo_id: str = ULTRACHAT_ID, train_sft: int = 256, test_sft: int = 32,
                      config: str = "default") -> str:
    """UltraChat-shaped conversations as ``repo_id`` (splits ``train_sft`` and ``test_sft``, the
    production recipe's calibration split being ``train_sft``)."""
    rows = ultrachat_rows(train_sft + test_sft)
    return publish_parquet_dataset(api, repo_id, {"train_sft": rows[:train_sft], "test_sft": rows[train_sft:]},
                                   config=config)
