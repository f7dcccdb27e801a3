"""The release's saturation alert on the real tools: a Prometheus server (Debian's, started here on
127.0.0.1 with a 1 s scrape and evaluation interval) scrapes a real vLLM CPU server while the stress gate
runs at its validated concurrency (KVCacheNearFull stays inactive), then while traffic far above it holds
the KV cache at the top (the alert goes pending, then firing).

Its own boot: the tiny base model with 8 KV blocks of 128 tokens (7 usable; 16-bit KV, served on every
CPU), so a burst can fill the cache; the session's production boot holds its whole max_num_seqs at
max_model_len (the gates' promise), so no traffic could fill it. The rule's windows are shortened for
the test (rate window and `for:` of a few seconds instead of 5m and 10m); everything else is the
release's rule as derive_alerts writes it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from quantize_serve.gates.stress import StressResult, run_stress_test
from quantize_serve.recipe.gates import StressGate
from quantize_serve.recipe.load import load_recipe
from quantize_serve.release.alerts import RULES_FILE, derive_alerts
from quantize_serve.serving.server import SERVED_NAME, ServerSpec, free_port, vllm_server
from quantize_serve.traffic.requests import token_prompts
from tests.conftest import ROOT
from tests.prometheus_tools import prometheus_tool
from tests.release_fixtures import run_report

RECIPE = load_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml")
MODEL = ROOT / "models" / "tiny-llama"
KV_BYTES = 8 * 128 * 1024 + 1000  # 8 CPU blocks of 128 tokens x 1,024 bytes (tests/engines/test_stress.py)
# The validated concurrency: 2 requests of at most 64 + 32 tokens hold 2 of the blocks
VALIDATED = StressGate(
    concurrency=2,
    num_requests=8,
    max_duration_s=120,
    prompt_tokens=[16, 64],
    output_tokens=[8, 32],
    long_prompt_share=0,
    overlong_prompts=1,
    request_timeout_s=60,
)
# Traffic far above it: 16 at once, each 2 blocks at its prompt and 4 once its output has grown
BURST, BURST_PROMPT, BURST_OUTPUT = 16, 250, 200
ALERT = "KVCacheNearFull"


@contextmanager
def prometheus(folder: Path, target_port: int, rules: Path) -> Iterator[str]:
    """A Prometheus on 127.0.0.1 scraping 127.0.0.1:``target_port`` every second; stopped on exit, always."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (folder / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            prometheus_tool("prometheus"),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",  # POST /-/reload: the rules derived from the gate's result
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not ready(url):
            assert proc.poll() is None and time.monotonic() < deadline, (
                folder / "prometheus.log"
            ).read_text()
            time.sleep(0.2)
        yield url
    finally:
        with_group = os.getpgid(proc.pid) if proc.poll() is None else None
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(with_group, signal.SIGKILL)
            proc.wait(5)
        log.close()


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def alert_state(url: str) -> str | None:
    """The state of ALERT (inactive, pending or firing) as Prometheus's rules API reports it."""
    for group in get(url + "/api/v1/rules?type=alert")["data"]["groups"]:
        for rule in group["rules"]:
            if rule["name"] == ALERT:
                return rule["state"]
    return None


def watch(url: str, stop: threading.Event, states: list[str]) -> None:
    """ALERT's state every 0.25 s until ``stop``, each change once."""
    while not stop.is_set():
        state = alert_state(url)
        if state and (not states or states[-1] != state):
            states.append(state)
        stop.wait(0.25)


def burst(base_url: str, until: threading.Event) -> None:
    """BURST requests in flight until ``until``: far more KV than the cache holds."""
    prompt = token_prompts(str(MODEL), random.Random(7))

    def one() -> None:
        while not until.is_set():
            body = {
                "model": SERVED_NAME,
                "prompt": prompt(BURST_PROMPT),
                "max_tokens": BURST_OUTPUT,
                "ignore_eos": True,
            }
            request = urllib.request.Request(
                base_url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=120) as r:
                r.read()

    workers = [threading.Thread(target=one, daemon=True) for _ in range(BURST)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(150)


@pytest.mark.timeout(300)
def test_saturation_alert_fires_on_a_full_kv_cache_and_not_at_the_validated_concurrency(
    tmp_path: Path,
) -> None:
    spec = ServerSpec(
        model_dir=str(MODEL), serve=RECIPE.serve, kv_cache_dtype="auto", kv_cache_memory_bytes=KV_BYTES
    )
    # the rule as the release writes it, with windows of seconds instead of minutes; vLLM counts 7 usable
    # blocks here, so usage moves in steps of 1/7 and 0.85 is "at most one block free"
    kv = RECIPE.alerts.kv_cache.model_copy(update={"for_window": "3s", "near_full": 0.85})
    alerts = RECIPE.alerts.model_copy(update={"rate_window": "3s", "kv_cache": kv})
    recipe = RECIPE.model_copy(update={"alerts": alerts})
    with vllm_server(spec, log_path=tmp_path / "vllm.log") as server:
        # the rules need the gate's figures, and Prometheus must already watch while the gate runs: the
        # rules file is written from a placeholder first, then from the real result, and reloaded
        first = StressResult.model_validate_json(
            (ROOT / "tests" / "fixtures" / "stress_metrics" / "stress_result.json").read_text()
        )
        rules = derive_alerts(
            run_report(repo_id="r/m", candidate_sha="a" * 40, run_id="r", stress=first), recipe
        )
        rules.write(tmp_path)
        with prometheus(tmp_path, server.port, tmp_path / RULES_FILE) as url:
            stop, states = threading.Event(), []
            watcher = threading.Thread(target=watch, args=(url, stop, states), daemon=True)
            watcher.start()
            try:
                validated = run_stress_test(
                    server, VALIDATED, RECIPE.serve, tokenizer_dir=str(MODEL), output_dir=tmp_path / "stress"
                )
                assert validated.passed, validated.failures
                up = get(url + '/api/v1/query?query=up{job="vllm"}')["data"]["result"]
                assert up and up[0]["value"][1] == "1", up  # Prometheus scraped vLLM during the gate
                seen = get(url + "/api/v1/query?query=max_over_time(vllm:kv_cache_usage_perc[2m])")
                assert seen["data"]["result"], seen
                quiet = list(states)
                # the gate's own figures, as a release derives them
                report = run_report(repo_id="r/m", candidate_sha="a" * 40, run_id="r", stress=validated)
                derive_alerts(report, recipe).write(tmp_path)
                urllib.request.urlopen(urllib.request.Request(url + "/-/reload", method="POST"), timeout=10)

                until = threading.Event()
                load = threading.Thread(target=burst, args=(server.base_url, until), daemon=True)
                load.start()
                deadline = time.monotonic() + 60
                while "firing" not in states and time.monotonic() < deadline:
                    time.sleep(0.25)
                until.set()
                load.join(150)
            finally:
                stop.set()
                watcher.join(5)
            peak = get(url + "/api/v1/query?query=max_over_time(vllm:kv_cache_usage_perc[2m])")
    print(
        f"validated: peak KV {validated.peak_kv_cache_usage}, states {quiet}; burst: states {states}, {peak}"
    )
    assert quiet == ["inactive"], quiet  # the gate's traffic never made it pending
    after = states[len(quiet) - 1 :]
    assert "pending" in after and "firing" in after, states
    assert after.index("pending") < after.index("firing"), states
