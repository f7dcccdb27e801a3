"""The base model's token through Prefect (a Secret block; the resolve task, which reads the token
itself, never a parameter), against the local hub with the REAL ``huggingface_hub`` client."""

from __future__ import annotations

import inspect
import logging
import uuid
from pathlib import Path

import pytest

from localhub.server import LocalHub
from quantize_serve.core.errors import HubAuthError, HubNotFoundError
from quantize_serve.validate.preflight import ValidatedRecipe, resolve_base
from tests.engines.test_base_model import NEEDED, READ, WRONG, files_in, validated_for
from tests.engines.test_base_model import _client_env, base_repo, local_hub  # noqa: F401 (fixtures)


def test_base_model_token_from_a_prefect_secret_block(local_hub: LocalHub, base_repo: str, awq_recipe):
    from prefect.blocks.system import Secret

    block = f"qs-base-token-{uuid.uuid4().hex[:8]}"
    Secret(value=READ).save(block, overwrite=True)
    validated = validated_for(awq_recipe, base_repo, token_env="QS_TEST_UNSET_TOKEN",
                              token_secret_block=block)
    base = resolve_base(validated)
    assert files_in(Path(base.local_dir)) == NEEDED


def test_the_task_reads_the_token_itself_and_tries_a_4xx_once(local_hub: LocalHub, base_repo: str,
                                                              awq_recipe, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture):
    """Prefect records a task's inputs: the token is no parameter of resolve-base-model, which
    reads it itself; a 401 or 404 costs exactly one request (no task or client retry)."""
    from prefect import flow

    from tasks.validate import resolve_base_model as resolve_task

    assert list(inspect.signature(resolve_task.fn).parameters) == ["validated"]
    caplog.set_level(logging.DEBUG)

    @flow(name="resolve-base-model-token")
    def resolve(validated: ValidatedRecipe):
        return resolve_task(validated)

    monkeypatch.setenv("QS_TEST_BASE_TOKEN", WRONG)
    for repo_id, error in ((base_repo, HubAuthError), ("org/does-not-exist", HubNotFoundError)):
        if error is HubNotFoundError:
            monkeypatch.setenv("QS_TEST_BASE_TOKEN", READ)
        mark = len(local_hub.requests)
        state = resolve(validated_for(awq_recipe, repo_id, token_env="QS_TEST_BASE_TOKEN"), return_state=True)
        assert state.is_failed()
        with pytest.raises(error):
            state.result()
        assert len([r for r in local_hub.requests[mark:] if repo_id in r.path]) == 1
    base = resolve(validated_for(awq_recipe, base_repo, token_env="QS_TEST_BASE_TOKEN"))
    assert base.repo_id == base_repo and files_in(Path(base.local_dir)) == NEEDED
    assert WRONG not in caplog.text and READ not in caplog.text
