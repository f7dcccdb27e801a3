"""Manual sign-off (approval: manual): the run pauses with a form and promotes only on approval."""

from __future__ import annotations

import threading
import time

import pytest
from prefect import flow

from quantize_serve.decision import Decision
from quantize_serve.quantize import QuantizeResult
from quantize_serve.report import RunReport
from quantize_serve.validate import BaseModelRef, ValidatedRecipe
from tasks.report import request_approval

pytestmark = pytest.mark.flow


def fake_report(passed: bool) -> RunReport:
    return RunReport(
        run_id="r", recipe="tiny-llama-awq", recipe_source="x.yaml", recipe_sha256="0" * 64,
        base=BaseModelRef(local_dir="/m", sha="1" * 64),
        checkpoint=QuantizeResult(checkpoint_dir="/c", method="awq", scheme="W4A16_ASYM", seconds=1.0,
                                  base_bytes=2, quantized_bytes=1, calibration_fingerprint="2" * 64,
                                  engine_versions={}),
        decision=Decision(passed=passed, checks=[]), serving_command="vllm serve /c")


@pytest.fixture
def manual_recipe(awq_recipe):
    recipe = awq_recipe.model_copy(update={"approval": "manual"})
    return ValidatedRecipe(recipe=recipe, source="x.yaml", recipe_sha256="0" * 64,
                           calibration_fingerprint="2" * 64)


@flow(name="sign-off")
def sign_off(validated: ValidatedRecipe, report: RunReport) -> list:
    return list(request_approval(validated, report))


@pytest.mark.parametrize("approve", [True, False])
def test_manual_sign_off_pauses_until_a_person_answers(manual_recipe, approve):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.flow_runs import resume_flow_run

    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(out=sign_off(manual_recipe, fake_report(True))))
    worker.start()
    paused = []
    with get_client(sync_client=True) as client:
        for _ in range(120):
            paused = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))))
            if paused:
                break
            time.sleep(0.5)
    assert paused, "the run never paused for sign-off"
    resume_flow_run(paused[0].id, run_input={"approve": approve, "reviewer": "ana", "note": "checked"})
    worker.join(timeout=120)
    assert result["out"] == [approve, "ana"]


def test_failed_gates_need_no_sign_off(manual_recipe):
    assert sign_off(manual_recipe, fake_report(False)) == [False, None]
