"""Requests of exact token counts and how they are sent: the prompts, the async client, each
answer classified, and a coroutine raced against the server's death (stress and soak)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from quantize_serve.core import ahead, progress
from quantize_serve.core.errors import GateError
from quantize_serve.serving.server import SERVED_NAME

if TYPE_CHECKING:
    import aiohttp


@dataclass(frozen=True)
class Probe:
    """One planned request."""

    index: int
    kind: Literal["normal", "long", "overlong"]
    prompt: list[int]
    max_tokens: int


def token_prompts(tokenizer_dir: str, rng: random.Random) -> Callable[[int], list[int]]:
    """prompt(n): n token ids drawn with rng from the tokenizer's vocabulary (no special tokens),
    BOS first when the tokenizer adds one. Also the soak test's generator (soak.py)."""
    ahead.settle()  # work started ahead imports transformers too (core/ahead.py)
    from transformers import AutoTokenizer  # heavy import, only where used

    try:
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    except (OSError, ValueError) as exc:
        raise GateError(
            f"cannot load the tokenizer from {tokenizer_dir}: {exc}. Fix: pass the "
            "served checkpoint's folder (it holds tokenizer.json)"
        ) from exc
    special = set(tok.all_special_ids)
    vocab = [i for i in range(tok.vocab_size) if i not in special]
    bos = tok.bos_token_id
    prefix = [bos] if bos is not None and tok("a").input_ids[:1] == [bos] else []

    def prompt(n: int) -> list[int]:
        return prefix + rng.choices(vocab, k=n - len(prefix))

    return prompt


async def send_probe(session: aiohttp.ClientSession, url: str, probe: Probe, timeout_s: float) -> dict:
    import aiohttp  # heavy (~0.15 s): imported where requests are sent

    rec: dict[str, Any] = {
        "index": probe.index,
        "kind": probe.kind,
        "prompt_tokens": len(probe.prompt),
        "max_tokens": probe.max_tokens,
    }
    body = {
        "model": SERVED_NAME,
        "prompt": probe.prompt,
        "max_tokens": probe.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    t0 = time.monotonic()
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            text = await resp.text()
            rec["status"] = resp.status
            if resp.status == 200:
                usage = json.loads(text).get("usage") or {}
                rec["completion_tokens"] = usage.get("completion_tokens")
                rec["usage_prompt_tokens"] = usage.get("prompt_tokens")
            else:
                rec["error"] = f"HTTP {resp.status}: {text[:300]}"
    except TimeoutError:  # aiohttp's total timeout
        rec["error"] = f"no answer within request_timeout_s={timeout_s:g} s"
        rec["outcome"] = "timeout"
    except (aiohttp.ClientError, json.JSONDecodeError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["latency_s"] = round(time.monotonic() - t0, 3)
    rec.setdefault("outcome", classify(probe, rec))
    return rec


def classify(probe: Probe, rec: dict) -> str:
    status = rec.get("status")
    if probe.kind == "overlong":
        return "rejected_overlong" if status == 400 else ("5xx" if (status or 0) >= 500 else "other_error")
    if status == 200:
        return "completed" if rec.get("completion_tokens") == probe.max_tokens else "wrong_tokens"
    return "5xx" if (status or 0) >= 500 else "other_error"


async def run_steps(
    base_url: str,
    schedule: list[tuple[int, list[Probe]]],
    timeout_s: float,
    records: dict[int, dict],
    log: Callable[[str], None],
) -> None:
    import aiohttp  # heavy (~0.15 s): imported where requests are sent

    url = base_url + "/v1/completions"
    total = sum(len(probes) for _, probes in schedule)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for concurrency, probes in schedule:
            log(f"stress: {len(probes)} requests at concurrency {concurrency}")
            sem = asyncio.Semaphore(concurrency)

            async def one(p: Probe) -> None:
                async with sem:
                    records[p.index] = await send_probe(session, url, p, timeout_s)
                progress.count("requests", len(records), total)

            await asyncio.gather(*(one(p) for p in probes))


async def race(coro: Coroutine, dead: asyncio.Event, timeout_s: float) -> tuple[str, Any]:
    """Run coro until it ends, the server dies, or time runs out (then it is cancelled).

    Returns ("done", its value), ("died", None) or ("timeout", None).
    """
    task, watcher = asyncio.ensure_future(coro), asyncio.ensure_future(dead.wait())
    done, _ = await asyncio.wait(
        {task, watcher}, timeout=max(timeout_s, 0.0), return_when=asyncio.FIRST_COMPLETED
    )
    watcher.cancel()
    if task in done:
        return "done", task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return ("died" if dead.is_set() else "timeout"), None


def answer_failures(counts: Any, request_timeout_s: float, first: str) -> list[str]:
    """What went wrong with the answers, one line each: server errors, timeouts, wrong token
    counts (``counts`` has ``errors_5xx``, ``timeouts``, ``wrong_token_counts``; stress and soak)."""
    f = []
    if counts.errors_5xx:
        f.append(f"{counts.errors_5xx} request(s) got a server error (5xx){first}")
    if counts.timeouts:
        f.append(
            f"{counts.timeouts} request(s) got no answer within request_timeout_s={request_timeout_s:g} s"
        )
    if counts.wrong_token_counts:
        f.append(
            f"{counts.wrong_token_counts} request(s) returned a completion_tokens count other than max_tokens"
        )
    return f


T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` run to its end from sync or async code (an async flow: its own loop, in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
