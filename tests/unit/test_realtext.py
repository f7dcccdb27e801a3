"""The real-text tasks (reference/realtext.py) and the real reference model's folder (reference/smollm2.py).

The committed data must be what the generator makes from the committed corpus, byte for byte, with
rows the tasks' YAMLs read; the model folder (built at set-up, not committed) must be the shape and
tokenizer the recipe and the tasks assume.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference import realtext, smollm2
from tests.conftest import ROOT

DATA = ROOT / "data"
TASK_FILES = ("realtext_ppl.jsonl", "realtext_cloze.jsonl", "realtext_next_sentence.jsonl")
MODEL = ROOT / "models" / "smollm2-135m-instruct"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_markdown_prose_keeps_paragraphs_and_list_items_and_drops_code_tables_headings():
    text = """---
title: x
---
# A heading that is long enough to count as a paragraph if it were one

The gate compares the quantized model with the base on the same documents, and it says
which [documents](docs/gates.md) were scored with `lm-eval` in **every** run.

```bash
make test   # a code block with enough words in it to pass the length check of prose
```

| a | table | row | with | many | words | in | it | that | should | never | count |

- A list item is a paragraph of its own when it is long enough to be prose, like this one.
- short item.
"""
    assert realtext.markdown_prose(text) == [
        "The gate compares the quantized model with the base on the same documents, and it says which "
        "documents were scored with lm-eval in every run.",
        "A list item is a paragraph of its own when it is long enough to be prose, like this one.",
    ]


def test_sentences_split_at_ends_but_not_after_abbreviations():
    assert realtext.sentences("It runs on a CPU, e.g. this one. Then it stops. 42 is a number.") == [
        "It runs on a CPU, e.g. this one.",
        "Then it stops.",
        "42 is a number.",
    ]


def test_docstrings_of_a_python_file():
    source = '"""Module text."""\n\ndef f():\n    """Function text."""\n\nclass C:\n    """Class text."""\n'
    assert realtext.docstrings(source) == "Module text.\n\nFunction text.\n\nClass text."


def test_committed_tasks_are_what_the_generator_makes_from_the_committed_corpus(tmp_path):
    counts = realtext.make_tasks(ROOT / realtext.CORPUS, tmp_path / "evals", tmp_path / "calibration")
    for name in TASK_FILES:
        assert (tmp_path / "evals" / name).read_bytes() == (DATA / "evals" / name).read_bytes(), name
    calibration = "realtext_calibration.jsonl"
    made = (tmp_path / "calibration" / calibration).read_bytes()
    assert made == (DATA / "calibration" / calibration).read_bytes()
    assert counts["realtext_ppl"] == 500 and counts["realtext_cloze"] == 500
    assert counts["realtext_next_sentence"] >= 300 and counts["realtext_calibration"] >= 64  # the recipe's 64
    manifest = json.loads((DATA / "corpus" / "realtext_sources.json").read_text())
    assert manifest["paragraphs"] == len(realtext.read_corpus(ROOT / realtext.CORPUS))


def test_no_paragraph_is_both_calibrated_on_and_evaluated():
    rows = read_jsonl(DATA / "calibration" / "realtext_calibration.jsonl")
    calibration = "\n\n".join(r["text"] for r in rows)
    evaluated = [r["text"] for r in read_jsonl(DATA / "evals" / "realtext_ppl.jsonl")]
    assert evaluated and not [t for t in evaluated if t in calibration]


@pytest.mark.parametrize("name", ["realtext_cloze.jsonl", "realtext_next_sentence.jsonl"])
def test_multiple_choice_rows(name):
    rows = read_jsonl(DATA / "evals" / name)
    for row in rows:
        assert set(row) == {"source", "query", "choices", "gold"}
        assert len(row["choices"]) == 4 and len({c.lower() for c in row["choices"]}) == 4
        assert all(c.startswith(" ") and c.strip() for c in row["choices"])
        assert len(row["query"].split()) <= realtext.MAX_CONTEXT_WORDS + 1  # + the previous sentence's clip
    golds = [row["gold"] for row in rows]
    assert golds == [i % 4 for i in range(len(rows))]  # balanced: chance is 0.25 for every position


def test_cloze_gold_is_the_word_that_ends_the_sentence_in_the_corpus():
    corpus = (ROOT / realtext.CORPUS).read_text(encoding="utf-8")
    for row in read_jsonl(DATA / "evals" / "realtext_cloze.jsonl")[:50]:
        assert row["query"] + row["choices"][row["gold"]] in corpus


def test_task_yamls_name_their_data():
    import yaml

    for task, data in (
        ("qs_realtext_ppl", "realtext_ppl"),
        ("qs_realtext_cloze", "realtext_cloze"),
        ("qs_realtext_next_sentence", "realtext_next_sentence"),
    ):
        config = yaml.safe_load((ROOT / "evals" / "tasks" / f"{task}.yaml").read_text())
        assert config["task"] == task
        path = (ROOT / "evals" / "tasks" / config["dataset_kwargs"]["data_files"]["test"]).resolve()
        assert path == (DATA / "evals" / f"{data}.jsonl").resolve()


@pytest.fixture(scope="module")
def model_config() -> dict:
    if not (MODEL / "conversion.json").is_file():
        pytest.skip(f"{MODEL.relative_to(ROOT)} is built by `make setup` (reference/smollm2.py): not here")
    return json.loads((MODEL / "config.json").read_text())


def test_the_real_reference_model_is_smollm2_135m_in_bf16(model_config):
    assert model_config["architectures"] == ["LlamaForCausalLM"]
    shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
    assert [model_config[k] for k in shape] == [576, 30, 9, 3, 49152]
    assert model_config["dtype"] == "bfloat16" and "quantization_config" not in model_config
    record = json.loads((MODEL / "conversion.json").read_text())
    assert record["parameters"] == 134_515_008 and record["gguf_sha256"] == smollm2.GGUF_SHA256


def test_the_real_reference_tokenizer_ends_turns_with_im_end(model_config):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer("Hello world").input_ids[0] != tokenizer.bos_token_id  # no BOS prepended
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_real_text_prompts_fit_the_recipe_with_room(model_config):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    longest = max(
        len(tokenizer(r["query"] + max(r["choices"], key=len)).input_ids)
        for name in ("realtext_cloze.jsonl", "realtext_next_sentence.jsonl")
        for r in read_jsonl(DATA / "evals" / name)
    )
    assert longest < 1024  # the recipe's max_model_len is 2048
