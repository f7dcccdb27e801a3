"""The release's Prometheus rules (quantize_serve/release/alerts.py): derived from the gates' figures, checked
by promtool, and shown by ``promtool test rules`` to fire on the failure each names and to stay silent on a
real stress run's recorded /metrics samples (tests/fixtures/stress_metrics/, record.py there made them).

The recorded samples are ~0.1-0.25 s apart; each stands for one minute of production here, so the rules are
tested with the windows they ship with (5m, 10m, 30m) on the values the stress gate really read."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from quantize_serve.gates.decision import Decision
from quantize_serve.gates.stress import StressResult
from quantize_serve.recipe.load import load_recipe
from quantize_serve.release.alerts import OPERATOR_FILE, RULES_FILE, AlertRules, derive_alerts, seconds
from tests.conftest import ROOT
from tests.prometheus_tools import prometheus_tool
from tests.release_fixtures import run_report, soak_result

RECORDED = ROOT / "tests" / "fixtures" / "stress_metrics"
RECIPE = load_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml")
REPO, SHA = "quantize-serve/tiny-llama-awq-w4a16", "c0ffee" + "0" * 34
STRESS = StressResult.model_validate_json((RECORDED / "stress_result.json").read_text())
SAMPLES = [json.loads(line) for line in (RECORDED / "metrics.jsonl").read_text().splitlines()]
TARGET = {"instance": "10.0.0.7:8000", "job": "vllm"}
INJECT_AT = 20  # the sample (minute) a failure starts at
END = len(SAMPLES) - 1  # the last minute


def rules_of(recipe=RECIPE, **report) -> AlertRules | None:
    fields = {"stress": STRESS, "soak": soak_result()} | report
    return derive_alerts(run_report(repo_id=REPO, candidate_sha=SHA, run_id="r1", **fields), recipe)


def alert(rules: AlertRules, name: str):
    return next(r for r in rules.alerts if r.name == name)


# --- the derivation -----------------------------------------------------------------------------------------


def test_thresholds_come_from_the_gates_figures() -> None:
    rules = rules_of()
    assert [r.name for r in rules.alerts] == [
        "KVCacheNearFull",
        "PreemptionsIncreasing",
        "RequestsWaitingBeyondValidated",
        "OverlongPromptsRejected",
        "ServerMemoryGrowing",
        "ServerRestarted",
    ]
    kv = alert(rules, "KVCacheNearFull")
    assert kv.expr == 'avg_over_time(vllm:kv_cache_usage_perc{model_name="model"}[5m]) >= 0.95'
    assert (kv.for_window, kv.severity) == ("10m", "warning")
    assert "stress gate: peak KV usage 0.31 at concurrency 16" in kv.source and "no preemption" in kv.source
    assert alert(rules, "PreemptionsIncreasing").expr.endswith("[5m]) > 0")  # the gate saw none
    assert alert(rules, "RequestsWaitingBeyondValidated").expr.endswith("> 16")  # one batch of concurrency 16
    assert "2 of 2 prompts over max_model_len 512" in alert(rules, "OverlongPromptsRejected").source
    memory = alert(rules, "ServerMemoryGrowing")
    assert (
        "> 10)" in memory.expr and "RSS slope 0.40 MiB/min" in memory.source and "bound 10" in memory.source
    )
    assert rules.labels == {"model": REPO, "revision": SHA, "release": "production"}


def test_a_gate_that_measured_preemptions_or_a_queue_raises_those_thresholds() -> None:
    stress = STRESS.model_copy(update={"preemptions": 6, "duration_s": 60.0, "peak_waiting": 40})
    rules = rules_of(stress=stress)
    assert alert(rules, "PreemptionsIncreasing").expr.endswith("[5m]) > 30")  # 6 in 60 s = 30 in 5m
    assert "6 preemption(s) in 60 s" in alert(rules, "PreemptionsIncreasing").source
    assert alert(rules, "RequestsWaitingBeyondValidated").expr.endswith("> 40")  # the gate's own peak


def test_no_rules_without_a_stress_result_for_a_rejection_or_when_off() -> None:
    assert rules_of(stress=None) is None
    assert rules_of(decision=Decision(passed=False, checks=[])) is None
    off = RECIPE.model_copy(update={"alerts": RECIPE.alerts.model_copy(update={"enabled": False})})
    assert rules_of(recipe=off) is None


def test_without_a_soak_there_is_no_memory_rule_and_the_notes_say_why() -> None:
    rules = rules_of(soak=None)
    assert "ServerMemoryGrowing" not in [r.name for r in rules.alerts]
    assert any("no soak" in n for n in rules.notes)
    assert any("no model path or revision" in n for n in rules.notes)


def test_every_rule_carries_the_release_labels_and_its_source() -> None:
    rules = rules_of()
    for group in rules.groups():
        for entry in group["rules"]:
            assert entry["labels"]["model"] == REPO and entry["labels"]["revision"] == SHA
            assert entry["labels"]["release"] == "production"
            if "alert" in entry:
                assert entry["annotations"]["source"].startswith(("stress gate:", "soak gate:"))
                assert entry["labels"]["severity"] in ("critical", "warning", "info")


def test_the_selector_is_added_to_every_series() -> None:
    alerts = RECIPE.alerts.model_copy(update={"selector": 'namespace="llm"'})
    rules = rules_of(recipe=RECIPE.model_copy(update={"alerts": alerts}))
    for r in [*rules.alerts, *rules.records]:
        names = re.findall(r"([a-zA-Z_:][\w:]*)(\{[^}]*\}|\[)", r.expr)
        assert names and all('namespace="llm"' in sel for _, sel in names), r.expr


def test_the_metric_names_are_those_a_real_vllm_exposes() -> None:
    """Every series a rule reads is in the /metrics of the server the fixture was recorded from."""
    exposed = {
        line.split("{")[0].split(" ")[0] for line in (RECORDED / "metrics.txt").read_text().splitlines()
    }
    rules = rules_of()
    used = {
        n for r in [*rules.alerts, *rules.records] for n in re.findall(r"([a-zA-Z_:][\w:]*)\s*[{\[]", r.expr)
    }
    assert used and used <= exposed, used - exposed
    assert {"vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "http_requests_total"} <= used


def test_the_prometheus_rule_holds_the_same_groups_and_the_markdown_says_how_to_load() -> None:
    rules = rules_of()
    manifest = yaml.safe_load(rules.prometheus_rule_yaml())
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1" and manifest["kind"] == "PrometheusRule"
    assert manifest["spec"]["groups"] == yaml.safe_load(rules.rules_yaml())["groups"]
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", manifest["metadata"]["name"])
    text = rules.markdown()
    for r in rules.alerts:
        assert f"| {r.name} |" in text
    assert "rule_files" in text and "kubectl apply -f prometheusrule.yaml" in text


def test_durations() -> None:
    assert seconds("5m") == 300 and seconds("1h30m") == 5400 and seconds("0m") == 0
    with pytest.raises(ValueError):
        seconds("5 minutes")


def test_the_recipe_refuses_a_bad_duration_or_selector() -> None:
    from quantize_serve.recipe.alerts import AlertsSection

    with pytest.raises(ValueError, match="Prometheus duration"):
        AlertsSection(rate_window="5 minutes")
    with pytest.raises(ValueError, match="label matchers"):
        AlertsSection(selector="{namespace='llm'}")


# --- promtool -----------------------------------------------------------------------------------------------


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [prometheus_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_promtool_checks_both_files(tmp_path: Path) -> None:
    rules = rules_of()
    rules.write(tmp_path)
    checked = promtool("check", "rules", RULES_FILE, cwd=tmp_path)
    assert checked.returncode == 0 and "SUCCESS: 13 rules found" in checked.stdout, (
        checked.stdout + checked.stderr
    )
    # the PrometheusRule's spec is a rules file as the Operator hands it to Prometheus
    spec = yaml.safe_load((tmp_path / OPERATOR_FILE).read_text())["spec"]
    (tmp_path / "operator-spec.yaml").write_text(yaml.safe_dump(spec))
    assert promtool("check", "rules", "operator-spec.yaml", cwd=tmp_path).returncode == 0


def recorded(key: str) -> list[float]:
    """One recorded series, a sample a minute (a sample missing a key repeats the one before)."""
    out: list[float] = []
    for s in SAMPLES:
        out.append(s[key] if s.get(key) is not None else out[-1] if out else 0.0)
    return out


def http_counts() -> tuple[float, float]:
    """The completion endpoint's 2xx and 4xx answers at the end of the recorded run (its /metrics)."""
    text = (RECORDED / "metrics.txt").read_text()

    def count(status: str) -> float:
        pattern = (
            rf'^http_requests_total\{{handler="/v1/completions",method="POST",status="{status}"\}} (\S+)'
        )
        return float(re.search(pattern, text, re.M).group(1))

    return count("2xx"), count("4xx")


def healthy_series() -> dict[str, list[float]]:
    """The recorded run, by the series the rules read; the HTTP counters spread evenly over it."""
    ok, rejected = http_counts()
    n = len(SAMPLES)
    return {
        "kv": recorded("vllm:kv_cache_usage_perc"),
        "preemptions": recorded("vllm:num_preemptions_total"),
        "running": recorded("vllm:num_requests_running"),
        "waiting": recorded("vllm:num_requests_waiting"),
        "start": recorded("process_start_time_seconds"),
        "rss": recorded("rss_bytes"),  # the server's process tree (the API server's own RSS is part of it)
        "ok": [ok * i / (n - 1) for i in range(n)],
        "rejected": [rejected * i / (n - 1) for i in range(n)],
    }


def injected(failure: str) -> dict[str, list[float]]:
    """The recorded series with ``failure`` from minute INJECT_AT on."""
    s = healthy_series()
    after = range(INJECT_AT, len(SAMPLES))
    if failure == "KVCacheNearFull":  # the seed's "hovers at 1.0"
        s["kv"] = [1.0 if i in after else v for i, v in enumerate(s["kv"])]
    elif failure == "PreemptionsIncreasing":  # one preemption a minute
        s["preemptions"] = [v + max(0, i - INJECT_AT) for i, v in enumerate(s["preemptions"])]
    elif failure == "RequestsWaitingBeyondValidated":  # 40 waiting on 16 running: 2.5 batches
        s["waiting"] = [40.0 if i in after else v for i, v in enumerate(s["waiting"])]
    elif failure == "OverlongPromptsRejected":  # a 4xx for every 5 requests answered: a share of 1/6
        s["rejected"] = [v + max(0, i - INJECT_AT) for i, v in enumerate(s["rejected"])]
        s["ok"] = [v + 5 * max(0, i - INJECT_AT) for i, v in enumerate(s["ok"])]
    elif failure == "ServerMemoryGrowing":  # 20 MiB a minute, twice the soak's bound
        s["rss"] = [v + 20 * 2**20 * max(0, i - INJECT_AT) for i, v in enumerate(s["rss"])]
    elif failure == "ServerRestarted":  # a new process at minute 100
        s["start"] = [v + (600.0 if i >= 100 else 0) for i, v in enumerate(s["start"])]
    return s


def input_series(s: dict[str, list[float]]) -> list[dict]:
    vllm = 'model_name="model",engine="0",' + ",".join(f'{k}="{v}"' for k, v in TARGET.items())
    target = ",".join(f'{k}="{v}"' for k, v in TARGET.items())
    http = f'handler="/v1/completions",method="POST",{target}'
    names = {
        "kv": f"vllm:kv_cache_usage_perc{{{vllm}}}",
        "preemptions": f"vllm:num_preemptions_total{{{vllm}}}",
        "running": f"vllm:num_requests_running{{{vllm}}}",
        "waiting": f"vllm:num_requests_waiting{{{vllm}}}",
        "start": f"process_start_time_seconds{{{target}}}",
        "rss": f"process_resident_memory_bytes{{{target}}}",
        "ok": f'http_requests_total{{{http},status="2xx"}}',
        "rejected": f'http_requests_total{{{http},status="4xx"}}',
    }
    return [{"series": names[k], "values": " ".join(f"{v:.12g}" for v in values)} for k, values in s.items()]


def firing(rules: AlertRules, name: str) -> list[dict]:
    """The alert ``name`` as promtool lists it when firing."""
    entry = next(e for g in rules.groups() for e in g["rules"] if e.get("alert") == name)
    labels = dict(entry["labels"]) | TARGET
    if "model_name" in entry["expr"].split(" and ")[0]:  # a vLLM series keeps its own labels
        labels |= {"model_name": "model", "engine": "0"}
    if name == "OverlongPromptsRejected":  # sum by (instance)
        labels = dict(entry["labels"]) | {"instance": TARGET["instance"]}
    return [{"exp_labels": labels, "exp_annotations": entry["annotations"]}]


EVAL_AT = {  # minutes: when each injected failure has held longer than its window and its `for:`
    "KVCacheNearFull": END,
    "PreemptionsIncreasing": END,
    "RequestsWaitingBeyondValidated": END,
    "OverlongPromptsRejected": END,
    "ServerMemoryGrowing": END,
    "ServerRestarted": 102,
}


def run_promtool_test(tmp_path: Path, rules: AlertRules, series: dict, checks: list[dict]) -> None:
    rules.write(tmp_path)
    test = {
        "rule_files": [RULES_FILE],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input_series(series), "alert_rule_test": checks}],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False, width=10_000))
    result = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_recorded_healthy_run_fires_nothing(tmp_path: Path) -> None:
    rules = rules_of()
    checks = [
        {"eval_time": f"{t}m", "alertname": r.name, "exp_alerts": []}
        for r in rules.alerts
        for t in (10, 40, 80, END)
    ]
    run_promtool_test(tmp_path, rules, healthy_series(), checks)


@pytest.mark.parametrize("failure", list(EVAL_AT))
def test_each_alert_fires_on_the_failure_it_names_and_only_that_one(tmp_path: Path, failure: str) -> None:
    rules = rules_of()
    at = EVAL_AT[failure]
    checks = [
        {
            "eval_time": f"{at}m",
            "alertname": r.name,
            "exp_alerts": firing(rules, r.name) if r.name == failure else [],
        }
        for r in rules.alerts
    ]
    if failure == "KVCacheNearFull":  # pending, not yet firing, before its 10m `for:` has passed
        checks.append({"eval_time": f"{INJECT_AT + 8}m", "alertname": failure, "exp_alerts": []})
    if failure == "ServerRestarted":  # once the restart has left the 5m window it is quiet again
        checks.append({"eval_time": f"{END}m", "alertname": failure, "exp_alerts": []})
    run_promtool_test(tmp_path, rules, injected(failure), checks)


def test_the_recording_rules_give_the_figures_the_gate_read(tmp_path: Path) -> None:
    """The KV peak recorded over 5m around the stress gate's peak sample is the gate's peak KV usage."""
    rules = rules_of()
    kv = recorded("vllm:kv_cache_usage_perc")
    peak_at = kv.index(max(kv))
    assert max(kv) == pytest.approx(STRESS.peak_kv_cache_usage)
    labels = rules.labels | {"model_name": "model"}
    series = (
        "model_name:vllm_kv_cache_usage_perc:max5m{"
        + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        + "}"
    )
    rules.write(tmp_path)
    test = {
        "rule_files": [RULES_FILE],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series(healthy_series()),
                "promql_expr_test": [
                    {
                        "expr": series,
                        "eval_time": f"{peak_at + 2}m",
                        "exp_samples": [{"labels": series, "value": float(f"{max(kv):.12g}")}],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False, width=10_000))
    result = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
