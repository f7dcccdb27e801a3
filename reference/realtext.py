"""Real-text accuracy data for the real reference model (models/smollm2-135m-instruct): English prose,
nothing fetched at run time.

Source: no pinned PyPI package was found that ships public-domain English prose (looked at:
bechdel-corpus 0.0.1, gutenbergPasswordGenerator 0.3.0 and nltkdata 0.0.1, which hold no text), so the
text is the prose this project wrote itself: the paragraphs and list items of its committed Markdown
(README.md, docs/*.md, scripts/gpu/README.md) read at one git commit, without code blocks, tables and
headings, inline markup removed. It is technical English about this project, written by people, under
the project's own license. Two steps, both deterministic:

1. ``extract`` reads the files at ``--commit`` (``git show``, so uncommitted edits never leak in and a
   rerun at the same commit gives the same bytes) and writes ``data/corpus/realtext.txt`` (paragraphs
   separated by a blank line) and ``data/corpus/realtext_sources.json`` (commit, files, counts). The
   committed corpus is frozen: later edits of the docs do not change the tasks until someone extracts
   again on purpose.
2. ``tasks`` holds a seeded quarter of the paragraphs out for calibration
   (``data/calibration/realtext_calibration.jsonl``: consecutive ones joined into texts of 110-180 words)
   and turns the rest into lm-eval data under ``data/evals/`` (``evals/tasks/qs_realtext_*.yaml``):
   - ``realtext_ppl.jsonl``: PPL_ROWS of the paragraphs (seeded draw, corpus order), for rolling
     log-likelihood (perplexity);
   - ``realtext_cloze.jsonl``: LAMBADA-like: a sentence (after the previous one of its paragraph as
     context) without its last word, and 4 words to end it: the true one and 3 drawn from the words of
     the same source file (by frequency, function words left out), the gold position cycling 0..3;
   - ``realtext_next_sentence.jsonl``: a sentence, and 4 candidates for the next one: the true one and 3
     sentences of other paragraphs of the same source file of similar length, the gold cycling 0..3.
   (A file too short to offer MIN_POOL words or sentences lends its rows distractors from all files.)

Usage::

    python -m reference.realtext extract --commit HEAD
    python -m reference.realtext tasks
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Sequence

from reference.corpus import read_paragraphs, write_jsonl, write_text

ROOT = Path(__file__).resolve().parent.parent
MARKDOWN = ("README.md", "docs/*.md", "scripts/gpu/README.md")
CORPUS = Path("data/corpus/realtext.txt")
MANIFEST = Path("data/corpus/realtext_sources.json")
SEED = 41
MIN_PARAGRAPH_WORDS = 12
MIN_WORD_SHARE = 0.7  # share of a paragraph's tokens that are plain words: prose, not a list of flags
MIN_SENTENCE_WORDS = 6
MAX_CONTEXT_WORDS = 120  # prompts stay far below max_model_len 2048 (SmolLM2: ~1.4 tokens a word here)
MIN_POOL = 30  # distractors come from the same file when it offers at least this many, else from all files
PPL_ROWS = 500  # lm-eval scores a rolling-perplexity document per request: ~0.4 s each for SmolLM2 on 2 cores
CLOZE_ROWS = 500
CALIBRATION_SHARE = 0.25
CALIBRATION_MIN_WORDS, CALIBRATION_MAX_WORDS = 110, 180
NEXT_SENTENCE_ROWS = 400

# Not drawn as cloze distractors: frequent words that end few sentences, which would make a wrong
# choice easy to reject.
FUNCTION_WORDS = frozenset(
    """the and for with that this from are was were not its but has have had when what
which who into than then they their them there these those only also each one two all any can may must will
would should could does did our you your his her she him how why where while per via out off own
same such""".split()
)
WORD = re.compile(r"^[A-Za-z][A-Za-z'-]*[A-Za-z]$|^[A-Za-z]$")
# A sentence ends at . ! or ? before a space and a capital, a digit, a quote or a parenthesis, except
# after the abbreviations the docs use.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`\"'(])")
ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "etc.", "cf.", "approx.", "no.", "fig.")


# ---------------------------------------------------------------------------
# 1. Prose from Markdown
# ---------------------------------------------------------------------------


def markdown_prose(text: str) -> list[str]:
    """Paragraphs and list items of a Markdown text, as plain one-line prose (code, tables, headings,
    HTML and front matter dropped; links, emphasis and backticks unwrapped)."""
    blocks: list[list[str]] = []
    current: list[str] = []
    fenced = front_matter = False
    for i, line in enumerate(text.splitlines()):
        stripped = line.strip()
        if i == 0 and stripped == "---":
            front_matter = True
            continue
        if front_matter:
            front_matter = stripped != "---"
            continue
        if stripped.startswith(("```", "~~~")):
            fenced = not fenced
            current = _flush(blocks, current)
            continue
        skipped = stripped.startswith(("#", "|", "<", "![", ">")) or line.startswith("    ")  # code by indent
        if fenced or not stripped or skipped:
            current = _flush(blocks, current)
            continue
        if re.match(r"^([-*+]|\d+[.)])\s+", stripped):  # a list item starts a block of its own
            current = _flush(blocks, current)
            stripped = re.sub(r"^([-*+]|\d+[.)])\s+", "", stripped)
        current.append(stripped)
    _flush(blocks, current)
    return [p for p in (_plain(" ".join(b)) for b in blocks) if _is_prose(p)]


def _flush(blocks: list[list[str]], current: list[str]) -> list[str]:
    if current:
        blocks.append(current)
    return []


def _plain(text: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # [text](url) -> text
    text = re.sub(r":[a-z]+:`~?([^`]*)`", r"\1", text)  # reStructuredText roles: :func:`name` -> name
    text = re.sub(r"(\*\*|__)(.+?)\1", r"\2", text)
    text = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"\1", text)
    text = text.replace("`", "")
    text = re.sub(r"\s+", " ", text).strip()
    return text


def _is_prose(paragraph: str) -> bool:
    tokens = paragraph.split()
    if len(tokens) < MIN_PARAGRAPH_WORDS:
        return False
    words = sum(bool(WORD.match(t.strip(".,;:!?()\"'"))) for t in tokens)
    return words / len(tokens) >= MIN_WORD_SHARE and paragraph[-1] in ".!?:)"


def git_show(commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def source_files(commit: str) -> list[str]:
    """The Markdown files of MARKDOWN, then every Python file, at ``commit``."""
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", commit], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.splitlines()
    markdown = sorted(
        f
        for f in listed
        if any(Path(f).match(pattern) and f.count("/") == pattern.count("/") for pattern in MARKDOWN)
    )
    return markdown + sorted(f for f in listed if f.endswith(".py"))


def docstrings(source: str) -> str:
    """Every docstring of a Python file (module, classes, functions), as one Markdown-like text."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    nodes = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))),
    ]
    return "\n\n".join(d for d in (ast.get_docstring(n) for n in nodes) if d)


def extract(commit: str) -> dict:
    """Write the corpus and its manifest from the Markdown files at ``commit``."""
    resolved = subprocess.run(
        ["git", "rev-parse", commit], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    paragraphs: list[str] = []
    files: dict[str, int] = {}
    seen: set[str] = set()
    for path in source_files(resolved):
        text = git_show(resolved, path)
        prose = markdown_prose(docstrings(text) if path.endswith(".py") else text)
        kept = [p for p in prose if p not in seen]
        seen.update(kept)
        if kept:
            files[path] = len(kept)
        paragraphs += [f"[{path}] {p}" for p in kept]
    write_text(ROOT / CORPUS, paragraphs)
    manifest = {
        "commit": resolved,
        "sources": [*MARKDOWN, "docstrings of every *.py"],
        "paragraphs_per_file": files,
        "paragraphs": len(paragraphs),
        "words": sum(len(p.split()) - 1 for p in paragraphs),
        "made_by": "python -m reference.realtext extract --commit " + resolved,
    }
    (ROOT / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


# ---------------------------------------------------------------------------
# 2. Tasks from the corpus
# ---------------------------------------------------------------------------


def read_corpus(path: Path) -> list[tuple[str, str]]:
    """(source file, paragraph) pairs: each corpus paragraph starts with ``[path] ``."""
    out = []
    for p in read_paragraphs(path):
        source, text = re.match(r"^\[([^\]]+)\] (.*)$", p, re.S).groups()
        out.append((source, text))
    return out


def sentences(paragraph: str) -> list[str]:
    parts = SENTENCE_END.split(paragraph)
    merged: list[str] = []
    for part in parts:  # glue back a split after an abbreviation
        if merged and merged[-1].lower().endswith(ABBREVIATIONS):
            merged[-1] += " " + part
        else:
            merged.append(part)
    return [s.strip() for s in merged if s.strip()]


def _clip(words: list[str]) -> str:
    return " ".join(words[-MAX_CONTEXT_WORDS:])


def cloze_rows(corpus: list[tuple[str, str]], rng: random.Random, n: int) -> list[dict]:
    """Sentences whose last token is a plain word of 3+ letters, ended by one of 4 words."""
    pools: dict[str, Counter] = {"": Counter()}
    for source, text in corpus:
        for token in text.split():
            word = token.strip(".,;:!?()\"'")
            if WORD.match(word) and len(word) >= 3:
                pools.setdefault(source, Counter())[word] += 1
                pools[""][word] += 1
    candidates = []
    for source, text in corpus:
        sents = sentences(text)
        for i, sentence in enumerate(sents):
            words = sentence.split()
            last = words[-1].rstrip(".!?:;,)\"'")
            if len(words) < MIN_SENTENCE_WORDS or not WORD.match(last) or len(last) < 3:
                continue
            context = (sents[i - 1].split() if i else []) + words[:-1]
            candidates.append((source, _clip(context), last))
    rows = []
    for k, (source, context, gold) in enumerate(sorted(rng.sample(candidates, min(n, len(candidates))))):
        own = pools[source] if len(pools[source]) >= MIN_POOL else pools[""]  # a short file: the whole corpus
        pool = [w for w in own.elements() if w.lower() != gold.lower() and w.lower() not in FUNCTION_WORDS]
        distractors: list[str] = []
        while len(distractors) < 3:
            w = rng.choice(pool)
            if w.lower() not in {d.lower() for d in distractors}:
                distractors.append(w)
        pos = k % 4
        choices = distractors[:pos] + [gold] + distractors[pos:]
        rows.append({"source": source, "query": context, "choices": [" " + c for c in choices], "gold": pos})
    return rows


def next_sentence_rows(corpus: list[tuple[str, str]], rng: random.Random, n: int) -> list[dict]:
    """A sentence, then 4 candidates for the next: the true one and 3 of similar length from other
    paragraphs of the same file."""
    by_source: dict[str, list[tuple[int, str]]] = {}
    pairs = []
    for index, (source, text) in enumerate(corpus):
        sents = [s for s in sentences(text) if len(s.split()) >= MIN_SENTENCE_WORDS]
        by_source.setdefault(source, []).extend((index, s) for s in sents)
        pairs += [(source, index, a, b) for a, b in zip(sents, sents[1:])]
    everywhere = [pair for pairs_of_file in by_source.values() for pair in pairs_of_file]
    rows = []
    for k, (source, index, first, gold) in enumerate(sorted(rng.sample(pairs, min(n, len(pairs))))):
        length = len(gold.split())

        def similar(sentence: str, length: int = length) -> bool:
            return 0.6 * length <= len(sentence.split()) <= 1.6 * length

        pool = sorted({s for i, s in by_source[source] if i != index and similar(s)} - {gold})
        if len(pool) < MIN_POOL:  # a short file: similar sentences of the whole corpus
            pool = sorted({s for i, s in everywhere if i != index and similar(s)} - {gold})
        distractors = rng.sample(pool, 3)
        pos = k % 4
        choices = distractors[:pos] + [gold] + distractors[pos:]
        rows.append(
            {
                "source": source,
                "query": _clip(first.split()),
                "choices": [" " + c for c in choices],
                "gold": pos,
            }
        )
    return rows


def calibration_rows(
    paragraphs: list[str], min_words: int = CALIBRATION_MIN_WORDS, max_words: int = CALIBRATION_MAX_WORDS
) -> list[dict[str, str]]:
    """Consecutive paragraphs joined into texts of ``min_words``..``max_words`` words (~1.3-2 tokens a
    word for SmolLM2's tokenizer on this text: mostly past the recipe's 256-token max_seq_len)."""
    rows: list[dict[str, str]] = []
    current: list[str] = []
    for text in paragraphs:
        if current and sum(len(t.split()) for t in current) + len(text.split()) > max_words:
            current = []
        current.append(text)
        if sum(len(t.split()) for t in current) >= min_words:
            rows.append({"text": "\n\n".join(current)})
            current = []
    return rows


def make_tasks(corpus_path: Path, out: Path, calibration_out: Path, seed: int = SEED) -> dict[str, int]:
    """A seeded CALIBRATION_SHARE of the paragraphs for calibration, the rest for the three tasks (no
    paragraph is both calibrated on and evaluated)."""
    corpus = read_corpus(corpus_path)
    held = set(random.Random(seed).sample(range(len(corpus)), round(CALIBRATION_SHARE * len(corpus))))
    calibration = calibration_rows([t for i, (_, t) in enumerate(corpus) if i in held])
    evaluation = [p for i, p in enumerate(corpus) if i not in held]
    kept = sorted(random.Random(seed + 3).sample(range(len(evaluation)), min(PPL_ROWS, len(evaluation))))
    ppl = [{"source": evaluation[i][0], "text": evaluation[i][1]} for i in kept]
    cloze = cloze_rows(evaluation, random.Random(seed + 1), CLOZE_ROWS)
    nxt = next_sentence_rows(evaluation, random.Random(seed + 2), NEXT_SENTENCE_ROWS)
    write_jsonl(calibration_out / "realtext_calibration.jsonl", calibration)
    write_jsonl(out / "realtext_ppl.jsonl", ppl)
    write_jsonl(out / "realtext_cloze.jsonl", cloze)
    write_jsonl(out / "realtext_next_sentence.jsonl", nxt)
    return {
        "realtext_calibration": len(calibration),
        "realtext_ppl": len(ppl),
        "realtext_cloze": len(cloze),
        "realtext_next_sentence": len(nxt),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    ex = sub.add_parser("extract", help="the corpus from the Markdown files at a commit")
    ex.add_argument("--commit", default="HEAD")
    tk = sub.add_parser("tasks", help="the lm-eval data from the corpus")
    tk.add_argument("--corpus", type=Path, default=ROOT / CORPUS)
    tk.add_argument("--out", type=Path, default=ROOT / "data/evals")
    tk.add_argument("--calibration-out", type=Path, default=ROOT / "data/calibration")
    args = parser.parse_args(argv)
    result = (
        extract(args.commit)
        if args.step == "extract"
        else make_tasks(args.corpus, args.out, args.calibration_out)
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
