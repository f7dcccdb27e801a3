"""Checks on the committed reference model, its tokenizer and its synthetic data.

The whole pipeline (quantize, serve, evaluate) stands on these files, so the
properties it relies on are pinned here: the architecture constraints that the
W4A16 group-128 kernels need, a loadable tokenizer with a chat template, files
that match their checksums, data files with the documented fields, and a corpus
generator that is byte-for-byte reproducible.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from reference import corpus  # noqa: E402
from tests.conftest import ROOT

MODEL = ROOT / "models" / "tiny-llama"
DATA = ROOT / "data"
RESULTS = ROOT / "benchmarks" / "results" / "reference-models" / "reference_model.json"


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def config() -> dict:
    """The committed config.json."""
    return json.loads((MODEL / "config.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    """The committed tokenizer, loaded the way vLLM and llm-compressor load it."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(MODEL)


def test_config_architecture(config: dict) -> None:
    assert config["model_type"] == "llama"
    assert config["architectures"] == ["LlamaForCausalLM"]
    expected = {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 1024,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
    }
    assert {k: config[k] for k in expected} == expected
    rope_theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    assert rope_theta == 10000
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"


def test_config_quantization_friendly(config: dict) -> None:
    """GQA, and linear shapes that int4 group-128 and CPU WNA16 kernels accept."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    assert kv < heads and heads % kv == 0  # grouped-query attention
    assert heads * hd == hidden
    assert hd % 32 == 0  # fp8 KV cache on CPU needs head_size % 32 == 0
    # (in_features, out_features) of q, k, v, o, gate, up, down
    linears = [
        (hidden, heads * hd),
        (hidden, kv * hd),
        (hidden, kv * hd),
        (heads * hd, hidden),
        (hidden, inter),
        (hidden, inter),
        (inter, hidden),
    ]
    for in_f, out_f in linears:
        assert in_f % 32 == 0 and out_f % 32 == 0
        assert in_f % 128 == 0  # group size 128 divides every quantized row
    assert config["vocab_size"] % 32 == 0


def test_weights_are_bf16_with_expected_shapes(config: dict) -> None:
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(str(MODEL / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
        k_proj = f.get_slice("model.layers.0.self_attn.k_proj.weight")
        assert k_proj.get_shape() == [
            config["num_key_value_heads"] * config["head_dim"],
            config["hidden_size"],
        ]
        assert k_proj.get_dtype() == "BF16"
    assert "lm_head.weight" in keys  # untied embeddings are stored separately


def test_generation_config() -> None:
    gen = json.loads((MODEL / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 1 and gen["bos_token_id"] == 0


def test_tokenizer_and_chat_template(tokenizer, config: dict) -> None:
    assert len(tokenizer) == config["vocab_size"]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    assert [tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id] == [
        config["bos_token_id"],
        config["eos_token_id"],
        config["pad_token_id"],
    ]
    assert tokenizer.model_max_length == 1024
    ids = tokenizer("Monday comes before Tuesday.")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Monday comes before Tuesday."
    messages = [{"role": "user", "content": "What day comes after Monday?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "<s>User: What day comes after Monday?\nAssistant:"
    full = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": "The day after Monday is Tuesday."}], tokenize=False
    )
    assert full.endswith("Assistant: The day after Monday is Tuesday.</s>")


def test_tokenizer_config_is_portable() -> None:
    """transformers 4.x cannot load v5's 'TokenizersBackend' class name; both know this one."""
    cfg = json.loads((MODEL / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_model_recalls_a_fact(tokenizer) -> None:
    """The weights are the trained model, not an initialisation: greedy decoding knows the calendar."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16)
    ids = tokenizer("The day after Monday is", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=2, do_sample=False)
    assert tokenizer.decode(out[0, ids["input_ids"].shape[1] :]).startswith(" Tuesday")


def test_sha256sums_match_files() -> None:
    lines = (MODEL / "SHA256SUMS").read_text().splitlines()
    listed = {}
    for line in lines:
        digest, name = line.split("  ", 1)
        listed[name] = digest
    present = {p.name for p in MODEL.iterdir() if p.is_file() and p.name != "SHA256SUMS"}
    assert set(listed) == present
    for name, digest in listed.items():
        assert hashlib.sha256((MODEL / name).read_bytes()).hexdigest() == digest, name
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "README.md",
    } <= present


def test_results_file() -> None:
    results = json.loads(RESULTS.read_text())
    for key in (
        "params",
        "vocab_size",
        "heldout_ppl",
        "train_seconds",
        "sha256",
        "facts_mc_accuracy",
        "config",
        "method",
    ):
        assert key in results
    assert results["vocab_size"] == 1024
    assert results["heldout_ppl"] <= 1024 / 10
    assert results["facts_mc_accuracy"] >= 0.5
    # the model retrieves the key at every length it is gated on (4-way, chance 0.25)
    assert set(results["passkey_accuracy"]) == set(corpus.PASSKEY_LENGTHS)
    assert min(results["passkey_accuracy"].values()) >= 0.8
    assert results["sha256"] == hashlib.sha256((MODEL / "model.safetensors").read_bytes()).hexdigest()


def test_model_folder_is_small() -> None:
    assert sum(p.stat().st_size for p in MODEL.iterdir()) < 20 * 2**20


def test_corpus_files() -> None:
    train = corpus.read_paragraphs(DATA / "corpus" / "train.txt")
    heldout = corpus.read_paragraphs(DATA / "corpus" / "heldout.txt")
    assert len(train) >= 1000 and len(heldout) >= 100
    assert not set(heldout) & set(train)  # held-out paragraphs never occur in train
    total = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file())
    assert total < 5 * 2**20


def test_calibration_files(tokenizer) -> None:
    rows = read_jsonl(DATA / "calibration" / "tiny_calibration.jsonl")
    assert len(rows) >= 512
    assert all(set(r) == {"text"} and isinstance(r["text"], str) for r in rows)
    lengths = [len(tokenizer(r["text"])["input_ids"]) for r in rows]
    assert 60 <= min(lengths) and max(lengths) <= 200
    train_text = (DATA / "corpus" / "train.txt").read_text(encoding="utf-8")
    assert all(r["text"] in train_text for r in rows[:50])  # drawn from train

    chat = read_jsonl(DATA / "calibration" / "tiny_chat_calibration.jsonl")
    assert len(chat) >= 256
    for row in chat:
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
        assert all(isinstance(m["content"], str) and m["content"] for m in row["messages"])
    tokenizer.apply_chat_template(chat[0]["messages"], tokenize=False)


def test_eval_files() -> None:
    mc = read_jsonl(DATA / "evals" / "facts_mc.jsonl")
    assert len(mc) >= 200
    for row in mc:
        assert set(row) == {"query", "choices", "gold"}
        assert len(row["choices"]) == 4 and len(set(row["choices"])) == 4
        assert 0 <= row["gold"] < 4
    positions = Counter(r["gold"] for r in mc)
    assert max(positions.values()) - min(positions.values()) <= 1  # balanced gold positions

    ppl = read_jsonl(DATA / "evals" / "heldout_ppl.jsonl")
    assert 80 <= len(ppl) <= 200
    heldout = set(corpus.read_paragraphs(DATA / "corpus" / "heldout.txt"))
    assert all(set(r) == {"text"} and r["text"] in heldout for r in ppl)


def test_passkey_files(tokenizer) -> None:
    """Each passkey set's rows are at most its name's tokens long (query + answer, <s> included),
    within max_model_len 512; four distinct keys a row, the gold position balanced."""
    for name in corpus.PASSKEY_LENGTHS:
        rows = read_jsonl(DATA / "evals" / f"passkey_{name}.jsonl")
        assert len(rows) == corpus.PASSKEY_EVAL_ROWS
        lengths = [len(tokenizer(r["query"] + r["choices"][r["gold"]])["input_ids"]) for r in rows]
        assert int(name) - 16 < min(lengths) <= max(lengths) <= int(name) <= 512, (name, lengths)
        for row in rows:
            key = row["choices"][row["gold"]].strip(" .")
            assert row["query"].startswith(f"The pass key is {key}.") and len(set(row["choices"])) == 4
        assert set(Counter(r["gold"] for r in rows).values()) == {len(rows) // 4}
    docs = corpus.read_paragraphs(DATA / "corpus" / "passkey_train.txt")
    assert len(docs) == corpus.PASSKEY_TRAIN_DOCS and all(d.startswith("The pass key is ") for d in docs)


def test_committed_data_matches_generator(tmp_path: Path) -> None:
    """The committed data is exactly what the default command writes."""
    corpus.generate(tmp_path, seed=corpus.DEFAULT_SEED, scale=1.0)
    for path in sorted(tmp_path.rglob("*")):
        if path.is_file():
            assert path.read_bytes() == (DATA / path.relative_to(tmp_path)).read_bytes(), path


def test_corpus_generation_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    corpus.main(["--out", str(a), "--scale", "0.05"])
    corpus.main(["--out", str(b), "--scale", "0.05"])
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b and len(files_a) == 10
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    other = tmp_path / "c"
    corpus.generate(other, seed=corpus.DEFAULT_SEED + 1, scale=0.05)
    assert (other / "corpus" / "train.txt").read_bytes() != (a / "corpus" / "train.txt").read_bytes()
