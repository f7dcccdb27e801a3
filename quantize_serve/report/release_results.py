"""The record a release leaves on the Hub: ``release-results.json`` in the commit the gates judged.

The release step commits it with the card (the gated commit of a promotion; the card commit of a
rejection), so the Hub alone answers what a release was and measured: ``quantize-serve releases``
reads it for the history, and the next candidate's regression gate (gates/regression.py) compares
with its figures when they were measured under the same conditions.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field

from quantize_serve.gates.regression import RegressionResult, ReleaseResults
from quantize_serve.report.run_report import RunReport

RELEASE_RESULTS_FILE = "release-results.json"
RELEASE_RESULTS_SCHEMA = 1


class RecoveryFigure(BaseModel):
    task: str
    metric: str
    recovery: float | None
    passed: bool


class ReleaseRecord(BaseModel):
    """What one gated run decided and measured, machine-readable (``release-results.json``)."""

    schema_version: int = RELEASE_RESULTS_SCHEMA
    repo_id: str
    candidate_sha: str = Field(description="the candidate commit the gates ran against")
    run_id: str
    recipe: str
    status: Literal["promoted", "rejected"]
    reasons: list[str] = Field(default_factory=list)
    approval: Literal["auto", "manual"] = "auto"
    approved_by: str | None = Field(
        default=None, description="the reviewer who signed off (approval: manual)"
    )
    recorded_at: str = Field(description="UTC, ISO 8601: when the gates decided")
    base_model: str
    base_sha: str
    recoveries: list[RecoveryFigure] = Field(default_factory=list)
    results: ReleaseResults | None = None
    regression: RegressionResult | None = None

    @property
    def min_recovery(self) -> float | None:
        values = [r.recovery for r in self.recoveries if r.recovery is not None]
        return min(values) if values else None


def release_record(
    report: RunReport,
    *,
    status: Literal["promoted", "rejected"],
    reasons: list[str],
    approval: Literal["auto", "manual"],
    approved_by: str | None,
) -> ReleaseRecord:
    candidate = report.candidate
    return ReleaseRecord(
        repo_id=candidate.repo_id,
        candidate_sha=candidate.commit_sha,
        run_id=report.run_id,
        recipe=report.recipe,
        status=status,
        reasons=reasons,
        approval=approval,
        approved_by=approved_by,
        recorded_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        base_model=report.base.repo_id or report.base.identity,
        base_sha=report.base.sha,
        recoveries=[
            RecoveryFigure(task=c.task, metric=c.metric, recovery=c.recovery, passed=c.passed)
            for c in report.accuracy
        ],
        results=report.results,
        regression=report.regression,
    )


def release_record_bytes(record: ReleaseRecord) -> bytes:
    return (record.model_dump_json(indent=1) + "\n").encode()


def parse_release_record(data: bytes) -> ReleaseRecord | None:
    """The record, or None when the file is not one this version reads (a newer schema, damage)."""
    try:
        record = ReleaseRecord.model_validate_json(data)
    except ValueError:
        return None
    return record if record.schema_version == RELEASE_RESULTS_SCHEMA else None
