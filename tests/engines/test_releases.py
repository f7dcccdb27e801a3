"""Releases over time against the local Hub, through the REAL ``huggingface_hub`` client: the release
step records its results in the gated commit; the history reads them back; rollback moves the release
ref back and forth, refuses what was never gated or was rejected, and survives the Hub failing midway,
a ref moved by someone else and a token without write rights. No vLLM: the releases are made by the
release step itself (``promote_or_reject``) from realistic recorded figures (tests/release_fixtures.py).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from localhub.server import LocalHub
from quantize_serve import cli
from quantize_serve.core.errors import HubAuthError, HubError, RefMovedError, ReleaseRefusedError
from quantize_serve.gates.decision import CheckRow, Decision
from quantize_serve.gates.regression import measurement_conditions
from quantize_serve.hub.client import RetryPolicy, resolve_token
from quantize_serve.hub.publish import push_candidate
from quantize_serve.recipe.load import load_recipe
from quantize_serve.release.baseline import find_baseline
from quantize_serve.release.history import release_history
from quantize_serve.release.publish import promote_or_reject
from quantize_serve.release.rollback import apply_rollback, plan_rollback
from quantize_serve.report.release_results import RELEASE_RESULTS_FILE
from quantize_serve.validate.preflight import ValidatedRecipe
from tests.conftest import HUB_READ as READ
from tests.conftest import HUB_WRITE as WRITE
from tests.conftest import ROOT, use_local_hub_client
from tests.release_fixtures import CONDITIONS, KV_4BIT, KV_8BIT, run_report

FAST = RetryPolicy(attempts=3, base_s=0.01, max_s=0.05)


@pytest.fixture(autouse=True)
def _client_env(local_hub: LocalHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    use_local_hub_client(monkeypatch, local_hub.endpoint, tmp_path / "hf-cache")
    monkeypatch.setenv("HF_TOKEN", WRITE)
    local_hub.clear_faults()
    yield
    local_hub.clear_faults()


@pytest.fixture
def validated() -> ValidatedRecipe:
    """The tiny AWQ recipe, releasing to a repo of its own."""
    recipe = load_recipe(
        ROOT / "recipes" / "tiny-llama-awq.yaml", {"hub.repo_id": f"org/r-{uuid.uuid4().hex[:8]}"}
    )
    return ValidatedRecipe(
        recipe=recipe,
        source="recipes/tiny-llama-awq.yaml",
        recipe_sha256="0" * 64,
        calibration_fingerprint="2" * 64,
    )


def release(
    validated: ValidatedRecipe, tmp_path: Path, n: int, *, kv_tokens: int = KV_4BIT, rejected: bool = False
) -> str:
    """One run's release: push a candidate (a small checkpoint-shaped folder), then the release step.
    Returns the gated commit (promoted) or the candidate (rejected)."""
    folder = tmp_path / f"candidate-{n}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "release": n}))
    (folder / "tokenizer.json").write_text(json.dumps({"vocab": {"a": 0}}))
    (folder / "model.safetensors").write_bytes(hashlib.sha256(str(n).encode()).digest() * 64)
    (folder / "README.md").write_text(f"# candidate {n}\n")
    pushed = push_candidate(
        validated.recipe.hub, folder, token=WRITE, commit_message=f"candidate {n}", retry=FAST
    )
    decision = Decision(
        passed=not rejected,
        checks=[
            CheckRow(
                check="regression capacity",
                passed=not rejected,
                reason="KV tokens: candidate 13,696 vs production 14,464: x0.947 < 1.00",
            )
        ],
    )
    report = run_report(
        repo_id=pushed.repo_id,
        candidate_sha=pushed.commit_sha,
        run_id=f"run-{n}",
        kv_tokens=kv_tokens,
        decision=decision,
        report_dir=str(tmp_path),
    )
    rel = promote_or_reject(validated, report, approved=True, approved_by=None)
    return rel.commit_sha if rel.status == "promoted" else pushed.commit_sha


def production(validated: ValidatedRecipe) -> str | None:
    refs = HfApi(token=WRITE).list_repo_refs(validated.recipe.hub.repo_id)
    return next((t.target_commit for t in refs.tags if t.name == "production"), None)


def roll_back(validated: ValidatedRecipe, to: str | None = None, **kwargs):
    hub = validated.recipe.hub
    plan = plan_rollback(release_history(hub, token=WRITE), to)
    return apply_rollback(hub, plan, token=kwargs.pop("token", WRITE), retry=FAST, **kwargs)


def main_card(validated: ValidatedRecipe) -> str:
    api = HfApi(token=WRITE)
    return Path(api.hf_hub_download(validated.recipe.hub.repo_id, "README.md", revision="main")).read_text()


def test_the_gated_commit_carries_its_results_and_the_history_reads_them(validated, tmp_path):
    g1 = release(validated, tmp_path, 1, kv_tokens=KV_8BIT)
    g2 = release(validated, tmp_path, 2)
    c3 = release(validated, tmp_path, 3, kv_tokens=KV_8BIT, rejected=True)
    hub = validated.recipe.hub
    recorded = json.loads(
        Path(HfApi(token=WRITE).hf_hub_download(hub.repo_id, RELEASE_RESULTS_FILE, revision=g2)).read_text()
    )
    assert recorded["status"] == "promoted" and recorded["results"]["kv_cache_tokens"] == KV_4BIT
    assert recorded["results"]["conditions"]["vllm_version"] == "0.32.0" and recorded["run_id"] == "run-2"

    history = release_history(hub, token=WRITE)
    assert [(e.commit, e.status) for e in history.entries] == [
        (g1, "promoted"),
        (g2, "promoted"),
        (c3, "rejected"),
    ]
    assert history.current == g2 == production(validated)
    rows = history.rows()
    assert (
        rows[0]["decision"].startswith("rejected: regression capacity: KV tokens")
        and rows[0]["KV tokens"] == "13,696"
    )
    assert rows[1]["now"] == "<- current" and rows[1]["approved by"] == "auto (gates)"
    assert rows[1]["min recovery"] == "0.9902"  # held-out perplexity 2.214 / 2.236


def test_rollback_runs_twice_and_back(validated, tmp_path):
    """Three releases; roll back twice (the default: the gated commit before the current one), then
    forward again with --to; each step is on the card and in the history; a rerun changes nothing."""
    g1, g2, g3 = (release(validated, tmp_path, n) for n in (1, 2, 3))
    assert production(validated) == g3
    first = roll_back(validated, reason="p99 latency doubled")
    assert production(validated) == g2 and first.moved and first.note_commit
    assert "p99 latency doubled" in main_card(validated) and f"points at `{g2}`" in main_card(validated)
    roll_back(validated)
    assert production(validated) == g1
    back = roll_back(validated, g3[:10], reason="fixed upstream")
    assert production(validated) == g3 and back.moved

    commits = len(HfApi(token=WRITE).list_repo_commits(validated.recipe.hub.repo_id))
    again = plan_rollback(release_history(validated.recipe.hub, token=WRITE), g3)
    assert again.changes_nothing  # idempotent: nothing moves, no second note
    assert len(HfApi(token=WRITE).list_repo_commits(validated.recipe.hub.repo_id)) == commits

    history = release_history(validated.recipe.hub, token=WRITE)
    assert [e.kind for e in history.events] == ["promoted"] * 3 + ["rolled back"] * 3
    g3_row = next(r for r in history.rows() if g3.startswith(r["commit"]))
    assert (
        f"(to {g2[:12]}" in g3_row["rolled back from here"]
        and f"(from {g1[:12]}" in g3_row["rolled back to here"]
    )
    assert main_card(validated).count("- ") >= 3 and "## Rollbacks" in main_card(validated)


def test_rollback_to_a_rejected_or_never_gated_commit_is_refused_and_moves_nothing(
    validated, tmp_path, capsys
):
    g1 = release(validated, tmp_path, 1)
    c2 = release(validated, tmp_path, 2, kv_tokens=KV_8BIT, rejected=True)
    hub = validated.recipe.hub
    history = release_history(hub, token=WRITE)
    with pytest.raises(ReleaseRefusedError, match="rejected"):
        plan_rollback(history, c2)
    candidate_1 = history.entry(g1).candidate
    with pytest.raises(ReleaseRefusedError, match=f"use --to {g1}"):
        plan_rollback(history, candidate_1)
    # the command line: one screen, exit 2, no traceback, the token never printed
    capsys.readouterr()
    status = cli.main(["rollback", hub.repo_id, "--to", c2[:12]])
    err = capsys.readouterr().err
    assert status == 2 and "was rejected" in err and "KV tokens" in err and "Traceback" not in err
    assert WRITE not in err and len(err.strip().splitlines()) <= 3, err
    assert production(validated) == g1


def test_the_hub_failing_mid_rollback_says_what_is_left_and_a_rerun_finishes(
    validated, tmp_path, local_hub, monkeypatch
):
    """The Hub dies right after the old tag is deleted: the error says the ref points at nothing and to
    re-run with --to; the rerun creates it and writes the note. Then the Hub dies before the note: the
    ref moved, the rerun writes only the note."""
    g1, g2 = release(validated, tmp_path, 1), release(validated, tmp_path, 2)
    original = HfApi.delete_tag

    def delete_then_fail(self, *args, **kwargs):
        original(self, *args, **kwargs)
        local_hub.inject(fail_next=50, status=503)

    monkeypatch.setattr(HfApi, "delete_tag", delete_then_fail)
    with pytest.raises(HubError) as err:
        roll_back(validated)
    text = str(err.value)
    assert "points at nothing now" in text and f"--to {g1}" in text and WRITE not in text
    monkeypatch.setattr(HfApi, "delete_tag", original)
    local_hub.clear_faults()
    assert production(validated) is None
    done = roll_back(validated, g1)
    assert production(validated) == g1 and done.note_commit and f"points at `{g1}`" in main_card(validated)

    original_commit = HfApi.create_commit

    def fail_commits(self, *args, **kwargs):
        local_hub.inject(fail_next=50, status=500)
        return original_commit(self, *args, **kwargs)

    monkeypatch.setattr(HfApi, "create_commit", fail_commits)
    with pytest.raises(HubError, match="not noted on the card yet"):
        roll_back(validated, g2)
    monkeypatch.setattr(HfApi, "create_commit", original_commit)
    local_hub.clear_faults()
    assert production(validated) == g2
    plan = plan_rollback(release_history(validated.recipe.hub, token=WRITE), g2)
    assert (plan.move, plan.note) == (False, True)
    apply_rollback(validated.recipe.hub, plan, token=WRITE, retry=FAST)
    assert f"points at `{g2}`" in main_card(validated)


def test_a_ref_moved_by_someone_else_in_between_is_refused(validated, tmp_path):
    g1, g2, g3 = (release(validated, tmp_path, n) for n in (1, 2, 3))
    hub = validated.recipe.hub
    plan = plan_rollback(release_history(hub, token=WRITE))  # g3 -> g2, as read now
    api = HfApi(token=WRITE)  # someone else puts g1 in production meanwhile
    api.delete_tag(hub.repo_id, tag="production")
    api.create_tag(hub.repo_id, tag="production", revision=g1)
    commits = len(api.list_repo_commits(hub.repo_id))
    with pytest.raises(RefMovedError) as err:
        apply_rollback(hub, plan, token=WRITE, retry=FAST)
    assert f"points at {g1}, not at {g3}" in str(err.value) and "Nothing was changed" in str(err.value)
    assert production(validated) == g1 and len(api.list_repo_commits(hub.repo_id)) == commits


def test_a_token_without_write_rights_reads_the_history_but_cannot_roll_back(
    validated, tmp_path, monkeypatch
):
    _g1, g2 = release(validated, tmp_path, 1), release(validated, tmp_path, 2)
    monkeypatch.setenv("HF_TOKEN", READ)
    hub = validated.recipe.hub
    history = release_history(hub, token=resolve_token(hub))
    assert history.current == g2
    with pytest.raises(HubAuthError) as err:
        apply_rollback(hub, plan_rollback(history), token=resolve_token(hub), retry=FAST)
    assert "no write access" in str(err.value) and READ not in str(err.value)
    assert production(validated) == g2


def test_the_regression_baseline_uses_recorded_figures_or_downloads_the_release(validated, tmp_path):
    recipe = validated.recipe
    conditions = CONDITIONS
    first = find_baseline(recipe, conditions)
    assert first.off.startswith("no release to compare with") and "a first release" in first.off
    g1 = release(validated, tmp_path, 1)
    same = find_baseline(recipe, conditions)
    assert (same.commit, same.recorded.kv_cache_tokens, same.local_dir) == (g1, KV_4BIT, None)
    now = measurement_conditions(recipe, vllm_version="0.33.0", hardware=conditions.hardware)
    other = find_baseline(recipe, now)
    assert other.recorded is None and "vLLM 0.32.0 -> 0.33.0" in other.differences
    assert (Path(other.local_dir) / "config.json").is_file() and (
        Path(other.local_dir) / "model.safetensors"
    ).is_file()
    off = find_baseline(
        load_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml", {"gates.regression.enabled": False}), conditions
    )
    assert "gates.regression.enabled is false" in off.off


def test_the_releases_command_prints_the_table(validated, tmp_path, capsys):
    g1 = release(validated, tmp_path, 1)
    assert cli.main(["releases", validated.recipe.hub.repo_id]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{validated.recipe.hub.repo_id}: tag 'production' -> {g1[:12]}")
    assert "approved by" in out and "14,464" in out and WRITE not in out


def test_the_releases_command_warns_when_the_ref_serves_no_release(validated, tmp_path, capsys):
    """Issue 44: the tag moved by hand onto the rejected candidate, then onto a commit no gate saw; the
    command says so on top and names the rollback that puts it back, and that rollback does."""
    release(validated, tmp_path, 1)
    g2 = release(validated, tmp_path, 2)
    c3 = release(validated, tmp_path, 3, kv_tokens=KV_8BIT, rejected=True)
    repo, api = validated.recipe.hub.repo_id, HfApi(token=WRITE)

    def move_by_hand(sha: str) -> None:
        api.delete_tag(repo, tag="production")
        api.create_tag(repo, tag="production", revision=sha)

    repair = f"`quantize-serve rollback {repo} --to {g2}` (the newest gated commit)"
    move_by_hand(c3)
    assert cli.main(["releases", repo]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"WARNING: production serves {c3[:12]}, which the gates rejected (rejected-{c3[:12]} tag: "
        "regression capacity: KV tokens"
    ), out
    assert out.splitlines()[0].endswith(repair) and "<- current (rejected)" in out

    card_commit = api.list_repo_commits(repo)[0].commit_id  # the rejection's card: never gated
    move_by_hand(card_commit)
    assert cli.main(["releases", repo]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"WARNING: production serves {card_commit[:12]}, which no gate passed (the tag was moved "
        f"there by hand). Fix: {repair}"
    ), out
    assert cli.main(["rollback", repo]) == 2  # no --to: refused, proposing the same command
    assert (
        "which no gate passed" in (err := capsys.readouterr().err)
        and f"--to {g2}`" in err
        and WRITE not in err
    )

    roll_back(validated, g2, reason="put back after a manual move")
    assert production(validated) == g2
    assert cli.main(["releases", repo]) == 0
    assert capsys.readouterr().out.startswith(f"{repo}: tag 'production' -> {g2[:12]}")
