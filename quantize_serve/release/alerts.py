"""The Prometheus rules a promoted release carries, derived from what its gates measured.

:func:`derive_alerts` reads a run's report (the stress gate's peaks, the soak's memory bound, the
capacity the serving profile pins) and the recipe's ``alerts`` section (windows, severities, the
thresholds production chooses) and returns :class:`AlertRules`: alerting rules, each naming in its
annotations the figure it came from, and recording rules for the figures the report states, so that
production can be compared with the gates' numbers. It writes them as a Prometheus rules file
(``rule_files``) and as a Kubernetes ``PrometheusRule`` for the Prometheus Operator, and renders them as a
Markdown section for the report and the card. A run without a stress result, or whose gates did not pass,
gets no rules. docs/concepts/alerts.md explains each rule; the metric names are vLLM's own, read from a
real server's /metrics (tests/fixtures/stress_metrics/metrics.txt).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field

from quantize_serve.recipe.alerts import DURATION
from quantize_serve.recipe.model import Recipe
from quantize_serve.report.run_report import RunReport
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import SERVED_NAME

RULES_FILE = "prometheus-rules.yaml"  # plain Prometheus: a rule_files entry
OPERATOR_FILE = "prometheusrule.yaml"  # the Prometheus Operator: kubectl apply -f
# vLLM's API server counts its HTTP answers by handler and status class (prometheus-fastapi-instrumentator)
COMPLETION_HANDLERS = "/v1/completions|/v1/chat/completions"
UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800, "y": 31_536_000}
NO_REVISION_RULE = (
    "No rule watches for a server that serves another revision than the release ref: vLLM's /metrics "
    "carries no model path or revision (vllm:cache_config_info holds the cache settings, and model_name is "
    "the served name, the same for every revision), so Prometheus cannot tell two revisions apart. The "
    "labels model, revision and release on every rule say which release the rules belong to; load them "
    "beside the deployment of that revision."
)


def seconds(duration: str) -> float:
    """A Prometheus duration (``5m``, ``1h30m``) in seconds."""
    if not DURATION.match(duration):
        raise ValueError(f"{duration!r} is not a Prometheus duration")
    return sum(float(n) * UNIT_SECONDS[u] for n, u in re.findall(r"(\d+)(ms|[smhdwy])", duration))


class Rule(BaseModel):
    """One rule: an alert (``for_window`` and ``severity`` set) or a recording rule."""

    kind: Literal["alert", "record"]
    name: str
    expr: str
    summary: str  # what it watches, in a line
    source: str  # the figure it came from (the gate and its number)
    threshold: str = ""  # the condition, as people read it
    for_window: str | None = None
    severity: str | None = None

    def entry(self, labels: dict[str, str]) -> dict[str, Any]:
        """The rule as Prometheus's rule-file entry."""
        if self.kind == "record":
            return {"record": self.name, "expr": self.expr, "labels": dict(labels)}
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_window,
            "labels": {"severity": self.severity, **labels},
            "annotations": {
                "summary": self.summary,
                "description": f"{self.summary} Fires when {self.threshold}.",
                "source": self.source,
            },
        }


class AlertRules(BaseModel):
    """A release's rules: who they belong to (labels on every rule), the rules, and what was left out."""

    model: str
    revision: str
    release: str
    alerts: list[Rule]
    records: list[Rule]
    notes: list[str] = Field(default_factory=list)  # rules not derived, and why

    @property
    def labels(self) -> dict[str, str]:
        return {"model": self.model, "revision": self.revision, "release": self.release}

    @property
    def group(self) -> str:
        return f"quantize-serve:{self.model}@{self.release}"

    def groups(self) -> list[dict[str, Any]]:
        return [
            {"name": f"{self.group}:alerts", "rules": [r.entry(self.labels) for r in self.alerts]},
            {"name": f"{self.group}:records", "rules": [r.entry(self.labels) for r in self.records]},
        ]

    def rules_yaml(self) -> str:
        """The Prometheus rules file (``rule_files``)."""
        return _header(self) + yaml.safe_dump({"groups": self.groups()}, sort_keys=False, width=1000)

    def prometheus_rule(self) -> dict[str, Any]:
        """The same rules as a Kubernetes ``PrometheusRule`` (monitoring.coreos.com/v1)."""
        name = _dns_label(f"{self.model}-{self.release}")[:253]
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": name,
                "labels": {
                    "app.kubernetes.io/part-of": "quantize-serve",
                    "quantize-serve/release": _dns_label(self.release)[:63],
                },
                "annotations": self.labels,
            },
            "spec": {"groups": self.groups()},
        }

    def prometheus_rule_yaml(self) -> str:
        return _header(self) + yaml.safe_dump(self.prometheus_rule(), sort_keys=False, width=1000)

    def write(self, folder: Path) -> list[Path]:
        """Both files into ``folder`` (the release's staged files); their paths."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / RULES_FILE).write_text(self.rules_yaml())
        (folder / OPERATOR_FILE).write_text(self.prometheus_rule_yaml())
        return [folder / RULES_FILE, folder / OPERATOR_FILE]

    def markdown(self, heading: str = "##") -> str:
        """The rules for the report and the card: each with its threshold and source, and how to load them."""
        lines = [
            f"{heading} Alerts in production",
            "",
            f"`{RULES_FILE}` (plain Prometheus) and `{OPERATOR_FILE}` (the Prometheus Operator) hold "
            f"these rules, labelled model `{self.model}`, revision `{self.revision[:12]}`, release "
            f"`{self.release}`. Thresholds come from this release's gates:",
            "",
            "| alert | fires when | for | severity | from |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.name} | {_cell(r.threshold)} | {r.for_window} | {r.severity} | {_cell(r.source)} |"
            for r in self.alerts
        ]
        lines += ["", "Recording rules, to compare production with the gates' figures:", ""]
        lines += ["| series | is | compare with |", "|---|---|---|"]
        lines += [f"| `{r.name}` | {_cell(r.summary)} | {_cell(r.source)} |" for r in self.records]
        lines += [f"\n{n}" for n in self.notes]
        lines += [
            "",
            f"Plain Prometheus: copy `{RULES_FILE}` beside `prometheus.yml`, list it under `rule_files:` and "
            f"reload; `promtool check rules {RULES_FILE}` checks it first. The Prometheus Operator: "
            f"`kubectl apply -f {OPERATOR_FILE}` in the namespace its Prometheus watches, with the labels "
            "its `ruleSelector` selects added under `metadata.labels`.",
        ]
        return "\n".join(lines)


def derive_alerts(
    report: RunReport, recipe: Recipe, *, served_model_name: str = SERVED_NAME
) -> AlertRules | None:
    """The rules for the release of ``report``; None where there is nothing to derive them from or nothing
    to watch: alerts off, no stress result (the gates never measured the server), or gates that did not pass
    (a rejected candidate carries no rules)."""
    section, stress = recipe.alerts, report.stress
    if not section.enabled or stress is None or not report.decision.passed:
        return None
    serve = recipe.serve
    c = stress.concurrency_steps[-1] if stress.concurrency_steps else serve.concurrency(None)
    extra = f",{section.selector}" if section.selector else ""
    bare = f"{{{section.selector}}}" if section.selector else ""  # a selector for series without model_name
    vllm = f'{{model_name="{served_model_name}"{extra}}}'
    # process and HTTP series carry no model_name: kept to the instances that serve this model
    served = f"on (instance) vllm:num_requests_running{vllm}"
    w = section.rate_window
    peak_kv = stress.peak_kv_cache_usage or 0.0
    preempted = stress.preemptions or 0
    at = f"at concurrency {c} (serve.max_num_seqs {serve.max_num_seqs}, max_model_len {serve.max_model_len})"
    stress_kv = f"stress gate: peak KV usage {peak_kv:.2f} {at}; " + (
        "no preemption" if not preempted else f"{preempted} preemption(s) in {stress.duration_s:g} s"
    )
    kv_tokens = _kv_tokens(report)
    alerts: list[Rule] = []
    notes: list[str] = []

    a = section.kv_cache
    if a.enabled:
        alerts.append(
            Rule(
                kind="alert",
                name="KVCacheNearFull",
                expr=f"avg_over_time(vllm:kv_cache_usage_perc{vllm}[{w}]) >= {a.near_full:g}",
                summary="The KV cache stays near full: the batch is larger than the cache the gates "
                "validated; requests queue, then get preempted.",
                source=stress_kv + (f"; KV cache {kv_tokens:,} tokens" if kv_tokens else ""),
                threshold=f"KV usage averaged over {w} >= {a.near_full:g} (alerts.kv_cache.near_full)",
                for_window=a.for_window,
                severity=a.severity,
            )
        )
    a = section.preemptions
    if a.enabled:
        # the gate's own preemptions, as a count per rate window (0 when it saw none, as it promises)
        allowed = (
            round(preempted * seconds(w) / stress.duration_s, 2) if preempted and stress.duration_s else 0
        )
        alerts.append(
            Rule(
                kind="alert",
                name="PreemptionsIncreasing",
                expr=f"increase(vllm:num_preemptions_total{vllm}[{w}]) > {allowed:g}",
                summary="vLLM preempts requests (their KV blocks freed, their work recomputed): the KV cache "
                "cannot hold the running batch.",
                source=stress_kv,
                threshold=f"more than {allowed:g} preemption(s) in {w}",
                for_window=a.for_window,
                severity=a.severity,
            )
        )
    a = section.queue
    if a.enabled:
        waiting = max(stress.peak_waiting or 0, math.ceil(a.batches * c))
        alerts.append(
            Rule(
                kind="alert",
                name="RequestsWaitingBeyondValidated",
                expr=f"vllm:num_requests_waiting{vllm} > {waiting}",
                summary="More requests wait than the validated concurrency drains in a batch.",
                source=f"stress gate: peak {stress.peak_waiting} waiting, {stress.peak_running} running {at}",
                threshold=f"more than {waiting} requests waiting ({a.batches:g} x concurrency {c}, "
                f"or the gate's peak)",
                for_window=a.for_window,
                severity=a.severity,
            )
        )
    a = section.overlong_prompts
    if a.enabled:
        http = f'http_requests_total{{handler=~"{COMPLETION_HANDLERS}"{extra}'
        alerts.append(
            Rule(
                kind="alert",
                name="OverlongPromptsRejected",
                expr=f'(sum by (instance) (rate({http},status="4xx"}}[{w}])) / sum by (instance) '
                f"(rate({http}}}[{w}])) > {a.max_share:g}) and {served}",
                summary="Clients send prompts this release rejects (HTTP 400: longer than max_model_len).",
                source=f"stress gate: {stress.rejected_overlong} of {stress.overlong_expected} prompts over "
                f"max_model_len {serve.max_model_len} got a clean HTTP 400, the server stayed up",
                threshold=f"4xx share of the completion endpoints over {w} > {a.max_share:g} "
                "(alerts.overlong_prompts.max_share)",
                for_window=a.for_window,
                severity=a.severity,
            )
        )
    a, soak = section.memory_growth, report.soak
    if a.enabled and soak is not None:
        bound, slope = soak.max_memory_growth_mib_per_min, soak.figures.rss_slope_mib_per_min
        measured = "no slope fitted" if slope is None else f"RSS slope {slope:.2f} MiB/min"
        alerts.append(
            Rule(
                kind="alert",
                name="ServerMemoryGrowing",
                expr=f"(deriv(process_resident_memory_bytes{bare}[{a.slope_window}]) * 60 / 1048576 "
                f"> {bound:g}) and {served}",
                summary="The API server's memory grows faster than the soak gate allowed: a leak that ends "
                "in an out-of-memory kill.",
                source=f"soak gate: {measured} over {soak.figures.fit_window_s / 60:.0f} min after warm-up "
                f"at concurrency {soak.concurrency}, bound {bound:g} MiB/min "
                "(gates.soak.max_memory_growth_mib_per_min)",
                threshold=f"resident memory growing > {bound:g} MiB/min over {a.slope_window}",
                for_window=a.for_window,
                severity=a.severity,
            )
        )
    elif a.enabled:
        notes.append("No memory-growth rule: this run had no soak (gates.soak), so no bound was measured.")
    a = section.restart
    if a.enabled:
        alerts.append(
            Rule(
                kind="alert",
                name="ServerRestarted",
                expr=f"(changes(process_start_time_seconds{bare}[{w}]) > 0) and {served}",
                summary="The vLLM server restarted (a crash, an out-of-memory kill, or a redeploy).",
                source=f"stress gate: {stress.server_restarts} restart(s), "
                f"{'a death' if stress.server_died else 'no death'} in {stress.duration_s:g} s of traffic",
                threshold=f"process_start_time_seconds changed within {w}",
                for_window=a.for_window,
                severity=a.severity,
            )
        )
    notes.append(NO_REVISION_RULE)
    model, revision, release = _identity(report, recipe)
    return AlertRules(
        model=model,
        revision=revision,
        release=release,
        alerts=alerts,
        records=_records(report, w, vllm, stress_kv, at),
        notes=notes,
    )


def _records(report: RunReport, w: str, vllm: str, stress_kv: str, at: str) -> list[Rule]:
    """Recording rules for the figures the report states (level:metric:operations, Prometheus's naming)."""
    stress = report.stress
    bench = stress.throughput
    ttft = (
        f"vllm bench serve: TTFT mean {bench.mean_ttft_ms:.0f} ms, p99 {bench.p99_ttft_ms:.0f} ms {at}"
        if bench and bench.mean_ttft_ms is not None and bench.p99_ttft_ms is not None
        else "vllm bench serve: no TTFT measured"
    )
    tokens = (
        f"vllm bench serve: {bench.output_throughput:.0f} output tokens/s {at}"
        if bench and bench.output_throughput is not None
        else "vllm bench serve: no throughput measured"
    )

    def over(agg: str, fn: str, metric: str) -> str:  # agg by (model_name) (fn(metric{...}[w]))
        return f"{agg} by (model_name) ({fn}({metric}{vllm}[{w}]))"

    waiting = f"stress gate: peak {stress.peak_waiting} waiting {at}"
    rules = [
        ("vllm_generation_tokens:rate", over("sum", "rate", "vllm:generation_tokens_total"),
         "generated tokens per second", tokens),
        ("vllm_kv_cache_usage_perc:avg", over("avg", "avg_over_time", "vllm:kv_cache_usage_perc"),
         "KV cache usage (0..1), averaged", stress_kv),
        ("vllm_kv_cache_usage_perc:max", over("max", "max_over_time", "vllm:kv_cache_usage_perc"),
         "KV cache usage (0..1), peak", stress_kv),
        ("vllm_num_requests_waiting:max", over("max", "max_over_time", "vllm:num_requests_waiting"),
         "requests waiting, peak", waiting),
    ]  # fmt: skip
    histogram = f"sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket{vllm}[{w}]))"
    rules += [
        (f"vllm_time_to_first_token_seconds:p{q}_", f"histogram_quantile(0.{q}, {histogram})",
         f"time to first token (s), {q}th percentile", ttft)
        for q in (50, 90, 99)
    ]  # fmt: skip
    return [
        Rule(kind="record", name=f"model_name:{name}{w}", expr=expr, summary=summary, source=source)
        for name, expr, summary, source in rules
    ]


def _identity(report: RunReport, recipe: Recipe) -> tuple[str, str, str]:
    """(model, revision, release): the candidate's repo and commit (the weights the release ref will point
    at, through the gated commit on top of it) and the release ref; a run without a Hub names the recipe."""
    candidate, hub = report.candidate, recipe.hub
    model = candidate.repo_id if candidate else hub.repo_id if hub else recipe.name
    return model, candidate.commit_sha if candidate else "unpublished", hub.release_ref if hub else "none"


def _kv_tokens(report: RunReport) -> int | None:
    """The KV tokens the release serves: the serving profile's pinned cache, else the production row's."""
    if report.serving_profile is not None:
        return report.serving_profile.kv_cache_tokens
    rows = [c for c in (report.capacity.configs if report.capacity else []) if c.name == Boot.PRODUCTION]
    return rows[0].kv_cache_tokens if rows else None


def _header(rules: AlertRules) -> str:
    return (
        f"# Prometheus rules for {rules.model} at revision {rules.revision} (release ref {rules.release}),\n"
        "# derived by quantize-serve from this release's gates; each alert's `source` names its figure.\n"
    )


def _dns_label(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-") or "release"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
