"""Which documents the accuracy gate scores, in which order, and what each one scored.

- :func:`draw_documents`: each task's documents (each member task's, for a group such as mmlu, so
  the draw is stratified by subject) in a seeded random order, ``limit`` of them: a random sample of
  the task, not its first rows (lm-eval's ``--limit`` takes the first). A look at fraction t scores
  the first t of each member's order; lm-eval gets them as ``samples=`` (sorted: it iterates a task's
  documents in dataset order and maps positions back through that list). A perplexity task's longest
  documents (:func:`take_all`) come first, so every look scores them.
- :func:`per_document_fewshot`: lm-eval draws each document's few-shot examples from one random
  stream in the order it iterates the documents, so a document's prompt would depend on which other
  documents are scored with it, and a look's prompts would differ from the base's. Inside this
  context a document's few-shot draw is seeded by the gate's seed and the document itself (whether the
  few-shot pool is another split, as gsm8k's train, or the test split itself), so the same document
  gets the same prompt in any subset (the prompt hashes prove it: recovery.py refuses
  to pair documents whose prompts differ). The draw is lm-eval's own (same pool, same sampler); only
  its seed differs from stock lm-eval's single stream.
- :func:`outcomes`: per document, lm-eval's per-sample metric values (``log_samples``) and its
  prompt hash; :func:`aggregate` computes a metric's value over any set of documents the way lm-eval
  does (mean; perplexities from summed log-likelihoods and weights).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

# lm-eval aggregations the gate can pair per document: name -> the per-document value's kind
MEAN_AGGREGATIONS = ("mean",)
# per-document log-likelihood (nats, negative): "perplexity" gets a float, the others (ll, weight)
LOG_AGGREGATIONS = ("perplexity", "weighted_perplexity", "bits_per_byte")


class DocOutcome(BaseModel):
    """One document as lm-eval scored it: its prompt hash and each metric's per-document value
    (a float; ``[log-likelihood, weight]`` for weighted perplexities and bits per byte)."""

    prompt_hash: str
    values: dict[str, float | tuple[float, float]]


def drawn(size: int, limit: int | float | None) -> int:
    """How many of a member's ``size`` documents the draw takes (``limit`` int: that many; float: that
    share; None: all)."""
    if limit is None:
        return size
    if isinstance(limit, float):
        return math.ceil(limit * size)
    return min(limit, size)


def take_all(lengths: list[int], first: int) -> list[int]:
    """The documents a perplexity task scores with certainty, longest first: each one so long that a
    sample of ``first`` documents (the first look's) drawn with probability proportional to length would
    hold it for sure (length x documents left to draw >= the length of all the others left), taken
    one after the other. The rest are a random sample; docs/gates.md says why."""
    by_length = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    left, certain = sum(lengths), []
    for i in by_length[:first]:
        if lengths[i] * (first - len(certain)) < left:
            break
        certain.append(i)
        left -= lengths[i]
    return certain


def draw_documents(
    sizes: dict[str, int],
    limit: int | float | dict[str, int] | None,
    seed: int,
    task: str,
    certain: dict[str, list[int]] | None = None,
) -> dict[str, list[int]]:
    """Per member task: :func:`drawn` document indices (or ``limit``'s count for the member):
    ``certain``'s first (a perplexity task's :func:`take_all`), then the rest in a random order seeded by
    ``seed`` and the member's name."""
    order: dict[str, list[int]] = {}
    for member, size in sorted(sizes.items()):
        count = limit[member] if isinstance(limit, dict) else drawn(size, limit)
        first = (certain or {}).get(member, [])
        taken = set(first)
        rest = [i for i in range(size) if i not in taken]
        rng = random.Random(f"{seed}:{task}:{member}")
        order[member] = first + rng.sample(rest, count - len(first))
    return order


def look_documents(order: dict[str, list[int]], start: float, end: float) -> dict[str, list[int]]:
    """The documents a look adds: fractions ``start`` to ``end`` of each member's order (sorted)."""
    chunk = {}
    for member, docs in order.items():
        lo, hi = round(start * len(docs)), round(end * len(docs))
        if hi > lo:
            chunk[member] = sorted(docs[lo:hi])
    return chunk


def document_key(member: str, doc_id: int) -> str:
    return f"{member}/{doc_id}"


def _doc_digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


@contextlib.contextmanager
def per_document_fewshot(seed: int) -> Iterator[None]:
    """Seed each document's few-shot draw by ``seed`` and the document (module doc): lm-eval's task
    builds a document's prompt in ``fewshot_context``, whose sampler draws from ``sampler.rnd``."""
    from lm_eval.api.task import ConfigurableTask

    original = ConfigurableTask.fewshot_context

    def fewshot_context(self: Any, *args: Any, **kwargs: Any) -> Any:
        doc = kwargs["doc"] if "doc" in kwargs else args[0]
        sampler = getattr(self, "sampler", None)
        if sampler is not None:
            sampler.rnd = random.Random(f"{seed}:{_doc_digest(doc)}")
        return original(self, *args, **kwargs)

    ConfigurableTask.fewshot_context = fewshot_context  # type: ignore[method-assign]
    try:
        yield
    finally:
        ConfigurableTask.fewshot_context = original  # type: ignore[method-assign]


def outcomes(samples: dict[str, list[dict[str, Any]]]) -> dict[str, DocOutcome]:
    """Per document key: lm-eval's logged samples of every member task merged over its filters (a
    metric under a filter other than ``none`` is named ``metric,filter``, as lm-eval names it)."""
    docs: dict[str, DocOutcome] = {}
    for member, rows in samples.items():
        for row in rows:
            key = document_key(member, int(row["doc_id"]))
            doc = docs.setdefault(key, DocOutcome(prompt_hash=str(row["prompt_hash"]), values={}))
            suffix = "" if row.get("filter", "none") == "none" else f",{row['filter']}"
            for metric in row.get("metrics", []):
                value = row.get(metric)
                if isinstance(value, bool):
                    value = float(value)
                if isinstance(value, (int, float)):
                    doc.values[metric + suffix] = float(value)
                elif isinstance(value, (list, tuple)) and len(value) == 2:
                    doc.values[metric + suffix] = (float(value[0]), float(value[1]))
    return docs


def aggregate(values: list[float | tuple[float, float]], aggregation: str) -> float:
    """A metric's value over these documents, as lm-eval's aggregation computes it."""
    if aggregation in MEAN_AGGREGATIONS:
        return sum(float(v) for v in values) / len(values)  # type: ignore[arg-type]
    if aggregation == "perplexity":
        return math.exp(-sum(float(v) for v in values) / len(values))  # type: ignore[arg-type]
    if aggregation not in LOG_AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r} is not one the gate pairs per document")
    ll = sum(v[0] for v in values)  # type: ignore[index]
    weight = sum(v[1] for v in values)  # type: ignore[index]
    if aggregation == "weighted_perplexity":
        return math.exp(-ll / weight)
    return -ll / weight / math.log(2)  # bits_per_byte


def nats(value: float | tuple[float, float]) -> float:
    """A log-likelihood metric's per-document nats (minus its log-likelihood)."""
    return -(value[0] if isinstance(value, tuple) else value)
