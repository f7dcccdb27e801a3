"""Manual sign-off (approval: manual): the run pauses with a form and promotes only on approval.

Two tiers. The fast ones call the sign-off and the release step directly (a toy flow, a fake
report). The full one runs the WHOLE quantize-serve flow on the tiny AWQ recipe, in-process in a
thread against the session's Prefect API, pushing to a local Hub; the run pauses at the form and a
reviewer answers it through ``resume_flow_run``: reject -> nothing promoted, the rejection (with
the reviewer's reason) on the Hub and in the report, the run Failed.

One flow run cannot prove both answers (a run is resumed once), so there are two. The approved one
is the deployment run of tests/flows/test_flow.py (production's inputs from the Hub, approved by a
reviewer, promoted). The rejected one is here: the whole flow on a shrunken copy of the recipe (one
perplexity task on 10 documents; the stress profile is kept) that releases the session's AWQ
checkpoint as an existing checkpoint.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from prefect import flow

from quantize_serve.gates.decision import Decision
from quantize_serve.recipe.load import apply_overrides
from quantize_serve.report.run_report import RunReport
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe
from tasks.report import request_approval
from tests.conftest import ROOT, SERVING_OVERRIDES
from tests.release_fixtures import bare_report, placeholder_checkpoint

TOKEN = "hf_ApprovalTestToken0123456789abcdefgh"
REVIEW = {"reviewer": "ana", "note": "p99 TTFT too high for the chat tier"}


def fake_report(passed: bool) -> RunReport:
    return bare_report(
        recipe_source="x.yaml",
        base=BaseModelRef(local_dir="/m", sha="1" * 64),
        checkpoint=placeholder_checkpoint("/c"),
        decision=Decision(passed=passed, checks=[]),
        serving_command="vllm serve /c",
    )


@pytest.fixture
def manual_recipe(awq_recipe):
    recipe = awq_recipe.model_copy(update={"approval": "manual"})
    return ValidatedRecipe(
        recipe=recipe, source="x.yaml", recipe_sha256="0" * 64, calibration_fingerprint="2" * 64
    )


@pytest.fixture(scope="module")
def local_hub_access() -> dict:
    """The module's local Hub (tests/conftest.py): TOKEN writes, and this process and the processes it
    starts (the quantization worker loads the calibration data) reach it as the Hub; runs go to a
    temporary folder."""
    return {"tokens": (TOKEN,), "online": True}


def hub_repo(hub, repo_id: str) -> dict:
    """The local Hub's record of a repo: branches, and tags with the message each was made with."""
    return json.loads((Path(hub.root) / "models" / repo_id / "repo.json").read_text())


def hub_file(hub, repo_id: str, revision: str, filename: str) -> str:
    from huggingface_hub import HfApi

    return Path(
        HfApi(endpoint=hub.endpoint, token=TOKEN).hf_hub_download(
            repo_id, filename, revision=revision, cache_dir=Path(hub.root).parent / "dl"
        )
    ).read_text()


# --------------------------------------------------------------------------------------------
# Fast: the sign-off pause alone, and the release step of a reviewer's answer
# --------------------------------------------------------------------------------------------


@flow(name="sign-off")
def sign_off(validated: ValidatedRecipe, report: RunReport) -> list:
    return [*request_approval(validated, report), report.approval_note]


def wait_for_pause(flow_run_name: str, alive, timeout_s: float):
    """The flow run named ``flow_run_name`` once it is Paused (None if ``alive()`` turns false first)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline and alive():
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name]))
            )
            if runs and runs[0].state and runs[0].state.is_paused():
                return runs[0]
            time.sleep(1)
    return None


def test_manual_sign_off_pauses_until_a_person_answers(manual_recipe):
    """One answer is enough here (approve defaults to False, so True proves the answer got through);
    the full-flow tests below answer both ways."""
    from prefect.flow_runs import resume_flow_run

    approve, name = True, f"sign-off-{time.monotonic_ns()}"
    result: dict = {}
    worker = threading.Thread(
        target=lambda: result.update(
            out=sign_off.with_options(flow_run_name=name)(manual_recipe, fake_report(True))
        )
    )
    worker.start()
    paused = wait_for_pause(name, worker.is_alive, timeout_s=60)
    assert paused, "the run never paused for sign-off"
    assert paused.state.state_details.run_input_keyset, "paused without the sign-off form"
    resume_flow_run(paused.id, run_input={"approve": approve, **REVIEW})
    worker.join(timeout=120)
    assert result["out"] == [approve, "ana", REVIEW["note"]]


def test_failed_gates_need_no_sign_off(manual_recipe):
    assert sign_off(manual_recipe, fake_report(False)) == [False, None, ""]


def test_a_reviewer_rejection_is_recorded_with_the_reason(local_hub, manual_recipe, tmp_path):
    """Gates passed, the reviewer said no: the rejected card and tag say who and why (no failed
    gate to quote: the card once refused to render, 'rejected needs rejection_reasons')."""
    from quantize_serve.release import publish as release

    repo_id = f"quantize-serve/signoff-unit-{time.monotonic_ns()}"
    recipe = manual_recipe.recipe.model_copy(
        update={"hub": manual_recipe.recipe.hub.model_copy(update={"repo_id": repo_id})}
    )
    validated = manual_recipe.model_copy(update={"recipe": recipe})
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"weights" * 100)
    report = fake_report(True).model_copy(
        update={
            "base": BaseModelRef(local_dir=str(ROOT / "models" / "tiny-llama"), sha="1" * 64),
            "checkpoint": fake_report(True).checkpoint.model_copy(update={"checkpoint_dir": str(ckpt)}),
            "report_dir": str(tmp_path / "run"),
            "approval_note": REVIEW["note"],
        }
    )
    report.candidate = release.push_release_candidate(
        validated, report.base, report.checkpoint, report.serving_command, tmp_path / "run"
    )

    outcome = release.promote_or_reject(validated, report, approved=False, approved_by="ana")

    reason = f"not approved by ana: {REVIEW['note']}"
    assert outcome.status == "rejected" and outcome.approved_by == "ana" and outcome.ref is None
    assert release.release_reasons(report, False, "ana") == [reason]
    tags = hub_repo(local_hub, repo_id)["tags"]
    assert "production" not in tags
    assert tags[outcome.rejection_tag]["commit"] == report.candidate.commit_sha
    assert reason in tags[outcome.rejection_tag]["message"]
    assert reason in hub_file(local_hub, repo_id, "main", "README.md")


# --------------------------------------------------------------------------------------------
# Full flow: the whole pipeline pauses at the form; approve promotes, reject records and fails
# --------------------------------------------------------------------------------------------


def signoff_recipe(folder: Path, repo_id: str, checkpoint: str) -> Path:
    """The tiny AWQ recipe with approval: manual, its own Hub repo, the accuracy gate shrunk to what
    proves it ran, and an existing checkpoint to release (the session's, validated and served as it
    is, not quantized again: the path a format choice's winner takes through the pipeline)."""
    data = yaml.safe_load((ROOT / "recipes" / "tiny-llama-awq.yaml").read_text())
    serve = {k: v for k, v in SERVING_OVERRIDES.items() if k.startswith("serve.")}
    data = apply_overrides(data, serve, source="signoff")  # what this host serves (tests/conftest.py)
    data["name"] = "tiny-llama-awq-signoff"
    data["approval"] = "manual"
    data["model"]["id"] = str(ROOT / "models" / "tiny-llama")
    data["calibration"]["dataset"] = str(ROOT / "data" / "calibration" / "tiny_calibration.jsonl")
    data["quantization"] = {"checkpoint": checkpoint}
    data["gates"]["accuracy"] = {
        "tasks": [{"task": str(ROOT / "evals" / "tasks" / "qs_heldout_ppl.yaml"), "limit": 10}],
        "error_rates": {"bad_recovery": 0.5, "good_recovery": 0.6},
    }  # the gates must pass: sign-off is the subject
    # gates.stress stays the recipe's: 8 short requests finished between two /metrics samples
    # (0.2 s) in one run, and the stress gate rightly failed it ("measured an idle server")
    data["hub"]["repo_id"] = repo_id
    path = folder / f"{repo_id.split('/')[1]}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_flow_to_sign_off(recipe: Path, answer: dict):
    """Run the whole flow in a thread; once it pauses at the form, answer it. (state, paused run)."""
    from prefect.flow_runs import resume_flow_run

    from flows.pipeline import quantize_serve

    name = f"{recipe.stem}-{time.monotonic_ns()}"
    result: dict = {}

    def run() -> None:
        try:
            result["state"] = quantize_serve.with_options(flow_run_name=name)(str(recipe), return_state=True)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            result["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    paused = wait_for_pause(name, worker.is_alive, timeout_s=900)
    assert paused, f"the flow never paused for sign-off: {result}"
    assert paused.state.state_details.run_input_keyset, "paused without the sign-off form"
    resume_flow_run(paused.id, run_input=answer)
    worker.join(timeout=300)
    assert not worker.is_alive(), "the flow did not finish after the answer"
    assert "error" not in result, result["error"]
    return result["state"], paused


def run_artifacts(flow_run_id) -> dict[str, str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {a.key: a.data for a in client.read_artifacts() if a.flow_run_id == flow_run_id}


def written_report(flow_run_id) -> dict:
    """report.json of the run (its folder ends with the run id's first 8 characters)."""
    from quantize_serve.core.settings import get_settings

    (path,) = get_settings().runs_dir.glob(f"tiny-llama-awq-signoff-*-{str(flow_run_id)[:8]}/report.json")
    return json.loads(path.read_text())


def final_state(flow_run_id):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state


@pytest.mark.timeout(1200)
def test_full_flow_rejected_by_the_reviewer_promotes_nothing(local_hub, awq_checkpoint, tmp_path):
    """The whole flow on an existing checkpoint; the gates pass, the reviewer says no. (The reviewer
    approving: tests/flows/test_flow.py::test_deployment_run_promotes.)"""
    repo_id = "quantize-serve/tiny-llama-awq-signoff-reject"
    recipe = signoff_recipe(tmp_path, repo_id, awq_checkpoint.checkpoint_dir)
    state, paused = run_flow_to_sign_off(recipe, {"approve": False, **REVIEW})

    assert (
        state.is_failed() and state.message == f"release rejected: not approved by ana: {REVIEW['note']}"
    ), f"{state.type}: {state.message}"
    assert final_state(paused.id).is_failed()
    report = written_report(paused.id)
    assert report["decision"]["passed"], "the gates passed: only the reviewer said no"
    rel = report["release"]
    assert rel["status"] == "rejected" and rel["approved_by"] == "ana" and rel["ref"] is None
    assert report["approval_note"] == REVIEW["note"]
    reason = f"not approved by ana: {REVIEW['note']}"
    repo = hub_repo(local_hub, repo_id)
    assert "production" not in repo["tags"]
    assert (
        repo["tags"][rel["rejection_tag"]]["commit"]
        == rel["candidate_sha"]
        == report["candidate"]["commit_sha"]
    )
    assert reason in repo["tags"][rel["rejection_tag"]]["message"]
    assert reason in hub_file(local_hub, repo_id, "main", "README.md")  # the rejected card says why
    assert "tiny-llama-awq-signoff-pending-approval" in run_artifacts(paused.id)
    # the existing checkpoint was released as it is: validated, served and carded, not quantized again
    assert report["checkpoint"]["method"].startswith("existing ") and report["checkpoint"]["seconds"] == 0.0
    assert report["checkpoint"]["source_checkpoint"].startswith("local:")  # a digest, not a path
    assert "(not quantized again)" in hub_file(local_hub, repo_id, "main", "README.md")
