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


def publish_parquet_dataset(
    api: Any,
    repo_id: str,
    splits: dict[str, list[dict[str, Any]]],
    *,
    config: str = "default",
    private: bool = False,
    commit_message: str | None = None,
) -> str:
    """Create (if needed) the dataset repo ``repo_id`` and commit ``splits`` as config ``config``.

    ``api`` is an ``HfApi`` pointed at the hub (``HfApi(endpoint=..., token=...)``); ``splits`` maps a
    split name to its rows (dicts with the same keys; nested lists and dicts become parquet lists
    and structs, which ``datasets`` reads back as lists and dicts). One commit holds the parquet
    files and the README. Returns the commit's sha.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not splits or any(not rows for rows in splits.values()):
        raise ValueError(
            f"publish_parquet_dataset({repo_id!r}): every split needs rows, got "
            f"{ {name: len(rows) for name, rows in splits.items()} }"
        )
    folder = "data" if config == "default" else config
    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    configs = [c for c in _published_configs(api, repo_id) if c.get("config_name") != config]
    configs.append(
        {"config_name": config, "data_files": [{"split": s, "path": f"{folder}/{s}-*"} for s in splits]}
    )
    configs.sort(key=lambda c: (c["config_name"] != "default", c["config_name"]))
    with tempfile.TemporaryDirectory(prefix="qs-dataset-") as tmp:
        root = Path(tmp)
        (root / folder).mkdir()
        for split, rows in splits.items():
            pq.write_table(pa.Table.from_pylist(rows), root / folder / SHARD.format(split=split))
        (root / "README.md").write_text(_card(repo_id, configs))
        info = api.upload_folder(
            folder_path=root,
            repo_id=repo_id,
            repo_type="dataset",
            delete_patterns=[f"{folder}/*"],  # the config's old shards go; other configs stay
            commit_message=commit_message
            or f"Publish config {config!r}: " + ", ".join(f"{s} ({len(r)} rows)" for s, r in splits.items()),
        )
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
    return (
        f"---\n{header}---\n# {repo_id} (made by the project)\n\n"
        "Rows made by quantize-serve's `localhub.datasets`, deterministic and offline. They have "
        "the shape of the dataset this id names on the public Hub, not its content.\n"
    )


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
        question = (
            f"{name} has {start} {thing}. {name} buys {bought} more and then gives {given} "
            f"to a friend. How many {thing} does {name} have now?"
        )
        answer = (
            f"After buying, {name} has {start} + {bought} = <<{start}+{bought}={after_buy}>>"
            f"{after_buy} {thing}.\nAfter giving some away, {name} has {after_buy} - {given} = "
            f"<<{after_buy}-{given}={final}>>{final} {thing}.\n#### {final}"
        )
        rows.append({"question": question, "answer": answer})
    return rows


def gsm8k_splits(*, train: int = 12, test: int = 8, seed: int = 0) -> dict[str, list[dict[str, str]]]:
    """gsm8k's two splits (lm-eval's gsm8k takes its few-shot examples from ``train``)."""
    rows = gsm8k_rows(train + test, seed=seed)
    return {"train": rows[:train], "test": rows[train:]}


def publish_gsm8k(
    api: Any, *, repo_id: str = GSM8K_ID, config: str = GSM8K_CONFIG, train: int = 12, test: int = 8
) -> str:
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
        messages = [
            {"content": m["content"], "role": m["role"]}
            for pair in rng.sample(pairs, rng.randint(1, 3))
            for m in pair
        ]
        prompt = messages[0]["content"]
        rows.append(
            {"prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(), "messages": messages}
        )
    return rows


def publish_ultrachat(
    api: Any,
    *,
    repo_id: str = ULTRACHAT_ID,
    train_sft: int = 256,
    test_sft: int = 32,
    config: str = "default",
) -> str:
    """UltraChat-shaped conversations as ``repo_id`` (splits ``train_sft`` and ``test_sft``, the
    production recipe's calibration split being ``train_sft``)."""
    rows = ultrachat_rows(train_sft + test_sft)
    return publish_parquet_dataset(
        api, repo_id, {"train_sft": rows[:train_sft], "test_sft": rows[train_sft:]}, config=config
    )


# --------------------------------------------------------------------------------------------
# Production-shaped data (opt-in, for the GPU benchmark: benchmarks/h200_release_time.py). The suite's
# default data above stays small.
#
# Lengths are what a release's time depends on; contents are the project's words, drawn seeded.
# - UltraChat-shaped calibration: conversation lengths (chat template included) drawn from a
#   log-normal with a median of ULTRACHAT_MEDIAN_TOKENS (1,000) and a shape of ULTRACHAT_SIGMA (0.6):
#   p10 ~460, p90 ~2,160 tokens. Why: UltraChat 200k's conversations are multi-turn (3-4 user turns on
#   average) with long assistant answers, about a thousand tokens per conversation, with a long right
#   tail; a log-normal is the usual fit for such lengths. Seen with the reference tokenizer and its chat
#   template, 256 rows: median 1,104 tokens, 13% cut at the production recipe's cap
#   (calibration.max_seq_len 2048), mean 1,168 under the cap, ~299k tokens in all (the local rows
#   above give ~38 per sample, 9,621 for 256). These are targets stated here, not figures measured
#   from the public dataset (which cannot be downloaded here).
# - The recipe's tasks, lm-eval's own definitions, under the real ids: gsm8k (openai/gsm8k, main:
#   questions 30-70 words, answers of 3-8 calculator steps), arc_challenge (allenai/ai2_arc,
#   ARC-Challenge: questions 12-40 words, 4 choices, a few with 3 or 5, 1-8 words each), hellaswag
#   (Rowan/hellaswag: a 20-50 word context, 4 endings of 10-30 words), mmlu (cais/mmlu: its 57 subject
#   configs, dev 5 rows each for the 5 shots, questions 10-60 words (professional_law up to ~250),
#   4 choices of 1-15 words). Split sizes cover the recipe's limits (gsm8k 500, arc 500, hellaswag 1000,
#   mmlu 20 per subject).
# - Token-true: those word counts are the real datasets' words, which Llama-3's tokenizer turns into
#   ~TOKENS_PER_WORD tokens each. Given the served model's tokenizer, every count is scaled so that the
#   rows give that many tokens under it (the reference tokenizer's small vocabulary spends ~1.84 tokens on
#   one of the project's words: unscaled, the task prompts cost 13.2M scored tokens a model, scaled 10.0M;
#   the prompt template and the numbers are not scaled), as the calibration rows are sized in tokens.
# --------------------------------------------------------------------------------------------

ULTRACHAT_MEDIAN_TOKENS, ULTRACHAT_SIGMA = 1000, 0.6
TOKENS_PER_WORD = 1.3  # English prose in a BPE vocabulary of Llama-3's size, when no tokenizer is given
ARC_ID, ARC_CONFIG = "allenai/ai2_arc", "ARC-Challenge"
HELLASWAG_ID = "Rowan/hellaswag"
MMLU_ID = "cais/mmlu"
MMLU_SUBJECTS = (
    "abstract_algebra anatomy astronomy business_ethics clinical_knowledge college_biology college_chemistry "
    "college_computer_science college_mathematics college_medicine college_physics computer_security "
    "conceptual_physics econometrics electrical_engineering elementary_mathematics formal_logic global_facts "
    "high_school_biology high_school_chemistry high_school_computer_science high_school_european_history "
    "high_school_geography high_school_government_and_politics high_school_macroeconomics "
    "high_school_mathematics high_school_microeconomics high_school_physics high_school_psychology "
    "high_school_statistics high_school_us_history high_school_world_history human_aging human_sexuality "
    "international_law jurisprudence logical_fallacies machine_learning management marketing "
    "medical_genetics miscellaneous moral_disputes moral_scenarios nutrition philosophy prehistory "
    "professional_accounting professional_law professional_medicine professional_psychology public_relations "
    "security_studies sociology us_foreign_policy virology world_religions"
).split()
# What the production recipe (recipes/llama3-8b-instruct-awq.yaml) gates on: lm-eval's task names
PRODUCTION_TASKS = ("gsm8k", "arc_challenge", "hellaswag", "mmlu")


def _vocabulary(source: Path = CHAT_SOURCE) -> list[str]:
    words = {
        w.strip(".,?!").lower()
        for line in source.read_text().splitlines()
        if line.strip()
        for m in json.loads(line)["messages"]
        for w in m["content"].split()
    }
    return sorted(w for w in words if w.isalpha()) + [t for t in THINGS] + [n.lower() for n in NAMES]


def tokens_per_word(tokenizer: Any = None, words: _Words | None = None) -> float:
    """Tokens one of the project's words costs under ``tokenizer`` (TOKENS_PER_WORD without one), on 2,000
    words drawn from ``words`` (a fresh draw without it)."""
    if tokenizer is None:
        return TOKENS_PER_WORD
    sample = (words or _Words(0)).words(2000)
    return len(tokenizer(sample, add_special_tokens=False)["input_ids"]) / 2000


class _Words:
    """Seeded prose of a given length from the project's vocabulary; ``scale`` turns a count of real
    words into the count of the project's words that costs as many tokens (see token-true above)."""

    def __init__(self, seed: int, scale: float = 1.0) -> None:
        self.rng, self.vocab, self.scale = random.Random(seed), _vocabulary(), scale

    def words(self, n: int) -> str:
        out, sentence = [], 0
        for _ in range(max(1, round(n * self.scale))):
            w = self.rng.choice(self.vocab)
            out.append(w.capitalize() if sentence == 0 else w)
            sentence += 1
            if sentence >= self.rng.randint(8, 16):
                out[-1] += "."
                sentence = 0
        return " ".join(out).rstrip(".") + "."

    def between(self, lo: int, hi: int) -> str:
        return self.words(self.rng.randint(lo, hi))


def ultrachat_production_rows(
    n: int,
    *,
    seed: int = 0,
    tokenizer: Any = None,
    median_tokens: int = ULTRACHAT_MEDIAN_TOKENS,
    sigma: float = ULTRACHAT_SIGMA,
) -> list[dict[str, Any]]:
    """``n`` UltraChat-shaped conversations whose lengths follow the log-normal above (``tokenizer``:
    count with it, else TOKENS_PER_WORD); 1-5 user/assistant pairs, a user turn ~10% of a pair."""
    import math

    words, rng = _Words(seed), random.Random(seed + 1)
    per_word = tokens_per_word(tokenizer, words)
    rows = []
    for _ in range(n):
        target = math.exp(rng.gauss(math.log(median_tokens), sigma))
        pairs = max(1, min(5, round(target / 300)))
        pair_words = max(8, int(target / per_word / pairs))
        messages = []
        for _ in range(pairs):
            user = max(4, pair_words // 10)
            messages += [
                {"content": words.words(user).rstrip(".") + "?", "role": "user"},
                {"content": words.words(pair_words - user), "role": "assistant"},
            ]
        prompt = messages[0]["content"]
        rows.append(
            {"prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(), "messages": messages}
        )
    return rows


def publish_ultrachat_production(
    api: Any, *, repo_id: str = ULTRACHAT_ID, train_sft: int = 512, test_sft: int = 32, tokenizer: Any = None
) -> str:
    rows = ultrachat_production_rows(train_sft + test_sft, tokenizer=tokenizer)
    return publish_parquet_dataset(
        api, repo_id, {"train_sft": rows[:train_sft], "test_sft": rows[train_sft:]}
    )


def gsm8k_production_rows(n: int, *, seed: int = 0, scale: float = 1.0) -> list[dict[str, str]]:
    """gsm8k's columns and format, its lengths: questions 30-70 words, 3-8 annotated steps."""
    words, rng = _Words(seed, scale), random.Random(seed + 1)
    rows = []
    for _ in range(n):
        value, steps = rng.randint(5, 50), []
        for _ in range(rng.randint(3, 8)):
            add = rng.randint(1, 30)
            steps.append(
                f"{words.between(6, 14)} {value} + {add} = <<{value}+{add}={value + add}>>{value + add}."
            )
            value += add
        rows.append(
            {
                "question": words.between(30, 70).rstrip(".") + "?",
                "answer": "\n".join(steps) + f"\n#### {value}",
            }
        )
    return rows


def arc_rows(n: int, *, seed: int = 0, prefix: str = "Mercury", scale: float = 1.0) -> list[dict[str, Any]]:
    """ai2_arc's columns: id, question, choices {text, label}, answerKey; mostly 4 choices."""
    words, rng = _Words(seed, scale), random.Random(seed + 1)
    rows = []
    for i in range(n):
        k = rng.choices((3, 4, 5), weights=(3, 95, 2))[0]
        labels = list("ABCDE"[:k])
        rows.append(
            {
                "id": f"{prefix}_{i}",
                "question": words.between(12, 40).rstrip(".") + "?",
                "choices": {"text": [words.between(1, 8).rstrip(".") for _ in labels], "label": labels},
                "answerKey": rng.choice(labels),
            }
        )
    return rows


def hellaswag_rows(
    n: int, *, seed: int = 0, split: str = "train", scale: float = 1.0
) -> list[dict[str, Any]]:
    """Rowan/hellaswag's columns (lm-eval's process_docs reads ctx_a, ctx_b, activity_label, endings,
    label)."""
    words, rng = _Words(seed, scale), random.Random(seed + 1)
    rows = []
    for i in range(n):
        ctx_a, ctx_b = words.between(20, 50), words.between(3, 10).rstrip(".").lower()
        rows.append(
            {
                "ind": i,
                "activity_label": words.between(1, 3).rstrip("."),
                "ctx_a": ctx_a,
                "ctx_b": ctx_b,
                "ctx": f"{ctx_a} {ctx_b}",
                "endings": [words.between(10, 30) for _ in range(4)],
                "source_id": f"qs~{i}",
                "split": split,
                "split_type": "indomain",
                "label": str(rng.randrange(4)),
            }
        )
    return rows


def mmlu_rows(n: int, subject: str, *, seed: int = 0, scale: float = 1.0) -> list[dict[str, Any]]:
    """cais/mmlu's columns: question, subject, choices (4), answer (0-3)."""
    words, rng = _Words(seed, scale), random.Random(seed + 1)
    hi = 250 if subject == "professional_law" else 60
    return [
        {
            "question": words.between(10, hi).rstrip(".") + "?",
            "subject": subject,
            "choices": [words.between(1, 15).rstrip(".") for _ in range(4)],
            "answer": rng.randrange(4),
        }
        for _ in range(n)
    ]


def publish_parquet_configs(
    api: Any, repo_id: str, configs: dict[str, dict[str, list[dict[str, Any]]]], *, private: bool = False
) -> str:
    """Several configs of one dataset repo in one commit (mmlu's 57 subjects), laid out as
    publish_parquet_dataset lays out one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    declared = [
        {"config_name": name, "data_files": [{"split": s, "path": f"{name}/{s}-*"} for s in splits]}
        for name, splits in sorted(configs.items())
    ]
    with tempfile.TemporaryDirectory(prefix="qs-dataset-") as tmp:
        root = Path(tmp)
        for name, splits in configs.items():
            (root / name).mkdir()
            for split, rows in splits.items():
                pq.write_table(pa.Table.from_pylist(rows), root / name / SHARD.format(split=split))
        (root / "README.md").write_text(_card(repo_id, declared))
        info = api.upload_folder(
            folder_path=root,
            repo_id=repo_id,
            repo_type="dataset",
            commit_message=f"Publish {len(configs)} configs",
        )
    return info.oid


def publish_production_tasks(
    api: Any,
    *,
    gsm8k_test: int = 1319,
    arc_test: int = 1172,
    hellaswag_validation: int = 1000,
    mmlu_test: int = 20,
    tokenizer: Any = None,
) -> dict[str, str]:
    """The production recipe's four tasks' data under their real ids (gsm8k and arc_challenge at their real
    test splits' sizes, so the recipe's limits are a draw from them; hellaswag and mmlu at the limits),
    token-true under ``tokenizer`` (the served model's; see above); returns {dataset id: commit sha}."""
    k = TOKENS_PER_WORD / tokens_per_word(tokenizer)
    shas = {
        GSM8K_ID: publish_parquet_dataset(
            api,
            GSM8K_ID,
            {
                "train": gsm8k_production_rows(200, seed=1, scale=k),
                "test": gsm8k_production_rows(gsm8k_test, seed=2, scale=k),
            },
            config=GSM8K_CONFIG,
        )
    }
    shas[ARC_ID] = publish_parquet_dataset(
        api,
        ARC_ID,
        {
            "train": arc_rows(100, seed=3, prefix="train", scale=k),
            "validation": arc_rows(50, seed=4, prefix="val", scale=k),
            "test": arc_rows(arc_test, seed=5, prefix="test", scale=k),
        },
        config=ARC_CONFIG,
    )
    shas[HELLASWAG_ID] = publish_parquet_dataset(
        api,
        HELLASWAG_ID,
        {
            "train": hellaswag_rows(100, seed=6, scale=k),
            "validation": hellaswag_rows(hellaswag_validation, seed=7, split="val", scale=k),
        },
    )
    shas[MMLU_ID] = publish_parquet_configs(
        api,
        MMLU_ID,
        {
            s: {
                "test": mmlu_rows(mmlu_test, s, seed=10 + i, scale=k),
                "validation": mmlu_rows(5, s, seed=100 + i, scale=k),
                "dev": mmlu_rows(5, s, seed=200 + i, scale=k),
            }
            for i, s in enumerate(MMLU_SUBJECTS)
        },
    )
    return shas
