"""A look's lm-eval calls in lanes: the generation tasks in one, the tasks scored by log-likelihood in the
other, run at the same time against one server (run.py run_tasks).

lm-eval runs a call's request kinds one after the other (``generate_until``, then ``loglikelihood``): a
call holding gsm8k and arc_challenge first decodes gsm8k's answers alone, the server's batches a decode
step each with the device mostly idle, then prefills arc_challenge's contexts. In two calls at once, the
decode steps ride along with the prefills: vLLM's scheduler puts both in one batch (chunked prefill), so
a step costs about what the prefill alone would. Each lane has its own lm-eval model (its own tokenizer);
the tasks (``members``: lm-eval's Task objects by name) are split between them, never shared.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

GENERATE, SCORE = "generate", "score"  # the lanes: generation tasks, and tasks scored by log-likelihood


def lane(task: Any) -> str:
    """A task's lane: ``generate`` when every member generates (lm-eval's ``generate_until``), else ``score``
    (log-likelihoods; a task mixing both kinds runs them one after the other there, as lm-eval does)."""
    kinds = {getattr(member, "OUTPUT_TYPE", None) for member in task.members.values()}
    return GENERATE if kinds == {"generate_until"} else SCORE


def lanes(tasks: list[Any]) -> dict[str, list[list[Any]]]:
    """A look's lm-eval calls by lane (:func:`one_call_each` within each), the lanes in the tasks' order."""
    by_lane: dict[str, list[Any]] = {}
    for t in tasks:
        by_lane.setdefault(lane(t), []).append(t)
    return {name: one_call_each(members) for name, members in by_lane.items()}


def run_lanes(
    by_lane: dict[str, list[list[Any]]],
    models: LaneModels,
    call: Callable[[list[Any], Any], None],
) -> None:
    """Each lane's calls one after the other with the lane's model, the lanes in threads of their own (one
    lane: in this thread); the first failure is raised once every lane has ended."""
    work = {name: (models.get(name), calls) for name, calls in by_lane.items()}  # made in this thread
    share = KvShare(models.kv_tokens, len(work)) if models.kv_tokens else None
    for lm, _ in work.values():  # lanes at once share the server's KV cache: each keeps to its part
        if hasattr(lm, "kv_share"):
            lm.kv_share = share

    def run(name: str) -> None:
        lm, calls = work[name]
        try:
            for each in calls:
                call(each, lm)
        finally:  # its part goes to the lanes still running
            if share:
                share.ended()

    if len(work) <= 1:  # a look may hold no task's documents
        for name in work:
            run(name)
        return
    with ThreadPoolExecutor(max_workers=len(work), thread_name_prefix="lm-eval") as pool:
        futures = [pool.submit(run, name) for name in work]
    for future in futures:
        future.result()


class KvShare:
    """The server's KV cache (``tokens``) shared between the lanes that run at once: each running lane's
    part is the cache over the lanes still running, so a lane that ends leaves its part to the others, whose
    requests in flight read it again as they end (scoring.py ``InFlight``). The lanes run in threads of
    their own; ``ended`` is their one write."""

    def __init__(self, tokens: int, lanes: int = 1) -> None:
        self.tokens = tokens
        self._running = lanes
        self._lock = threading.Lock()

    def part(self) -> int:
        return self.tokens // max(1, self._running)

    def ended(self) -> None:
        with self._lock:
            self._running -= 1


@dataclass
class LaneModels:
    """lm-eval's model of each lane, made on first use: each lane its own (lm-eval's API models keep a fast
    tokenizer, which one thread may not use while another does). ``kv_tokens``: the server's KV cache,
    which :func:`run_lanes` shares out between the lanes that run at once (:class:`KvShare`)."""

    make: Callable[[], Any]
    kv_tokens: int | None = None
    made: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        if name not in self.made:
            self.made[name] = self.make()
        return self.made[name]

    def stats(self) -> dict[str, int]:
        """The scoring paths' counts (scoring.py ``stats``) over the lanes' models."""
        total: Counter[str] = Counter()
        for lm in self.made.values():
            total.update(getattr(lm, "stats", {}))
        return dict(total)

    def checks(self) -> list[Any]:
        """The scoring paths' checks against the echo path (scoring.py ``checks``), every lane's."""
        return [check for lm in self.made.values() for check in getattr(lm, "checks", [])]


def one_call_each(tasks: list[Any]) -> list[list[Any]]:
    """A lane's lm-eval calls in a look: one for all its tasks, or one each where two share a member task
    (lm-eval keys samples and results by member); none where the look holds no task's documents."""
    names = [n for t in tasks for n in t.members]
    return [tasks] if tasks and len(names) == len(set(names)) else [[t] for t in tasks]
