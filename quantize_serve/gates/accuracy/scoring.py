"""Scoring each distinct context once: lm-eval's completions model, with vLLM's scoring paths.

lm-eval's ``local-completions`` model sends one ``echo`` request per (context, continuation): vLLM
computes the whole prompt with its prompt logprobs, and a request that asks for prompt logprobs never
reads the prefix cache. A multiple-choice document therefore has its (few-shot) context computed once
per choice: mmlu four times, hellaswag four, arc_challenge four or five. This model, registered with
lm-eval's own registry as ``qs-completions`` (a subclass of ``local-completions``: the task definitions,
the requests lm-eval builds and every metric it computes stay lm-eval's), groups the loglikelihood
requests by context and scores each group so that the context is computed once:

- **The context request** (every vLLM the project serves with: documented ``/v1/completions``
  ``logprob_token_ids``): the context alone, one generated position, the logprobs of the choices'
  first tokens at that position (full-vocabulary log-softmax, the quantity lm-eval reads from the echo
  rows) and the greedy token. A one-token continuation (mmlu's `` A``..`` D``) is then fully scored. No
  prompt logprobs are asked for, so the prefix cache is read and written: a subject's shared few-shot
  prefix is computed once for all its questions.
- **The continuation rows** (``reuse_rows``; only on vLLM's V2 model runner, see below): each
  multi-token continuation through ``/inference/v1/generate`` with ``prompt_logprobs: 0`` and
  ``skip_reading_prefix_cache: false``. The context's blocks are then read from the cache that the
  context request filled, and only the continuation is computed. The V2 runner returns rows only for the
  positions it computed: ``n - cached`` entries. When the cache covered the context's last token (its
  length a multiple of the block size) the continuation's first row is missing, and the context
  request's value for that token is used; when it covered more (a sibling choice filled a block), the
  request is resent with the cache read off. Every row's token id is checked against the continuation.
  On the V1 runner (vLLM CPU) cached rows are uninitialised memory, and a garbage token id there kills
  vLLM's output processing, so the gate turns this path on only when the boot log names the V2 runner.

Anything else (a context with one continuation, a prompt over ``max_length``, a response that does not
line up) goes through the parent's echo path. And before a path carries a run, its first
``check_groups`` groups are also scored through the echo path and compared request by request. A
difference over bf16 noise (``agrees``) sends the same requests through the echo path once more, one at a
time (another batch shape), to see how far the echo path moves by itself. Both paths compute the same
quantity, also with an fp8 KV cache: vLLM's FlashAttention backend writes a pass's K/V into the cache and
reads every key back from it (Q quantized to fp8 too), cached in an earlier request or computed in this one.
But an fp8 step is 16x a bf16 one, so batch-dependent rounding that bf16 hides can move a score: on an H100
(vLLM 0.26, SmolLM2-135M AWQ W4A16, fp8 KV) 2 of 32 one-token scores were 0.29 nats apart, where the base
with a 16-bit KV cache agreed (the retired benchmarks/context_once_fp8.py measured both paths and the echo
path against itself on a card: benchmarks/results/release-time/README.md names the commit that has it). A
difference beyond ``ECHO_SPREAD_FACTOR`` times the echo path's own largest move (a misread row, a shifted
context boundary, a different quantity: nats) turns the path off for the rest of the run, and everything is
scored the echo way. Either way a warning says so, through ``warn`` (the accuracy run passes its run's log),
and ``checks`` keeps the record (the run report shows it). ``stats`` counts what went which way.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector
from lm_eval.api.registry import register_model
from lm_eval.models.openai_completions import LocalCompletionsAPI
from tenacity import retry, retry_if_not_exception_type, stop_after_attempt, wait_exponential

from quantize_serve.gates.accuracy.lanes import KvShare
from quantize_serve.gates.accuracy.results import ScoringCheck

log = logging.getLogger(__name__)

MODEL_NAME = "qs-completions"
# vLLM's limit on logprob_token_ids in one request (MAX_LOGPROB_TOKEN_IDS in 0.26 and 0.32)
MAX_TOKEN_IDS = 128
# The check against the echo path: a score may differ by bf16 noise, whose size grows with the logits'
# (bf16 keeps 8 bits: logits near 16 are 0.06 apart, and a -15.4 was seen as -15.5 between the two paths
# on vLLM CPU); a misaligned row or a wrong quantity is off by nats, and rows are also checked token by
# token.
TOLERANCE_NATS_PER_TOKEN = 0.1
TOLERANCE_RELATIVE = 0.02
# Beyond bf16 noise, a difference is held against a path only past this many times the echo path's own
# largest move (nats a token) between two batch shapes over the same requests: room for a sample's largest
# move varying from draw to draw; a misread row is off by nats.
ECHO_SPREAD_FACTOR = 2.0
GENERATE_PATH = "/inference/v1/generate"

Request = tuple[Any, list[int], list[int]]  # lm-eval's (cache_key, context ids, continuation ids)
Score = tuple[float, bool]  # lm-eval's (logprob, is_greedy)


class RowsMismatch(ValueError):
    """A response that does not line up with the request it answers."""


def group_by_context(requests: list[Request], max_length: int) -> tuple[dict[tuple, list[int]], list[int]]:
    """The requests' indices grouped by context (only contexts with several continuations, each prompt
    within ``max_length``), and the indices left to the echo path."""
    groups: dict[tuple, list[int]] = {}
    for i, (_, ctx, cont) in enumerate(requests):
        if ctx and cont and len(ctx) + len(cont) <= max_length:
            groups.setdefault(tuple(ctx), []).append(i)
    echo = [i for members in groups.values() if len(members) == 1 for i in members]
    echo += [
        i
        for i, (_, ctx, cont) in enumerate(requests)
        if not (ctx and cont) or len(ctx) + len(cont) > max_length
    ]
    kept = {ctx: members for ctx, members in groups.items() if len(members) > 1}
    return kept, sorted(echo)


def first_token_logprobs(response: dict[str, Any], token_ids: list[int]) -> tuple[dict[int, float], int]:
    """The context request's answer: each asked token's logprob at the generated position, and the
    greedy (sampled at temperature 0) token, from ``return_tokens_as_token_ids`` keys ``token_id:N``."""
    try:
        logprobs = response["choices"][0]["logprobs"]
        top = logprobs["top_logprobs"][0]
        sampled = int(str(logprobs["tokens"][0]).removeprefix("token_id:"))
        return {t: float(top[f"token_id:{t}"]) for t in token_ids}, sampled
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise RowsMismatch(f"the context request's logprobs lack an asked token ({exc!r})") from exc


def continuation_rows(
    response: dict[str, Any], context_len: int, cont: list[int]
) -> tuple[list[float], bool, int]:
    """The rows of ``cont`` in a generate response (V2 runner: ``n - cached`` entries, the first
    ``null``): their logprobs, whether each was the top token, and how many leading continuation tokens
    it lacks (0, or 1 when the cache covered the context's last token). More cached than that raises."""
    entries = response.get("prompt_logprobs")
    if not isinstance(entries, list):
        raise RowsMismatch("the generate response has no prompt_logprobs")
    cached = context_len + len(cont) - len(entries)
    if cached < 0 or cached > context_len:
        raise RowsMismatch(f"{cached} prompt tokens read from the cache for a context of {context_len}")
    missing = 1 if cached == context_len else 0
    rows = entries[len(entries) - (len(cont) - missing) :]
    values, greedy = [], True
    for row, token in zip(rows, cont[missing:], strict=True):
        entry = row.get(str(token)) if isinstance(row, dict) else None
        if entry is None:
            raise RowsMismatch(f"a row does not hold the continuation's token {token}")
        values.append(float(entry["logprob"]))
        greedy = greedy and entry.get("rank") == 1
    return values, greedy, missing


def agrees(new: Score, echo: Score, tokens: int, spread: float = 0.0) -> bool:
    """A context-once score within bf16 noise of the echo path's, plus ``spread`` nats a token (the echo
    path's own move between batch shapes, :func:`echo_spread`)."""
    per_token = TOLERANCE_NATS_PER_TOKEN + spread
    return abs(new[0] - echo[0]) <= per_token * max(tokens, 1) + TOLERANCE_RELATIVE * abs(echo[0])


def echo_spread(echo: dict[int, Score], again: dict[int, Score], tokens: dict[int, int]) -> float:
    """The echo path's largest move in nats a token: the same requests scored twice (two batch shapes)."""
    return max((abs(again[i][0] - echo[i][0]) / max(tokens[i], 1) for i in echo), default=0.0)


def _score(score: Score | None) -> str:
    return "none" if score is None else f"({score[0]:.4f}, {score[1]})"


class InFlight:
    """At most ``limit()`` holders at once: asyncio's semaphore (waiters go in in the order they came, which
    the groups' context order relies on), whose size follows ``limit()`` upward, read again whenever a holder
    leaves: a lane's part of the KV cache grows when the other lane ends (lanes.py ``KvShare``), and
    its next finished request lets as many more in. The limit never shrinks here (a share only grows)."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self.limit = limit
        self.size = limit()
        self._slots = asyncio.Semaphore(self.size)

    async def __aenter__(self) -> None:
        await self._slots.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._slots.release()
        while self.size < self.limit():
            self.size += 1
            self._slots.release()


@register_model(MODEL_NAME)
class ContextOnceCompletions(LocalCompletionsAPI):
    """``local-completions`` that computes each distinct context once (see the module's doc).

    Extra arguments: ``reuse_rows`` (multi-token continuations through the generate route; only on the V2
    model runner), ``check_groups`` (groups per path scored both ways before the path carries a run;
    0 skips the check)."""

    def __init__(
        self,
        *,
        reuse_rows: bool = False,
        check_groups: int = 8,
        warn: Callable[[str], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.warn = warn or log.warning
        self.reuse_rows = bool(reuse_rows)
        self.check_groups = int(check_groups)
        self.paths_checked: set[str] = set()
        self.paths_off: set[str] = set()  # after a failed check
        self.checks: list[ScoringCheck] = []  # each path's check against the echo path, as it went
        self.stats: Counter[str] = Counter()
        self.server_root = self.base_url.rsplit("/v1/", 1)[0]
        self.groups_in_flight: int | None = None  # unset: num_concurrent (_score_groups says why)
        # This model's share of the server's KV cache (lanes.py run_lanes): what its requests in
        # flight may hold at once, a part that grows as the other lanes end; None: unbounded
        # (num_concurrent alone)
        self.kv_share: KvShare | None = None
        self._in_flight: InFlight | None = None  # generate_until's bound on lm-eval's requests

    # lm-eval's tokenization of a call's loglikelihood requests (TemplateLM.loglikelihood) encodes each
    # request's whole prompt and its context, so a multiple-choice document's context is encoded again for
    # each choice; here once a call, and its choices share the one list. The same ids: lm-eval's own split
    # (its causal branch, _encode_pair in 0.4.13; tests/unit/test_scoring.py holds them equal). On the 2-core
    # CPU, a look of the production task set's scored tasks (2,986 requests, 747 contexts): 3.3 s against 5.3.
    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Score]:
        self._contexts: dict[str, list[int]] = {}
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._contexts = {}

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces > 0:  # trailing spaces go with the continuation
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole = self.tok_encode(context + continuation)
        contexts = getattr(self, "_contexts", {})
        if context not in contexts:
            contexts[context] = self.tok_encode(context)
        context_enc = contexts[context]
        return context_enc, whole[len(context_enc) :]

    def within_share(self, footprints: list[int], what: str, most: int) -> Callable[[], int]:
        """How many of these requests may be in flight at once, read again as they end: ``most``, or fewer
        where their KV tokens (``footprints``: each one's prompt and what it generates) would overflow this
        model's part of the server's cache. Over it, vLLM evicts the prefix-cache blocks a later request was
        to read (a group's context before its rows) and computes them again; lanes that share a server each
        keep to their part, which grows when another lane ends. The run's log says when the share bounds
        them."""
        most = min(most, len(footprints))
        share = self.kv_share
        if share is None or not footprints:
            return lambda: most
        mean = sum(footprints) / len(footprints)

        def bound() -> int:
            return min(most, max(1, int(share.part() // mean)))

        if (fit := bound()) < most:
            more = " (more once the other lanes end)" if share.part() < share.tokens else ""
            self.warn(
                f"scoring: {fit} {what} in flight at once (not {most}): {len(footprints)} of ~{mean:,.0f} KV "
                f"tokens each, within this lane's {share.part():,} tokens of the server's KV cache{more}"
            )
        return bound

    # lm-eval's generation requests: each holds its prompt's and its answer's blocks while it decodes, and a
    # call sends them all at once (``batch_size`` prompts a request), so on a small cache (the base beside a
    # quantization) they alone could fill it. lm-eval's own bound (``num_concurrent``) stays; ``InFlight``
    # holds its requests to this lane's part, read again as each ends.
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        if self.kv_share and self._concurrent > 1 and requests and all(len(r.args) == 2 for r in requests):
            contexts, kwargs = zip(*(r.args for r in requests), strict=True)
            answers = [k.get("max_gen_toks", self._max_gen_toks) for k in kwargs]
            prompts = self.tok_encode(list(contexts), add_special_tokens=self.add_bos_token)
            footprints = [len(p) + a for p, a in zip(prompts, answers, strict=True)]
            sequences = self.within_share(footprints, "prompts", self._concurrent * self._batch_size)
            self._in_flight = InFlight(lambda: max(1, sequences() // self._batch_size))
        try:
            return super().generate_until(requests, disable_tqdm=disable_tqdm)
        finally:
            self._in_flight = None

    async def amodel_call(self, *args: Any, **kwargs: Any) -> Any:
        if self._in_flight is None:
            return await super().amodel_call(*args, **kwargs)
        async with self._in_flight:
            return await super().amodel_call(*args, **kwargs)

    # lm-eval calls this with every loglikelihood request of a task (after its own tokenization)
    def _loglikelihood_tokens(self, requests: list[Request], **kwargs: Any) -> list[Score]:
        groups, echo = group_by_context(requests, self.max_length)
        by_kind: dict[str, list[tuple[tuple, list[int]]]] = {"first": [], "rows": []}
        for ctx, members in groups.items():
            kind = "rows" if any(len(requests[i][2]) > 1 for i in members) else "first"
            if kind in self.paths_off or (kind == "rows" and not self.reuse_rows):
                echo += members
            else:
                by_kind[kind].append((ctx, members))
        scores: dict[int, Score] = {}
        pending: list[tuple[tuple, list[int]]] = []
        for kind, ours in by_kind.items():  # each path checked against the echo path before it carries a run
            if ours and self.check_groups and kind not in self.paths_checked:
                sample, ours = ours[: self.check_groups], ours[self.check_groups :]
                scores |= self._checked(requests, sample, kind)
                if kind in self.paths_off:
                    echo += [i for _, members in ours for i in members]
                    ours = []
            pending += ours
        new, failed = asyncio.run(self._score_groups(requests, pending))
        scores |= new
        scores |= self._echo(requests, sorted(echo + failed))
        return [scores[i] for i in range(len(requests))]

    def _checked(
        self, requests: list[Request], sample: list[tuple[tuple, list[int]]], kind: str
    ) -> dict[int, Score]:
        """A path's first groups scored both ways (the echo path's scores are kept). Differences over bf16
        noise send the same requests through the echo path again, one at a time; a difference beyond
        ``ECHO_SPREAD_FACTOR`` times the echo path's own largest move, or a group whose responses did not
        line up, turns the path off for the rest of the run."""
        new, failed = asyncio.run(self._score_groups(requests, sample))
        indices = sorted(i for _, members in sample for i in members)
        echo = self._echo(requests, indices, count="check_echo_requests")
        self.paths_checked.add(kind)
        tokens = {i: len(requests[i][2]) for i in indices}
        over = [i for i in indices if i in failed or not agrees(new[i], echo[i], tokens[i])]
        spread = None
        if any(i not in failed for i in over):  # the echo path against itself, another batch shape
            spread = echo_spread(echo, self._echo_one_at_a_time(requests, indices), tokens)
        slack = ECHO_SPREAD_FACTOR * (spread or 0.0)
        bad = [i for i in over if i in failed or not agrees(new[i], echo[i], tokens[i], slack)]
        shown = (bad or over or [None])[0]
        check = ScoringCheck(
            path=kind,
            checked=len(indices),
            over_tolerance=len(over),
            disagreed=len(bad),
            not_lined_up=sum(i in failed for i in indices),
            largest_nats=round(max((abs(new[i][0] - echo[i][0]) for i in new), default=0.0), 4),
            first="" if shown is None else f"{_score(new.get(shown))} against {_score(echo[shown])}",
            first_tokens=0 if shown is None else tokens[shown],
            echo_spread=None if spread is None else round(spread, 4),
            spread_factor=ECHO_SPREAD_FACTOR,
            kept=not bad,
        )
        self.checks.append(check)
        self.stats[f"checked_{kind}"] = len(indices) - len(bad)
        if bad:
            self.paths_off.add(kind)
        if over:
            self.warn(f"scoring: {check.line()}")
        return echo

    def _echo(
        self, requests: list[Request], indices: list[int], count: str = "echo_requests"
    ) -> dict[int, Score]:
        if not indices:
            return {}
        self.stats[count] += len(indices)
        out = super()._loglikelihood_tokens([requests[i] for i in indices])
        return dict(zip(indices, out, strict=True))

    def _echo_one_at_a_time(self, requests: list[Request], indices: list[int]) -> dict[int, Score]:
        """The echo path's scores again, one prompt a request and one request at a time: vLLM computes each
        without its siblings (a batch shape unlike the first pass's)."""
        shape = self._concurrent, self._batch_size
        self._concurrent, self._batch_size = 1, 1
        try:
            return self._echo(requests, indices, count="check_echo_again")
        finally:
            self._concurrent, self._batch_size = shape

    async def _score_groups(
        self, requests: list[Request], groups: list[tuple[tuple, list[int]]]
    ) -> tuple[dict[int, Score], list[int]]:
        """Each group's context request, then its continuations' rows; a group whose responses do not
        line up is returned for the echo path."""
        scores: dict[int, Score] = {}
        failed: list[int] = []
        if not groups:
            return scores, failed
        sem = asyncio.Semaphore(self._concurrent)
        # A group's rows read the blocks its context request left in the prefix cache. Unbounded, every
        # context request queues ahead of the first group's rows (the semaphore wakes in order), and by the
        # time the rows come the contexts sent since have evicted their blocks: they are computed again.
        # As many groups in flight as requests keeps every request slot busy and the contexts awaiting their
        # rows to that many (benchmarks/results/release-time/README.md, context_order.json: the base's
        # one-look pass on the llama3 task set), and no more than this lane's share of the KV cache holds (a
        # group: its context's and rows' tokens).
        footprints = [len(ctx) + sum(len(requests[i][2]) for i in members) for ctx, members in groups]
        fixed = self.groups_in_flight
        in_flight = InFlight(
            (lambda: fixed) if fixed else self.within_share(footprints, "groups", self._concurrent)
        )
        async with ClientSession(
            connector=TCPConnector(limit=self._concurrent), timeout=ClientTimeout(total=self.timeout)
        ) as session:
            post = self._poster(session, sem)

            async def one(ctx: tuple, members: list[int]) -> None:
                try:
                    async with in_flight:
                        scores.update(
                            await self._score_group(post, list(ctx), {i: requests[i][2] for i in members})
                        )
                except RowsMismatch as exc:
                    log.debug("scoring: a group goes the echo way: %s", exc)
                    self.stats["fallback_groups"] += 1
                    failed.extend(members)

            await asyncio.gather(*(one(ctx, members) for ctx, members in groups))
        return scores, failed

    def _poster(
        self, session: ClientSession, sem: asyncio.Semaphore
    ) -> Callable[[str, dict], Awaitable[dict]]:
        @retry(
            stop=stop_after_attempt(self.max_retries),
            wait=wait_exponential(multiplier=0.5, min=1, max=10),
            retry=retry_if_not_exception_type(RowsMismatch),
            reraise=True,
        )
        async def post(path: str, payload: dict) -> dict:
            async with sem, session.post(self.server_root + path, json=payload, headers=self.header) as resp:
                if resp.status >= 400:
                    text = await resp.text()
                    if resp.status < 500:  # a request vLLM refuses: not worth a retry
                        raise RowsMismatch(f"{path} answered {resp.status}: {text[:200]}")
                    resp.raise_for_status()
                return await resp.json()

        return post

    async def _score_group(
        self, post: Callable[[str, dict], Awaitable[dict]], ctx: list[int], conts: dict[int, list[int]]
    ) -> dict[int, Score]:
        firsts = sorted({cont[0] for cont in conts.values()})
        if len(firsts) > MAX_TOKEN_IDS:
            raise RowsMismatch(f"{len(firsts)} first tokens, over vLLM's {MAX_TOKEN_IDS}")
        answer = await post(
            "/v1/completions",
            {
                "model": self.model,
                "prompt": ctx,
                "max_tokens": 1,
                "temperature": 0,
                "logprobs": len(firsts),
                "logprob_token_ids": firsts,
                "return_tokens_as_token_ids": True,
            },
        )
        first, sampled = first_token_logprobs(answer, firsts)
        self.stats["context_requests"] += 1
        out: dict[int, Score] = {}
        rows: dict[int, Awaitable[dict]] = {}
        for i, cont in conts.items():
            if len(cont) == 1:
                out[i] = (first[cont[0]], sampled == cont[0])
            else:
                rows[i] = self._rows(post, ctx, cont)
        for i, (values, greedy, missing) in zip(rows, await asyncio.gather(*rows.values()), strict=True):
            cont = conts[i]
            if missing:
                values, greedy = [first[cont[0]], *values], greedy and sampled == cont[0]
            out[i] = (sum(values), greedy)
        self.stats["context_once_requests"] += len(conts)
        return out

    async def _rows(self, post: Callable[[str, dict], Awaitable[dict]], ctx: list[int], cont: list[int]):
        params = {"max_tokens": 1, "temperature": 0, "prompt_logprobs": 0, "skip_reading_prefix_cache": False}
        payload = {"model": self.model, "token_ids": ctx + cont, "sampling_params": params}
        self.stats["row_requests"] += 1
        try:
            return continuation_rows(await post(GENERATE_PATH, payload), len(ctx), cont)
        except RowsMismatch:  # a sibling's blocks covered part of this continuation: compute it all
            self.stats["rows_resent"] += 1
            payload["sampling_params"] = params | {"skip_reading_prefix_cache": True}
            return continuation_rows(await post(GENERATE_PATH, payload), len(ctx), cont)
