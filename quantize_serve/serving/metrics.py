"""vLLM's ``/metrics`` (Prometheus text format) read through ``prometheus_client``'s own parser,
which handles escaped label values, histograms and comments that a regular expression gets wrong."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any


def samples(text: str) -> Iterator[Any]:
    """Every sample (``name``, ``labels``, ``value``) in the exposition text. A malformed line
    ends the reading there: what came before it is still returned (a sampler must not crash on
    one bad scrape)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(text):
            yield from family.samples
    except ValueError:
        return


def read_gauges(text: str, names: Iterable[str]) -> dict[str, float]:
    """The named series (sample names as exposed, e.g. ``vllm:num_preemptions_total``), each
    summed over its label sets (engines, models). A name that is not exposed is left out."""
    wanted, out = set(names), {}
    for s in samples(text):
        if s.name in wanted:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def read_labels(text: str, name: str) -> dict[str, str] | None:
    """The labels of the first sample of ``name`` (an info-style series such as
    ``vllm:cache_config_info``, whose labels are the data), or None when it is not exposed."""
    for s in samples(text):
        if s.name == name:
            return dict(s.labels)
    return None


def counter_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What each counter (read_gauges of two scrapes) added between them. A series exposed only in the
    second counts from 0 (vLLM exposes some labelled counters once they first count); one exposed only in
    the first is left out. Counters do not go down: a smaller second value means the server restarted
    between the scrapes, which the caller checks (``process_start_time_seconds``)."""
    return {name: value - before.get(name, 0.0) for name, value in after.items()}
