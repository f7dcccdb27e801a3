"""The Hub stage against a local endpoint, with the REAL ``huggingface_hub`` client.

Why a local hub and not mocks: the properties that matter (one complete commit per push, refs
that move only to complete commits, no duplicate commit after a lost answer, no token in any
error) live in the interplay between our code and the client's HTTP calls. ``localhub`` speaks
the calls the client really sends (plain LFS: Xet is switched off for these tests), so the client
code under test is the one production runs. Faults are injected by the server.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from huggingface_hub import HfApi, ModelCard, snapshot_download

from localhub.server import LocalHub
from quantize_serve.core.errors import HubAuthError, HubError, HubNotFoundError
from quantize_serve.hub.client import RetryPolicy, resolve_token
from quantize_serve.hub.download import resolve_base_model
from quantize_serve.hub.publish import (
    promote_revision,
    push_candidate,
    record_rejection,
    rejection_tag,
    update_model_card,
)
from quantize_serve.recipe.model import HubSection
from quantize_serve.release.card import AccuracyRow, ModelCardInputs, Provenance, render_model_card
from tests.conftest import HUB_READ as READ
from tests.conftest import HUB_WRITE as WRITE
from tests.conftest import ROOT, use_local_hub_client
from tests.release_fixtures import stress_result

WRONG = "hf_WrongTokenThatTheHubRejects0123456789"
FAST = RetryPolicy(attempts=4, base_s=0.01, max_s=0.05)


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _client_env(local_hub: LocalHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """This test's client against the module's local Hub (each test uses its own repo); faults cleared."""
    use_local_hub_client(monkeypatch, local_hub.endpoint, tmp_path / "hf-cache")
    local_hub.clear_faults()
    yield
    local_hub.clear_faults()


@pytest.fixture
def section() -> HubSection:
    return HubSection(repo_id=f"org/m-{uuid.uuid4().hex[:8]}", private=True, release_ref="production")


def opts(hub: LocalHub, **extra: object) -> dict:
    """The keyword arguments every Hub call here takes: token, endpoint, fast retries."""
    return {"token": WRITE, "endpoint": hub.endpoint, "retry": FAST, **extra}


def card_inputs(repo_id: str, **overrides: object) -> ModelCardInputs:
    values: dict = {
        "repo_id": repo_id,
        "base_model": "org/tiny-base",
        "base_revision_sha": "a" * 40,
        "method": "awq",
        "scheme": "W4A16",
        "group_size": 32,
        "calibration": {"dataset": "calib.jsonl", "num_samples": 64},
        "calibration_fingerprint": "f" * 16,
        "capacity_markdown": "| config | tokens |\n|---|---|\n| w4a16 | 4096 |",
        "accuracy": [
            AccuracyRow(
                task="arc_easy",
                dataset="allenai/ai2_arc",
                dataset_config="ARC-Easy",
                dataset_split="test",
                metric="acc",
                base=0.50,
                quantized=0.49,
                recovery=0.98,
                threshold=0.95,
                passed=True,
            )
        ],
        "stress": {"completed": 64, "failed": 0, "preemptions": 0},
        "serving_command": "python -m vllm.entrypoints.openai.api_server --model org/m --kv-cache-dtype fp8",
        "provenance": Provenance(
            recipe_sha256="b" * 64,
            engine_versions={"torch": "2.9.0"},
            hardware="cpu",
            run_id="run-1",
            run_url="https://prefect.example.com/runs/flow-run/run-1",
            vllm_version="0.32.0",
        ),
    }
    values.update(overrides)
    return ModelCardInputs(**values)


def make_candidate(folder: Path, repo_id: str, *, seed: int = 0, **card: object) -> Path:
    """A small checkpoint-shaped folder: config, tokenizer, ~2 MB weights (LFS), the card."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    (folder / "tokenizer.json").write_text(json.dumps({"vocab": {"a": 0, "b": 1}}))
    weights = b"".join(hashlib.sha256(f"{seed}-{i}".encode()).digest() for i in range(65536))
    (folder / "model.safetensors").write_bytes(weights)  # 2 MiB of binary: goes through LFS
    render_model_card(card_inputs(repo_id, **card)).save(folder / "README.md")
    return folder


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def api(hub: LocalHub) -> HfApi:
    """A plain client, to look at the repo the way any consumer would."""
    return HfApi(endpoint=hub.endpoint, token=WRITE)


def commits_of(repo_id: str, endpoint: str, revision: str = "main") -> list[str]:
    client = HfApi(endpoint=endpoint, token=WRITE)
    return [c.commit_id for c in client.list_repo_commits(repo_id, revision=revision)]


def release_target(hub: HubSection, endpoint: str) -> str | None:
    refs = HfApi(endpoint=endpoint, token=WRITE).list_repo_refs(hub.repo_id)
    group = refs.tags if hub.release_ref_kind == "tag" else refs.branches
    return next((r.target_commit for r in group if r.name == hub.release_ref), None)


def requests_since(hub: LocalHub, mark: int, needle: str = "") -> list:
    return [r for r in hub.requests[mark:] if needle in r.path]


# --------------------------------------------------------------------------------------------
# Push, download, card
# --------------------------------------------------------------------------------------------


def test_push_then_download_is_byte_identical(local_hub: LocalHub, section: HubSection, tmp_path: Path):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    mark = len(local_hub.requests)
    result = push_candidate(section, folder, commit_message="candidate 1", **opts(local_hub))
    assert result.created_commit and len(result.commit_sha) == 40
    assert len(requests_since(local_hub, mark, "/commit/main")) == 1  # ONE commit for the folder
    assert requests_since(local_hub, mark, "/_lfs/"), "the 2 MB weights should go through LFS"
    info = api(local_hub).model_info(section.repo_id, files_metadata=True)
    assert info.sha == result.commit_sha and info.private is True
    assert {s.rfilename: bool(s.lfs) for s in info.siblings}["model.safetensors"] is True

    local = snapshot_download(
        section.repo_id,
        revision=result.commit_sha,
        token=WRITE,
        cache_dir=tmp_path / "dl",
        endpoint=local_hub.endpoint,
    )
    downloaded = files_of(Path(local))
    assert downloaded.pop(".gitattributes")  # the Hub's own file, written at repo creation
    assert downloaded == files_of(folder)


def test_card_loads_back_with_eval_results(local_hub: LocalHub, section: HubSection, tmp_path: Path):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    push_candidate(section, folder, commit_message="c", **opts(local_hub))
    card = ModelCard.load(section.repo_id, token=WRITE)  # through the endpoint, like a user would
    assert (card.data.base_model, card.data.base_model_relation) == ("org/tiny-base", "quantized")
    assert card.data.library_name == "vllm"
    [result] = card.data.eval_results
    assert (result.task_name, result.dataset_type, result.dataset_config, result.dataset_split) == (
        "arc_easy",
        "allenai/ai2_arc",
        "ARC-Easy",
        "test",
    )
    assert (result.metric_type, result.metric_value) == ("acc", 0.49)
    assert "candidate: gates pending" in card.text
    assert "| arc_easy | allenai/ai2_arc, config ARC-Easy, split test | acc | 0.5 | 0.49 |" in card.text
    assert "--kv-cache-dtype fp8" in card.text and "w4a16 | 4096" in card.text
    assert "measured on vLLM 0.32.0" in card.text and "| vLLM version (serving) | 0.32.0 |" in card.text
    assert "[Prefect flow run](https://prefect.example.com/runs/flow-run/run-1)" in card.text
    assert "`.eval_results/`" in card.text  # why the scores are not in that format too
    assert WRITE not in card.content and "hf_" not in card.content


def test_card_masks_secrets_and_rejected_needs_reasons():
    cmd = f"HF_TOKEN={WRITE} vllm serve org/m --api-key sk-secret-123"
    card = render_model_card(card_inputs("org/m", serving_command=cmd))
    assert WRITE not in card.content and "sk-secret-123" not in card.content
    with pytest.raises(ValueError, match="rejection_reasons"):
        card_inputs("org/m", status="rejected")
    local = render_model_card(card_inputs("org/m", base_model="../models/tiny", base_revision_sha=None))
    assert local.data.base_model is None and "`../models/tiny`" in local.text
    assert local.data.get("base_model_relation") is None and "names no `base_model`" in local.text


def test_identical_rerun_makes_no_commit(local_hub: LocalHub, section: HubSection, tmp_path: Path):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    first = push_candidate(section, folder, commit_message="c", **opts(local_hub))
    mark = len(local_hub.requests)
    again = push_candidate(section, folder, commit_message="c", **opts(local_hub))
    assert (again.commit_sha, again.created_commit) == (first.commit_sha, False)
    assert not requests_since(local_hub, mark, "/commit/") and not requests_since(local_hub, mark, "/_lfs/")
    assert len(commits_of(section.repo_id, local_hub.endpoint)) == 2  # repo creation + the candidate


def test_changed_folder_is_one_commit_with_deletions(
    local_hub: LocalHub, section: HubSection, tmp_path: Path
):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    (folder / "stale-shard.safetensors").write_bytes(b"\0" * 1000)
    first = push_candidate(section, folder, commit_message="c1", **opts(local_hub))
    (folder / "stale-shard.safetensors").unlink()
    make_candidate(folder, section.repo_id, seed=1)
    second = push_candidate(section, folder, commit_message="c2", **opts(local_hub))
    assert second.created_commit and second.commit_sha != first.commit_sha
    assert commits_of(section.repo_id, local_hub.endpoint)[:2] == [second.commit_sha, first.commit_sha]
    local = Path(
        snapshot_download(
            section.repo_id,
            revision=second.commit_sha,
            token=WRITE,
            cache_dir=tmp_path / "dl",
            endpoint=local_hub.endpoint,
        )
    )
    downloaded = files_of(local)
    downloaded.pop(".gitattributes")
    assert downloaded == files_of(folder)  # the stale shard is gone


def test_update_model_card_uses_parent_commit(local_hub: LocalHub, section: HubSection, tmp_path: Path):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    pushed = push_candidate(section, folder, commit_message="c", **opts(local_hub))
    text = str(render_model_card(card_inputs(section.repo_id, status="promoted")))
    new = update_model_card(section, text, parent_commit=pushed.commit_sha, **opts(local_hub))
    assert commits_of(section.repo_id, local_hub.endpoint)[:2] == [new, pushed.commit_sha]
    # Unchanged text: no commit, the parent comes back.
    assert update_model_card(section, text, parent_commit=new, **opts(local_hub)) == new
    other = str(render_model_card(card_inputs(section.repo_id, status="rejected", rejection_reasons=["x"])))
    with pytest.raises(HubError, match="changed while this run worked"):  # stale parent -> 412
        update_model_card(section, other, parent_commit=pushed.commit_sha, **opts(local_hub))


# --------------------------------------------------------------------------------------------
# Promotion and rejection
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tag", "branch"])
def test_promote_points_release_ref_at_pushed_commit(local_hub: LocalHub, tmp_path: Path, kind: str):
    hub = HubSection(repo_id=f"org/p-{uuid.uuid4().hex[:8]}", release_ref="production", release_ref_kind=kind)
    folder = make_candidate(tmp_path / "ckpt", hub.repo_id)
    first = push_candidate(hub, folder, commit_message="c1", **opts(local_hub))
    assert release_target(hub, local_hub.endpoint) is None  # pushing never creates the release ref
    assert promote_revision(hub, first.commit_sha, run_id="r1", **opts(local_hub)) == first.commit_sha
    assert release_target(hub, local_hub.endpoint) == first.commit_sha

    make_candidate(folder, hub.repo_id, seed=2)
    second = push_candidate(hub, folder, commit_message="c2", **opts(local_hub))
    assert release_target(hub, local_hub.endpoint) == first.commit_sha  # still the old release
    promote_revision(hub, second.commit_sha, **opts(local_hub))
    assert release_target(hub, local_hub.endpoint) == second.commit_sha  # moved to exactly that commit

    mark = len(local_hub.requests)
    promote_revision(hub, second.commit_sha, **opts(local_hub))
    assert all(r.method == "GET" for r in local_hub.requests[mark:])  # already there: reads only
    # Consumers pinning the release ref get the promoted bytes.
    local = Path(
        snapshot_download(
            hub.repo_id,
            revision=hub.release_ref,
            token=WRITE,
            cache_dir=tmp_path / "dl",
            endpoint=local_hub.endpoint,
        )
    )
    assert (local / "config.json").read_text() == (folder / "config.json").read_text()

    with pytest.raises(HubNotFoundError, match="does not exist"):  # unknown sha: ref untouched
        promote_revision(hub, "0" * 40, **opts(local_hub))
    assert release_target(hub, local_hub.endpoint) == second.commit_sha


def test_rejection_leaves_release_ref_and_records_reasons(
    local_hub: LocalHub, section: HubSection, tmp_path: Path
):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    good = push_candidate(section, folder, commit_message="c1", **opts(local_hub))
    promote_revision(section, good.commit_sha, **opts(local_hub))
    make_candidate(folder, section.repo_id, seed=3)
    bad = push_candidate(section, folder, commit_message="c2", **opts(local_hub))

    reasons = ["arc_easy acc recovery 0.91 < 0.95", "stress: 3 of 64 requests failed"]
    card = str(render_model_card(card_inputs(section.repo_id, status="rejected", rejection_reasons=reasons)))
    tag = record_rejection(
        section, bad.commit_sha, reasons, run_id="run-42", card_text=card, **opts(local_hub)
    )

    assert release_target(section, local_hub.endpoint) == good.commit_sha  # untouched
    refs = api(local_hub).list_repo_refs(section.repo_id)
    assert {t.name: t.target_commit for t in refs.tags}[tag] == bad.commit_sha
    assert tag == rejection_tag(bad.commit_sha)
    message = local_hub.store.load_repo(section.repo_id)["tags"][tag]["message"]
    assert "run-42" in message and all(r in message for r in reasons)
    main_card = ModelCard.load(section.repo_id, token=WRITE)  # the repo page says why
    assert "Status: rejected" in main_card.text and all(r in main_card.text for r in reasons)
    # Idempotent: recording again keeps one tag, no error.
    assert record_rejection(section, bad.commit_sha, reasons, run_id="run-42", **opts(local_hub)) == tag


# Base model downloads (repo id and revision, the recipe's token, disk space):
# tests/engines/test_base_model.py


# --------------------------------------------------------------------------------------------
# Auth and token hygiene
# --------------------------------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def test_wrong_token_is_clear_and_never_leaks(
    local_hub: LocalHub,
    section: HubSection,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture,
):
    from huggingface_hub.utils import logging as hf_logging

    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    caplog.set_level(logging.DEBUG)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_debug()
    try:
        with pytest.raises(HubAuthError) as push_err:
            push_candidate(section, folder, commit_message="c", **opts(local_hub, token=WRONG))
        with pytest.raises(HubAuthError) as pull_err:
            resolve_base_model(
                "org/anything", revision="main", cache_dir=tmp_path / "c", **opts(local_hub, token=WRONG)
            )
    finally:
        hf_logging.set_verbosity(verbosity)
    text = str(push_err.value)
    assert "rejected the token (missing or wrong)" in text and "HF_TOKEN" in text
    for err in (push_err.value, pull_err.value):
        assert _chain(err) == [err]  # nothing chained: the client's request carried the token
        for e in _chain(err):
            assert WRONG not in str(e) and WRONG not in repr(e) and WRONG not in repr(e.args)
    out, errout = capfd.readouterr()
    assert WRONG not in out + errout + caplog.text
    assert caplog.records  # the check above looked at real log output


def test_read_only_token_gets_403(local_hub: LocalHub, section: HubSection, tmp_path: Path):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    with pytest.raises(HubAuthError, match="no write access to 'org'") as err:
        push_candidate(section, folder, commit_message="c", **opts(local_hub, token=READ))
    assert READ not in str(err.value)


def test_missing_repo_is_404(local_hub: LocalHub, tmp_path: Path):
    hub = HubSection(repo_id="org/does-not-exist")
    with pytest.raises(HubNotFoundError, match="org/does-not-exist"):
        promote_revision(hub, "1" * 40, **opts(local_hub))


def test_resolve_token_from_env_then_secret_block(monkeypatch: pytest.MonkeyPatch):
    import types

    hub = HubSection(repo_id="org/m", token_env="QS_TEST_HUB_TOKEN", token_secret_block="hub-token")
    monkeypatch.setenv("QS_TEST_HUB_TOKEN", WRITE)
    assert resolve_token(hub) == WRITE
    monkeypatch.delenv("QS_TEST_HUB_TOKEN")

    class FakeSecret:  # stands in for prefect.blocks.system.Secret (no Prefect server needed)
        blocks = {"hub-token": READ}

        def __init__(self, value: str) -> None:
            self.value = value

        @classmethod
        def load(cls, name: str) -> FakeSecret:
            if name not in cls.blocks:
                raise ValueError(f"Unable to find block document named {name}")
            return cls(cls.blocks[name])

        def get(self) -> str:
            return self.value

    fake = types.ModuleType("prefect.blocks.system")
    fake.Secret = FakeSecret  # type: ignore[attr-defined]
    for name in ("prefect", "prefect.blocks"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "prefect.blocks.system", fake)
    assert resolve_token(hub) == READ
    with pytest.raises(HubAuthError, match="Prefect Secret block 'other'.*QS_TEST_HUB_TOKEN"):
        resolve_token(hub.model_copy(update={"token_secret_block": "other"}))
    assert resolve_token(HubSection(repo_id="org/m", token_env="QS_TEST_HUB_TOKEN")) is None


# --------------------------------------------------------------------------------------------
# Transient failures
# --------------------------------------------------------------------------------------------


def test_three_500s_then_success_pushes_exactly_once(
    local_hub: LocalHub, section: HubSection, tmp_path: Path
):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    mark = len(local_hub.requests)
    local_hub.inject(fail_next=3, status=500)
    result = push_candidate(section, folder, commit_message="c", **opts(local_hub))
    assert result.created_commit
    assert [r.status for r in local_hub.requests[mark : mark + 3]] == [500, 500, 500]
    assert len([r for r in requests_since(local_hub, mark, "/commit/") if r.status == 200]) == 1
    history = commits_of(section.repo_id, local_hub.endpoint)
    assert len(history) == 2 and history[0] == result.commit_sha  # repo creation + one push


def test_retries_are_bounded_and_never_on_4xx(local_hub: LocalHub, section: HubSection, tmp_path: Path):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    local_hub.inject(fail_next=10, status=503)
    mark = len(local_hub.requests)
    with pytest.raises(HubError, match="after 4 attempt"):
        push_candidate(section, folder, commit_message="c", **opts(local_hub))
    assert len(local_hub.requests) - mark == 4
    local_hub.clear_faults()
    local_hub.inject(fail_next=1, status=400)
    mark = len(local_hub.requests)
    with pytest.raises(HubError, match="HTTP 400"):
        push_candidate(section, folder, commit_message="c", **opts(local_hub))
    assert len(local_hub.requests) - mark == 1


def test_rate_limit_429_waits_retry_after_then_pushes_once(
    local_hub: LocalHub, section: HubSection, tmp_path: Path
):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    local_hub.inject(fail_next=2, status=429)
    mark, started = len(local_hub.requests), time.monotonic()
    result = push_candidate(
        section,
        folder,
        commit_message="c",
        **opts(local_hub, retry=RetryPolicy(attempts=4, base_s=0.01, max_s=5)),
    )
    assert [r.status for r in local_hub.requests[mark : mark + 2]] == [429, 429]
    assert time.monotonic() - started >= 2.0  # Retry-After: 1, twice, over a 0.01 s backoff
    assert result.created_commit and len(commits_of(section.repo_id, local_hub.endpoint)) == 2


def test_rate_limit_that_never_lifts_says_so(local_hub: LocalHub, section: HubSection, tmp_path: Path):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    local_hub.inject(fail_next=10, status=429)
    with pytest.raises(HubError, match="rate-limited") as err:
        push_candidate(
            section,
            folder,
            commit_message="c",
            **opts(local_hub, retry=RetryPolicy(attempts=2, base_s=0.01, max_s=0.05)),
        )
    assert WRITE not in str(err.value)


def test_dropped_commit_then_rerun_ends_in_one_revision(
    local_hub: LocalHub, section: HubSection, tmp_path: Path
):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    released = push_candidate(section, folder, commit_message="c1", **opts(local_hub))
    promote_revision(section, released.commit_sha, **opts(local_hub))
    history = commits_of(section.repo_id, local_hub.endpoint)

    make_candidate(folder, section.repo_id, seed=4)
    local_hub.inject(drop_next_upload=True, drop_on="commit")
    with pytest.raises(HubError, match="re-run"):  # one attempt only: the run dies mid-upload
        push_candidate(section, folder, commit_message="c2", **opts(local_hub, retry=RetryPolicy(attempts=1)))
    assert commits_of(section.repo_id, local_hub.endpoint) == history  # nothing half-applied
    assert release_target(section, local_hub.endpoint) == released.commit_sha

    rerun = push_candidate(section, folder, commit_message="c2", **opts(local_hub))
    assert commits_of(section.repo_id, local_hub.endpoint) == [rerun.commit_sha, *history]
    assert release_target(section, local_hub.endpoint) == released.commit_sha  # still, until promotion
    local = Path(
        snapshot_download(
            section.repo_id,
            revision=rerun.commit_sha,
            token=WRITE,
            cache_dir=tmp_path / "dl",
            endpoint=local_hub.endpoint,
        )
    )
    downloaded = files_of(local)
    downloaded.pop(".gitattributes")
    assert downloaded == files_of(folder)


def test_dropped_lfs_upload_is_retried_into_one_commit(
    local_hub: LocalHub, section: HubSection, tmp_path: Path
):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    mark = len(local_hub.requests)
    local_hub.inject(drop_next_upload=True, drop_on="lfs")
    result = push_candidate(section, folder, commit_message="c", **opts(local_hub))
    puts = [r.status for r in requests_since(local_hub, mark, "/_lfs/")]
    assert puts[0] == 0 and puts[-1] == 200  # dropped, then uploaded again
    assert len(commits_of(section.repo_id, local_hub.endpoint)) == 2 and result.created_commit


def test_lost_commit_answer_does_not_duplicate_the_commit(
    local_hub: LocalHub, section: HubSection, tmp_path: Path
):
    folder = make_candidate(tmp_path / "ckpt", section.repo_id)
    local_hub.inject(drop_next_commit_response=True)  # the commit lands, the answer never arrives
    result = push_candidate(section, folder, commit_message="c", **opts(local_hub))
    assert result.created_commit
    assert commits_of(section.repo_id, local_hub.endpoint)[:1] == [result.commit_sha]
    assert len(commits_of(section.repo_id, local_hub.endpoint)) == 2  # not 3


# --------------------------------------------------------------------------------------------
# The server as a process
# --------------------------------------------------------------------------------------------


def test_cli_starts_fast_with_auth_and_faults_endpoint(tmp_path: Path):
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localhub", "--root", str(tmp_path / "root"), "--port", "0", "--token", WRITE],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert time.monotonic() - started < 2.0, f"took {time.monotonic() - started:.2f}s"
        endpoint = line.strip().rsplit(" ", 1)[-1]
        assert endpoint.startswith("http://127.0.0.1:")
        auth = {"authorization": f"Bearer {WRITE}"}
        with httpx.Client(base_url=endpoint, timeout=5) as http:
            assert http.get("/api/models/org/x").status_code == 401
            assert http.post("/_faults", json={"fail_next": 1, "status": 503}).status_code == 200
            assert http.get("/api/models/org/x", headers=auth).status_code == 503
            missing = http.get("/api/models/org/x", headers=auth)
            assert (missing.status_code, missing.headers["X-Error-Code"]) == (404, "RepoNotFound")
            assert "error" in missing.json()
    finally:
        proc.terminate()
        proc.wait(timeout=5)
    shutil.rmtree(tmp_path / "root", ignore_errors=True)


# --------------------------------------------------------------------------------------------
# The release (quantize_serve.release.publish): stage, push, then promote or reject
# --------------------------------------------------------------------------------------------


def release_inputs(awq_recipe, section: HubSection, tmp_path: Path) -> tuple:
    """A validated recipe releasing to ``section``'s repo, and a checkpoint folder to release."""
    from quantize_serve.validate.preflight import ValidatedRecipe
    from tests.release_fixtures import placeholder_checkpoint

    recipe = awq_recipe.model_copy(
        update={"hub": awq_recipe.hub.model_copy(update={"repo_id": section.repo_id})}
    )
    validated = ValidatedRecipe(
        recipe=recipe, source="x.yaml", recipe_sha256="0" * 64, calibration_fingerprint="0" * 64
    )
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    checkpoint = placeholder_checkpoint(str(ckpt))
    return recipe, validated, checkpoint


@pytest.mark.parametrize("passed", [True, False])
def test_release_pushes_the_candidate_then_promotes_or_rejects(
    local_hub: LocalHub, awq_recipe, section, tmp_path: Path, monkeypatch, passed: bool
):
    from quantize_serve.gates.decision import CheckRow, Decision
    from quantize_serve.release import publish as release
    from quantize_serve.report.run_report import RunReport
    from quantize_serve.validate.preflight import BaseModelRef

    monkeypatch.setenv("HF_TOKEN", WRITE)
    base = BaseModelRef(local_dir=str(ROOT / "models" / "tiny-llama"), sha="1" * 64)
    recipe, validated, checkpoint = release_inputs(awq_recipe, section, tmp_path)
    (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"weights" * 1000)
    command = f"vllm serve {section.repo_id} --max-model-len 512"

    pushed = release.push_release_candidate(validated, base, checkpoint, command, tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run" / "release").iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    assert command in (tmp_path / "run" / "release" / "README.md").read_text()

    decision = Decision(
        passed=passed,
        checks=[CheckRow(check="stress", passed=passed, reason="ok" if passed else "2 preemptions")],
    )
    report = RunReport(
        run_id="r1",
        recipe=recipe.name,
        recipe_source="x.yaml",
        recipe_sha256="0" * 64,
        base=base,
        checkpoint=checkpoint,
        candidate=pushed,
        decision=decision,
        serving_command=command,
        report_dir=str(tmp_path / "run"),
        stress=stress_result() if passed else stress_result(preemptions=2, failures=["2 preemptions"]),
    )
    outcome = release.promote_or_reject(validated, report, approved=True, approved_by=None)
    assert report.release is outcome
    reasons = release.release_reasons(report, True, None)
    files = set(
        api(local_hub).list_repo_files(section.repo_id, revision=outcome.commit_sha or pushed.commit_sha)
    )
    rules = {"prometheus-rules.yaml", "prometheusrule.yaml"}
    if passed:
        assert outcome.status == "promoted" and reasons == [] and outcome.ref == recipe.hub.release_ref
        assert release_target(recipe.hub, local_hub.endpoint) == outcome.commit_sha != pushed.commit_sha
        # the rules that watch it in production: in the gated commit, beside the report, in its card
        assert rules <= files and all((tmp_path / "run" / name).is_file() for name in rules)
        assert report.alerts and "KVCacheNearFull" in report.alerts
        card = (tmp_path / "run" / "release" / "README.md").read_text()
        promoted_card = api(local_hub).hf_hub_download(
            section.repo_id, "README.md", revision=outcome.commit_sha, cache_dir=tmp_path / "cache"
        )
        assert "KVCacheNearFull" in Path(promoted_card).read_text()
        assert "KVCacheNearFull" not in card  # the candidate's card, written before any gate
    else:
        assert outcome.status == "rejected" and reasons == ["stress: 2 preemptions"]
        assert outcome.rejection_tag and release_target(recipe.hub, local_hub.endpoint) is None
        assert not files & rules and report.alerts is None  # a rejected candidate carries no rules
    event = release.release_event(recipe, report, outcome, reasons)
    assert event["event"] == f"quantize-serve.release.{outcome.status}"
    assert event["resource"]["huggingface.revision"] == (outcome.commit_sha or pushed.commit_sha)
    assert release.revision_url(report, outcome).endswith(f"/tree/{outcome.commit_sha or pushed.commit_sha}")


def test_promoted_card_links_its_hub_base_and_names_tasks_not_paths(
    local_hub: LocalHub, awq_recipe, section, tmp_path: Path, monkeypatch
):
    """The gated card as a consumer reads it from the Hub: the model tree's base link
    (base_model + base_model_relation: quantized), lm-eval task names and dataset ids in
    model-index, the serving vLLM and the run's page."""
    from quantize_serve.gates.accuracy.run import AccuracyCheck
    from quantize_serve.gates.decision import Decision
    from quantize_serve.release import publish as release
    from quantize_serve.report.run_report import RunReport
    from quantize_serve.validate.preflight import BaseModelRef

    monkeypatch.setenv("HF_TOKEN", WRITE)
    base = BaseModelRef(local_dir=str(tmp_path / "hf-cache" / "base"), repo_id="org/tiny-base", sha="a" * 40)
    recipe, validated, checkpoint = release_inputs(awq_recipe, section, tmp_path)
    pushed = release.push_release_candidate(validated, base, checkpoint, "vllm serve org/m", tmp_path / "run")
    candidate = ModelCard.load(section.repo_id, token=WRITE)
    assert (candidate.data.base_model, candidate.data.base_model_relation) == ("org/tiny-base", "quantized")
    assert "| vLLM version (serving) |" in candidate.text  # the candidate card names the serving vLLM too

    checks = [
        AccuracyCheck(
            task=f"../evals/tasks/{t}.yaml",
            metric=m,
            base=1.0,
            quantized=0.99,
            recovery=0.99,
            threshold=0.95,
            passed=True,
            higher_is_better=True,
            reason="ok",
        )
        for t, m in (("qs_facts_mc", "acc"), ("qs_heldout_ppl", "word_perplexity"))
    ]
    report = RunReport(
        run_id="r1",
        recipe=recipe.name,
        recipe_source="x.yaml",
        recipe_sha256="0" * 64,
        base=base,
        checkpoint=checkpoint,
        candidate=pushed,
        accuracy=checks,
        decision=Decision(passed=True, checks=[]),
        serving_command="vllm serve org/m",
        vllm_version="0.32.0",
        run_url="https://prefect.example.com/runs/flow-run/r1",
        report_dir=str(tmp_path / "run"),
    )
    assert release.promote_or_reject(validated, report, approved=True, approved_by=None).status == "promoted"
    card = ModelCard.load(section.repo_id, token=WRITE)
    assert (card.data.base_model, card.data.base_model_relation) == ("org/tiny-base", "quantized")
    assert [(r.task_name, r.dataset_type, r.metric_type) for r in card.data.eval_results] == [
        ("qs_facts_mc", "local:facts_mc", "acc"),
        ("qs_heldout_ppl", "local:heldout_ppl", "word_perplexity"),
    ]
    assert all(r.dataset_revision and len(r.dataset_revision) == 64 for r in card.data.eval_results)
    assert (
        "evals/tasks" not in card.content
        and "| qs_facts_mc | local:facts_mc, split test, revision" in card.text
    )
    assert "| vLLM version (serving) | 0.32.0 |" in card.text
    assert "[Prefect flow run](https://prefect.example.com/runs/flow-run/r1)" in card.text
    assert not any(f.startswith(".eval_results/") for f in api(local_hub).list_repo_files(section.repo_id))
