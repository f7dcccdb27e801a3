"""The recipe's ``alerts`` section: the Prometheus rules a release ships to watch it in production
(quantize_serve/release/alerts.py derives them from the gates' figures; docs/concepts/alerts.md).

Each rule has a window (Prometheus's ``for:``: how long the condition must hold before the alert fires)
and a severity; the thresholds here are the parts production chooses, the rest comes from the figures
this release's gates measured."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from quantize_serve.recipe.section import Section

# A Prometheus duration: one or more <number><unit>, largest unit first (Prometheus's own grammar).
DURATION = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")

Severity = Literal["critical", "warning", "info"]


def _duration(value: str) -> str:
    if not value or not DURATION.match(value):
        raise ValueError(
            f"{value!r} is not a Prometheus duration. Fix: a number and a unit, largest first, e.g. 30s, "
            "5m, 1h30m (units ms, s, m, h, d, w, y)"
        )
    return value


class AlertRule(Section):
    """What every alerting rule has: on or off, how long its condition must hold, how loud it is."""

    enabled: bool = Field(default=True, description="false: the release ships no such rule.")
    for_window: str = Field(
        default="5m",
        description="Prometheus's `for:`: how long the condition must hold before the alert fires "
        "(pending until then).",
    )
    severity: Severity = Field(default="warning", description="The `severity` label the rule carries.")

    _for = field_validator("for_window")(_duration)


class KvCacheAlert(AlertRule):
    """The KV cache near full for a sustained window: the batch is too large for the KV cache the gates
    validated (its usage "hovers at 1.0"); requests queue, then get preempted."""

    near_full: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="Usage (vllm:kv_cache_usage_perc, a fraction 0..1), averaged over alerts.rate_window, "
        "at or above which the cache counts as full.",
    )
    for_window: str = Field(default="10m", description="How long it must stay near full (`for:`).")


class PreemptionAlert(AlertRule):
    """Preemptions increasing: the gates promised none (or the few measured) at the validated concurrency."""

    severity: Severity = Field(default="critical", description="The `severity` label the rule carries.")
    for_window: str = Field(default="5m", description="How long preemptions must keep rising (`for:`).")


class QueueAlert(AlertRule):
    """Requests waiting beyond what the validated concurrency drains."""

    batches: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description="The waiting requests (vllm:num_requests_waiting) that fire it, in batches of the "
        "validated concurrency (gates.stress.concurrency, else serve.max_num_seqs): 1.0 fires when more "
        "requests wait than one full batch holds (or than the stress gate's own peak, if higher).",
    )
    for_window: str = Field(default="5m", description="How long the queue must stay that long (`for:`).")


class OverlongAlert(AlertRule):
    """Prompts over serve.max_model_len rejected (HTTP 400, counted by vLLM's API server as status 4xx)."""

    max_share: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="Share of the completion endpoints' requests answered 4xx (http_requests_total), over "
        "alerts.rate_window, above which it fires: clients send prompts longer than the release serves.",
    )
    for_window: str = Field(default="15m", description="How long the share must stay above (`for:`).")


class MemoryGrowthAlert(AlertRule):
    """The server's memory growing faster than the soak gate's bound (only for a release whose run had a
    soak): the slow leak that ends in an out-of-memory kill hours later."""

    severity: Severity = Field(default="critical", description="The `severity` label the rule carries.")
    slope_window: str = Field(
        default="30m",
        description="The range the growth (deriv of process_resident_memory_bytes) is fitted over.",
    )
    for_window: str = Field(default="30m", description="How long the growth must stay too fast (`for:`).")

    _slope = field_validator("slope_window")(_duration)


class RestartAlert(AlertRule):
    """A server that restarted (process_start_time_seconds changed): a crash, an out-of-memory kill, or a
    redeploy; its revision cannot be read from vLLM's metrics (docs/concepts/alerts.md says why)."""

    for_window: str = Field(default="0m", description="`for:`; 0m fires at the first evaluation.")


class AlertsSection(Section):
    """alerts: the Prometheus rules each promoted release carries (prometheus-rules.yaml and a Kubernetes
    PrometheusRule), with thresholds from this release's gates. A rejected candidate carries none."""

    enabled: bool = Field(default=True, description="false: the release carries no rules.")
    rate_window: str = Field(
        default="5m",
        description="The range of every rate(), increase() and avg_over_time() in the rules and the "
        "recording rules (at least 4 scrape intervals).",
    )
    selector: str = Field(
        default="",
        description='Extra PromQL label matchers added to every selector (e.g. namespace="llm"), where '
        "several deployments share one Prometheus. Empty: none.",
    )
    kv_cache: KvCacheAlert = Field(default_factory=KvCacheAlert)
    preemptions: PreemptionAlert = Field(default_factory=PreemptionAlert)
    queue: QueueAlert = Field(default_factory=QueueAlert)
    overlong_prompts: OverlongAlert = Field(default_factory=OverlongAlert)
    memory_growth: MemoryGrowthAlert = Field(default_factory=MemoryGrowthAlert)
    restart: RestartAlert = Field(default_factory=RestartAlert)

    _window = field_validator("rate_window")(_duration)

    @field_validator("selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        matcher = r'\s*[a-zA-Z_]\w*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*'
        if value and not re.fullmatch(rf"{matcher}(,{matcher})*", value):
            raise ValueError(
                f"{value!r} is not a list of PromQL label matchers. Fix: e.g. "
                'namespace="llm" or namespace="llm",cluster=~"eu-.*" (no braces)'
            )
        return value
