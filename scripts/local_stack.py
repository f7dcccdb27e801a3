"""A local stack for the demo and the end-to-end test: a real Prefect server, the local Hub
endpoint, the work pools, the `gpu` concurrency limit and the deployments of prefect.yaml, and a
process worker per run. Everything it starts, it stops; the Prefect database is kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from quantize_serve.local_api import FIRST_START_S, SERVER_ENV
from quantize_serve.serving.server import (  # every process here leads its own group
    free_port,
    stop_process_group,
    wait_ready,
)

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# the environment's `prefect` command (make setup's .venv), else the one on PATH
PREFECT = str(BIN / "prefect") if (BIN / "prefect").exists() else (shutil.which("prefect") or "prefect")
# pool -> (type, base job template file or None for the type's default), as `prefect work-pool create`
# takes them. gpu-k8s is there because `prefect deploy --all` fails on a deployment whose pool does not
# exist (llama3-k8s); nothing runs on it here.
WORK_POOLS = {
    "local-cpu": ("process", None),
    "gpu": ("process", None),
    "gpu-k8s": ("kubernetes", ROOT / "deploy" / "k8s" / "gpu-k8s-job-template.json"),
}


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    outcome = wait_ready(proc, lambda: _answers(url), timeout_s, interval_s=0.5)
    if outcome == "exited":
        raise RuntimeError(f"{url}: the process exited early; see {log}:\n{log.read_text()[-3000:]}")
    if outcome == "timed out":
        raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s; see {log}")


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).read()
        return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


@dataclass
class Stack:
    home: Path
    env: dict[str, str]
    api_url: str
    hub_endpoint: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def prefect(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [PREFECT, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and out.returncode != 0:
            raise RuntimeError(
                f"prefect {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
            )
        return out

    def run_deployment(
        self,
        name: str,
        *,
        pool: str = "local-cpu",
        params: dict | None = None,
        job_variables: dict | None = None,
        timeout: float = 1800,
        echo: Callable[[str], None] | None = None,
    ) -> tuple[int, str, str | None]:
        """Run the deployment with --watch while a process worker serves the pool; (rc, output, run id).

        --watch prints the run's log lines and state changes as they happen; ``echo`` receives
        each line as it arrives (the demo prints them). The worker polls until it is stopped
        after the run ends (a --run-once worker can poll before the run is scheduled and exit,
        leaving --watch waiting for nothing).
        """
        log = self.home / f"worker-{int(time.time())}.log"
        with log.open("w") as fh:
            worker = subprocess.Popen(
                [PREFECT, "worker", "start", "--pool", pool],
                cwd=ROOT,
                env=self.env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            args = ["deployment", "run", f"quantize-serve/{name}", "--watch"]
            for k, v in (params or {}).items():
                args += ["--param", f"{k}={v}"]
            for k, v in (job_variables or {}).items():  # JSON values, as --job-variable parses them
                args += ["--job-variable", f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}"]
            rc, output = self.watch(args, timeout=timeout, echo=echo)
        finally:
            stop_process_group(worker, 30)
        text = output + "\n--- worker ---\n" + log.read_text()
        match = re.search(r"UUID: ([0-9a-f-]{36})", output)
        return rc, text, match.group(1) if match else None

    def watch(
        self, args: list[str], *, timeout: float, echo: Callable[[str], None] | None
    ) -> tuple[int, str]:
        """A prefect command whose output is read line by line as it comes; (rc, output)."""
        env = {**self.env, "PREFECT_CLI_WRAP_LINES": "false"}  # one log record, one line
        proc = subprocess.Popen(
            [PREFECT, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        timed_out = threading.Event()

        def stop() -> None:
            timed_out.set()
            stop_process_group(proc, 10)

        timer = threading.Timer(timeout, stop)
        timer.start()
        lines: list[str] = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if echo:
                    echo(line.rstrip("\n"))
            rc = proc.wait()
        finally:
            timer.cancel()
            stop_process_group(proc, 10)
        if timed_out.is_set():
            lines.append(f"\nprefect {' '.join(args)}: stopped after {timeout:.0f} s\n")
        return rc, "".join(lines)


def create_pools_and_limit(api_url: str) -> None:
    """The work pools and the `gpu` concurrency limit (limit 1), where missing: what `prefect
    work-pool create` and `prefect gcl create` do, through one client (each CLI call is one more
    interpreter importing Prefect, seconds apiece on a small machine)."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.workers.utilities import get_default_base_job_template_for_infrastructure_type

    async def create() -> None:
        async with get_client() as client:
            try:
                await client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name="gpu", limit=1)
                )
            except ObjectAlreadyExists:
                pass
            for pool, (kind, template) in WORK_POOLS.items():
                job = (
                    json.loads(template.read_text())
                    if template
                    else await get_default_base_job_template_for_infrastructure_type(kind)
                )
                try:
                    await client.create_work_pool(WorkPoolCreate(name=pool, type=kind, base_job_template=job))
                except ObjectAlreadyExists:
                    pass

    with temporary_settings({PREFECT_API_URL: api_url}):
        asyncio.run(create())


@contextmanager
def local_stack(
    home: Path, *, hub_token: str, deploy: bool = True, extra_env: dict[str, str] | None = None
) -> Iterator[Stack]:
    home.mkdir(parents=True, exist_ok=True)
    port, hub_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "PREFECT_API_URL")}
    env.update(
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
        **SERVER_ENV,  # the settings of every Prefect server the product starts (telemetry off)
        PREFECT_UI_ENABLED="true",
        PREFECT_LOGGING_LEVEL="INFO",
        # the server streams run logs out (off by default), so `deployment run --watch` shows them
        PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED="true",
        PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED="true",
        HF_ENDPOINT=f"http://127.0.0.1:{hub_port}",
        HF_TOKEN=hub_token,
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_DATASETS_OFFLINE="1",
        QS_PROJECT_DIR=str(ROOT),
        PATH=f"{BIN}:{os.environ.get('PATH', '')}",
    )
    env.update(extra_env or {})  # the caller's word last (it may turn the datasets back online)
    stack = Stack(home=home, env=env, api_url=env["PREFECT_API_URL"], hub_endpoint=env["HF_ENDPOINT"])
    try:
        server_log = home / "prefect-server.log"
        stack.procs.append(
            subprocess.Popen(
                [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                cwd=ROOT,
                env=env,
                stdout=server_log.open("w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        hub_log = home / "hub.log"
        stack.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "localhub",
                    "--root",
                    str(home / "hub"),
                    "--port",
                    str(hub_port),
                    "--token",
                    hub_token,
                ],
                cwd=ROOT,
                env=env,
                stdout=hub_log.open("w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        # a first start (a fresh .demo/prefect) migrates the database: minutes on a small, busy machine
        wait_http(f"{env['PREFECT_API_URL']}/health", FIRST_START_S, stack.procs[0], server_log)
        wait_http(f"{env['HF_ENDPOINT']}/api/models/local/health", 30, stack.procs[1], hub_log)
        create_pools_and_limit(stack.api_url)
        if deploy:
            stack.prefect("--no-prompt", "deploy", "--all")
        yield stack
    finally:
        for proc in reversed(stack.procs):
            stop_process_group(proc, 20)
