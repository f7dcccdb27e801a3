"""The regression gate (gates.regression), the release history's reading of a repo, and the
rollback's plan and card note: pure logic on realistic recorded figures (tests/release_fixtures.py).
The same code against the local Hub with the real client: tests/engines/test_releases.py."""

from __future__ import annotations

import logging

import pytest

from quantize_serve.core.errors import RecipeErrors, ReleaseRefusedError
from quantize_serve.gates.decision import decide
from quantize_serve.gates.regression import (
    compare_with_production,
    condition_differences,
    measurement_conditions,
    regression_off,
    throughput_to_confirm,
    with_throughput_of,
)
from quantize_serve.hub.releases import HubCommit, RepoState
from quantize_serve.recipe.gates import RegressionGate
from quantize_serve.recipe.load import load_recipe, parse_recipe
from quantize_serve.recipe.model import HubSection
from quantize_serve.release.history import format_table, interpret, rollback_title
from quantize_serve.release.rollback import NOTE_MARK, ROLLBACKS_HEADING, note_rollback, plan_rollback
from quantize_serve.report.release_results import release_record, release_record_bytes
from quantize_serve.report.run_report import render_markdown
from tests.conftest import ROOT
from tests.release_fixtures import (
    CONDITIONS,
    KV_4BIT,
    KV_8BIT,
    base_results,
    results,
    run_report,
    stress_result,
)

GATE = RegressionGate()
RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


def compare(candidate, production, gate=GATE, **how):
    return compare_with_production(
        candidate,
        production,
        gate,
        base=base_results(),
        release_ref="production",
        production_sha="a" * 40,
        **{"source": "recorded", **how},
    )


def test_a_release_that_beats_its_base_but_serves_fewer_requests_than_production_is_rejected():
    """The issue's case: the 8-bit candidate recovers fine against its base, but holds 13,696 KV tokens
    where production holds 14,464: 5% fewer concurrent requests, below min_capacity_ratio 1.0."""
    result = compare(results(kv_tokens=KV_8BIT), results(kv_tokens=KV_4BIT))
    decision = decide([], stress_result(), regression=result)
    capacity = next(c for c in decision.checks if c.check == "regression capacity")
    assert not decision.passed and not capacity.passed
    assert "KV tokens: candidate 13,696 vs production 14,464: x0.947 < 1.00" in capacity.reason
    assert "max concurrency" in capacity.reason and "gates.regression.min_capacity_ratio" in capacity.reason
    assert any(r.startswith("regression capacity: KV tokens") for r in decision.reasons)
    assert next(c for c in decision.checks if c.check == "regression accuracy").passed


def test_a_release_at_least_as_good_as_production_passes_and_the_table_shows_all_three():
    result = compare(
        results(kv_tokens=KV_4BIT, throughput=2_300.0), results(kv_tokens=KV_4BIT, throughput=2_400.0)
    )
    assert result.passed, result.markdown()
    table = result.markdown()
    assert "| measure | base | production | candidate |" in table
    assert "| KV tokens | 6,016 | 14,464 | 14,464 | x1.0000 | >= x1.00 | pass |" in table
    assert "its figures as recorded with it on the Hub (same conditions)" in table


def test_accuracy_drop_counts_per_metric_and_in_the_right_direction():
    """3% worse everywhere: the facts accuracy falls, the perplexity rises; both fail at 2%; a per-metric
    override lets the perplexity through."""
    result = compare(results(accuracy_scale=0.97), results())
    failed = {r.measure for r in result.rows if not r.passed}
    assert failed == {
        "qs_facts_mc acc",
        "qs_facts_mc acc_norm",
        "qs_heldout_ppl word_perplexity",
    }  # never a path
    ppl = next(r for r in result.rows if r.measure.endswith("word_perplexity"))
    assert "lower is better" in ppl.reason and ppl.candidate > ppl.production
    relaxed = compare(
        results(accuracy_scale=0.97), results(), RegressionGate(metric_max_drop={"word_perplexity": 0.05})
    )
    assert next(r for r in relaxed.rows if r.measure.endswith("word_perplexity")).passed


def test_throughput_and_missing_figures():
    slow = compare(results(throughput=1_800.0), results(throughput=2_400.0))
    row = next(r for r in slow.rows if r.kind == "throughput")
    assert not row.passed and "x0.750 < 0.80" in row.reason and "@ concurrency 8" in row.measure
    missing = compare(results().model_copy(update={"output_throughput": None}), results())
    assert "not measured for the candidate" in next(r for r in missing.rows if r.kind == "throughput").reason
    not_compared = compare(
        results(throughput=100.0),
        results(throughput=2_400.0),
        GATE.model_copy(update={"min_throughput_ratio": None}),
    )
    assert not any(r.kind == "throughput" for r in not_compared.rows) and not_compared.passed
    assert RegressionGate(min_throughput_ratio=None).min_throughput_ratio is None  # null in a recipe


def test_a_throughput_below_the_recorded_figure_is_measured_again_before_it_rejects():
    """Production's figures recorded on this hardware at 2,400 tok/s; the host is slower today (a busier
    CPU, another card of the same model), so the candidate measures 600: production's throughput is measured
    again in the run, and the candidate is compared with that, its other figures still the recorded ones."""
    recorded = results(throughput=2_400.0)
    why = throughput_to_confirm(recorded, results(throughput=600.0), GATE)
    assert why == (
        "the candidate's 600 output tok/s is x0.250 of production's recorded 2,400, below 0.80: a host's "
        "speed on the day is no recorded condition"
    )
    for not_needed in (
        (results(throughput=2_000.0), GATE),  # within the limit: nothing to confirm
        (results(throughput=600.0), GATE.model_copy(update={"min_throughput_ratio": None})),  # not compared
        (results().model_copy(update={"output_throughput": None}), GATE),  # a failed stress test fails anyway
    ):
        assert throughput_to_confirm(recorded, *not_needed) is None
    served = results(throughput=650.0).model_copy(update={"stress_concurrency": 4})
    production = with_throughput_of(recorded, served)
    assert (production.output_throughput, production.stress_concurrency) == (650.0, 4)
    assert production.model_dump(exclude={"output_throughput", "stress_concurrency"}) == recorded.model_dump(
        exclude={"output_throughput", "stress_concurrency"}
    )
    again = {"source": "recorded, throughput served again", "differences": [why]}
    result = compare(results(throughput=600.0), production, **again)
    throughput = next(r for r in result.rows if r.kind == "throughput")
    assert result.passed and (throughput.production, throughput.candidate) == (650.0, 600.0)
    assert (
        "its figures as recorded with it on the Hub (same conditions), its throughput measured again in this "
        "run (the candidate's 600 output tok/s is x0.250" in result.markdown()
    )
    slower_still = compare(results(throughput=400.0), production, **again)
    assert [r.kind for r in slower_still.rows if not r.passed] == ["throughput"]  # on this host too


def test_the_gate_off_is_a_row_that_says_so_and_passes():
    decision = decide(
        [],
        stress_result(),
        regression=regression_off(
            "no release to compare with: the tag 'production' does not exist in org/m yet (a first release)"
        ),
    )
    row = decision.checks[-1]
    assert row.check == "regression" and row.passed and row.off
    assert "| regression | off | off: no release to compare with" in decision.markdown()


def test_conditions_name_what_differs():
    recipe = load_recipe(RECIPE)
    now = measurement_conditions(recipe, vllm_version="0.32.0", hardware="x86_64 2 CPUs, no GPU")
    assert condition_differences(now, now) == []
    other = load_recipe(RECIPE, {"serve.max_num_seqs": 4, "gates.stress.concurrency": 4})
    later = measurement_conditions(other, vllm_version="0.33.0", hardware="x86_64 2 CPUs, no GPU")
    diffs = condition_differences(now, later)
    assert "vLLM 0.32.0 -> 0.33.0" in diffs
    assert any(d.startswith("serve.max_num_seqs") for d in diffs) and any(
        d.startswith("gates.stress.concurrency") for d in diffs
    )
    assert not any(
        "recovery" in d
        for d in condition_differences(
            now,
            measurement_conditions(
                load_recipe(RECIPE, {"gates.accuracy.error_rates.bad_recovery": 0.9}),
                vllm_version="0.32.0",
                hardware="x86_64 2 CPUs, no GPU",
            ),
        )
    )


def test_the_regression_section_is_on_by_default_and_checked_at_load():
    recipe = load_recipe(RECIPE)
    assert recipe.gates.regression.enabled and recipe.gates.regression.min_capacity_ratio == 1.0
    data = recipe.model_dump(mode="json")
    data["gates"]["regression"] = {"min_capacity_ratio": 5}
    with pytest.raises(RecipeErrors) as err:
        parse_recipe(data, source="x.yaml")
    text = str(err.value)
    assert "gates.regression.min_capacity_ratio" in text and "5" in text and "between 0.1 and 2" in text


# --------------------------------------------------------------------------------------------
# The history, read from a repo's state
# --------------------------------------------------------------------------------------------

HUB = HubSection(repo_id="org/m", release_ref="production")
SHA = {name: (name * 40)[:40] for name in "abcdefgh"}


def state(commits: list[tuple[str, str, str]], tags: dict[str, str]) -> RepoState:
    """commits: (sha key, title, description), oldest first."""
    listed = [
        HubCommit(sha=SHA[k], title=t, message=m, date=f"2026-12-0{i + 1}T10:00:00Z", authors=["alice"])
        for i, (k, t, m) in enumerate(commits)
    ]
    for older, newer in zip(listed, listed[1:], strict=False):
        newer.parent = older.sha
    return RepoState(repo_id="org/m", tags=tags, commits=list(reversed(listed)))


def record(key: str, kv: int, status: str = "promoted"):
    report = run_report(repo_id="org/m", candidate_sha=SHA[key], run_id=f"run-{key}", kv_tokens=kv)
    return release_record(
        report,
        status=status,
        reasons=[] if status == "promoted" else ["regression capacity"],
        approval="manual",
        approved_by="carol",
    )


def three_releases(**tags: str) -> RepoState:
    return state(
        [
            ("a", "candidate 1", ""),
            ("b", "Gates passed (run 1)", ""),
            ("c", "candidate 2", ""),
            ("d", "Gates passed (run 2)", ""),
            ("e", "candidate 3", ""),
            ("f", "Model card: candidate eeeeeeeeeeee rejected", ""),
        ],
        {"production": SHA["d"], f"rejected-{SHA['e'][:12]}": SHA["e"], **tags},
    )


RECORDS = {
    SHA["b"]: record("a", KV_8BIT),
    SHA["d"]: record("c", KV_4BIT),
    SHA["f"]: record("e", KV_8BIT, status="rejected"),
}


def test_history_reads_gated_and_rejected_commits_with_their_figures():
    history = interpret(HUB, three_releases(), RECORDS.get)
    assert [(e.commit, e.status) for e in history.entries] == [
        (SHA["b"], "promoted"),
        (SHA["d"], "promoted"),
        (SHA["e"], "rejected"),
    ]
    assert history.current == SHA["d"] and history.entry(SHA["d"]).current
    rows = history.rows()
    assert (
        rows[1]["KV tokens"] == "14,464"
        and rows[1]["approved by"] == "carol"
        and rows[1]["now"] == "<- current"
    )
    assert rows[0]["decision"].startswith("rejected: regression capacity")
    printed = history.table()
    assert printed.startswith("org/m: tag 'production' -> dddddddddddd")
    assert "commit" in printed.splitlines()[1] and "rolled back from here" in printed


def test_rollback_defaults_to_the_gated_commit_before_the_current_and_refuses_the_rest():
    history = interpret(HUB, three_releases(), RECORDS.get)
    plan = plan_rollback(history)
    assert (plan.current, plan.target, plan.move, plan.note) == (SHA["d"], SHA["b"], True, True)
    assert plan_rollback(history, SHA["b"][:8]).target == SHA["b"]
    for to, says in [
        (SHA["e"], "was rejected (regression capacity)"),
        (SHA["c"], f"use --to {SHA['d']}"),
        (SHA["f"], "never gated"),
        ("g" * 40, "not a commit sha"),
        ("1234567", "never gated"),
    ]:
        with pytest.raises(ReleaseRefusedError) as err:
            plan_rollback(history, to)
        assert says in str(err.value), str(err.value)
    oldest = interpret(HUB, three_releases(production=SHA["b"]), RECORDS.get)
    with pytest.raises(ReleaseRefusedError, match="no gated commit is older"):
        plan_rollback(oldest)


def test_a_noted_rollback_is_in_the_history_and_a_rerun_changes_nothing():
    rolled = three_releases(production=SHA["b"])
    rolled.commits.insert(
        0,
        HubCommit(
            sha=SHA["g"],
            title=rollback_title("tag", "production", SHA["b"], SHA["d"]),
            message="p99 latency doubled",
            date="2026-12-09T10:00:00Z",
            authors=["bob"],
            parent=SHA["f"],
        ),
    )
    history = interpret(HUB, rolled, RECORDS.get)
    assert history.recorded_target() == SHA["b"]
    entry_d, entry_b = history.entry(SHA["d"]), history.entry(SHA["b"])
    assert entry_d.rolled_back_from[0].reason == "p99 latency doubled" and entry_b.current
    assert "2026-12-09 10:00 (to bbbbbbbbbbbb by bob)" in history_row_text(history, SHA["d"])
    assert plan_rollback(history, SHA["b"]).changes_nothing
    moved_unnoted = interpret(HUB, three_releases(production=SHA["b"]), RECORDS.get)  # moved, note lost
    plan = plan_rollback(moved_unnoted, SHA["b"])
    assert (plan.move, plan.note, plan.previous) == (False, True, SHA["d"])


def fix_command(sha_key: str) -> str:
    return f"quantize-serve rollback org/m --to {SHA[sha_key]}"


def test_a_ref_at_a_commit_no_gate_passed_warns_on_top_and_names_the_rollback_that_repairs_it():
    """Issue 44: a hand-moved ref (to a card commit, or to a gated commit's candidate) and a ref on a
    rejected candidate; the table and the JSON say it first, with the command."""
    assert interpret(HUB, three_releases(), RECORDS.get).ref_warning is None  # on the newest gated commit
    hand_moved = interpret(HUB, three_releases(production=SHA["f"]), RECORDS.get)
    assert hand_moved.ref_warning == (
        "production serves ffffffffffff, which no gate passed (the tag was moved there by hand). "
        f"Fix: `{fix_command('d')}` (the newest gated commit)"
    )
    printed = hand_moved.table().splitlines()
    assert (
        printed[0] == f"WARNING: {hand_moved.ref_warning}"
        and printed[1] == "org/m: tag 'production' -> ffffffffffff"
    )
    top = hand_moved.rows()[0]
    assert (top["commit"], top["decision"], top["run"], top["now"]) == (
        "ffffffffffff",
        "never gated",
        "-",
        "<- current",
    )
    assert '"ref_warning":"production serves ffffffffffff' in hand_moved.model_dump_json()

    candidate = interpret(HUB, three_releases(production=SHA["c"]), RECORDS.get).ref_warning
    assert (
        "serves cccccccccccc, which no gate passed (it is the candidate of the gated commit dddddddddddd"
        in candidate
    )
    assert candidate.endswith(f"Fix: `{fix_command('d')}` (the newest gated commit)")

    rejected = interpret(HUB, three_releases(production=SHA["e"]), RECORDS.get)
    assert rejected.ref_warning == (
        "production serves eeeeeeeeeeee, which the gates rejected (rejected-eeeeeeeeeeee tag: regression "
        f"capacity). Fix: `{fix_command('d')}` (the newest gated commit)"
    )
    assert rejected.table().startswith("WARNING: production serves eeeeeeeeeeee, which the gates rejected")
    assert rejected.rows()[0]["now"] == "<- current (rejected)"


def test_the_repair_keeps_a_rollback_and_names_the_ref_options_and_nothing_to_roll_back_to():
    """After a rollback away from the newest release, the repair goes back to where the rollback put the
    ref, not to the release it rolled back from; a branch or another ref name is in the command."""
    rolled = three_releases(production=SHA["g"])  # rolled back d -> b, then the tag was moved by hand
    rolled.commits.insert(
        0,
        HubCommit(
            sha=SHA["g"],
            title=rollback_title("tag", "production", SHA["b"], SHA["d"]),
            date="2026-12-09T10:00:00Z",
            parent=SHA["f"],
        ),
    )
    warning = interpret(HUB, rolled, RECORDS.get).ref_warning
    assert warning.endswith(
        f"Fix: `{fix_command('b')}` (where the last rollback put it; the newest gated "
        "commit, dddddddddddd, was rolled back from)"
    )
    branch = HubSection(repo_id="org/m", release_ref="serving", release_ref_kind="branch")
    on_branch = three_releases()
    on_branch.branches["serving"] = SHA["e"]
    assert (
        f"--ref serving --ref-kind branch --to {SHA['d']}`"
        in interpret(branch, on_branch, RECORDS.get).ref_warning
    )
    only_rejected = state(
        [("a", "candidate 1", "")], {"production": SHA["a"], f"rejected-{SHA['a'][:12]}": SHA["a"]}
    )
    warning = interpret(HUB, only_rejected, RECORDS.get).ref_warning
    assert warning.startswith(
        "production serves aaaaaaaaaaaa, which the gates rejected (rejected-aaaaaaaaaaaa tag)"
    )
    assert "none to roll back to. Fix: release one through the gates" in warning
    unset = three_releases()
    del unset.tags["production"]
    assert interpret(HUB, unset, RECORDS.get).ref_warning.startswith(
        "production points at nothing, though 2 commit(s) of org/m passed the gates. Fix: `quantize-serve "
        "rollback"
    )


def test_rollback_without_to_from_a_ref_no_gate_passed_proposes_the_repair():
    """From a commit never gated: refused, with the command `releases` proposes; from a rejected
    candidate: the same commit, planned."""
    hand_moved = interpret(HUB, three_releases(production=SHA["f"]), RECORDS.get)
    with pytest.raises(ReleaseRefusedError) as err:
        plan_rollback(hand_moved)
    text = str(err.value)
    assert "points at ffffffffffff, which no gate passed" in text, text
    assert (
        f"Fix: name the target with --to SHA: `{fix_command('d')}`" in text
        and "dddddddddddd, bbbbbbbbbbbb" in text
    )
    plan = plan_rollback(interpret(HUB, three_releases(production=SHA["e"]), RECORDS.get))
    assert (plan.current, plan.target, plan.move) == (SHA["e"], SHA["d"], True)
    unset = three_releases()
    del unset.tags["production"]
    with pytest.raises(ReleaseRefusedError, match=f"points at nothing.*{fix_command('d')}"):
        plan_rollback(interpret(HUB, unset, RECORDS.get))


def test_the_history_artifact_says_the_warning_first(monkeypatch):
    import tasks.releases as release_tasks

    made: list[dict] = []
    monkeypatch.setattr(release_tasks, "create_table_artifact", lambda **kw: made.append(kw))
    monkeypatch.setattr(release_tasks, "get_run_logger", lambda: logging.getLogger("test"))
    history = interpret(HUB, three_releases(production=SHA["e"]), RECORDS.get)
    release_tasks.publish_release_history.fn(HUB, history)
    assert made[0]["description"].startswith(
        f"**WARNING:** {history.ref_warning}\n\nRelease history of org/m"
    )
    assert made[0]["table"][0]["now"] == "<- current (rejected)"
    fine = interpret(HUB, three_releases(), RECORDS.get)
    assert (
        release_tasks.history_description(fine)
        == "Release history of org/m: tag 'production' -> dddddddddddd"
    )


def history_row_text(history, sha) -> str:
    return " ".join(next(r for r in history.rows() if sha.startswith(r["commit"])).values())


def test_the_card_note_is_on_top_once_and_listed_under_rollbacks():
    history = interpret(HUB, three_releases(), RECORDS.get)
    plan = plan_rollback(history)
    card = "---\nlicense: mit\n---\n\n# m\n\n**Status: promoted.**\n"
    once = note_rollback(card, plan, at="2026-12-09 10:00 UTC", reason="latency")
    twice = note_rollback(once, plan, at="2026-12-10 10:00 UTC", reason="again")
    assert twice.count(NOTE_MARK) == 1 and "since 2026-12-10 10:00 UTC" in twice
    assert twice.index(NOTE_MARK) > twice.index("# m") and twice.count(ROLLBACKS_HEADING) == 1
    assert twice.count(f"-> `{SHA['b']}` (was `{SHA['d']}`)") == 2


def test_the_record_round_trips_and_the_report_shows_production_beside_base_and_candidate(tmp_path):
    from quantize_serve.report.release_results import parse_release_record

    report = run_report(
        repo_id="org/m",
        candidate_sha=SHA["a"],
        run_id="r",
        regression=compare(results(kv_tokens=KV_8BIT), results()),
    )
    rec = record("a", KV_4BIT)
    assert parse_release_record(release_record_bytes(rec)) == rec
    assert parse_release_record(b"{not json") is None
    text = render_markdown(report)
    assert (
        "## Against production (base, production, candidate)" in text
        and "| KV tokens | 6,016 | 14,464 | 13,696 |" in text
    )


def test_a_table_pads_every_column():
    text = format_table([{"a": "1", "bb": "22"}, {"a": "333", "bb": "4"}])
    assert text.splitlines()[0] == "a    bb" and text.splitlines()[2] == "1    22"


def test_conditions_of_the_fixture_match_what_the_recipe_would_record():
    assert CONDITIONS.stress["concurrency"] == 8  # results() and run_report() agree with it
    assert results().max_concurrency == KV_4BIT / 512


def test_the_card_shows_production_beside_base_and_candidate(awq_recipe):
    from quantize_serve.release.card import render_model_card, report_card_inputs
    from quantize_serve.validate.preflight import ValidatedRecipe

    validated = ValidatedRecipe(
        recipe=awq_recipe,
        source="recipes/tiny-llama-awq.yaml",
        recipe_sha256="0" * 64,
        calibration_fingerprint="2" * 64,
    )
    report = run_report(
        repo_id="org/m",
        candidate_sha=SHA["a"],
        run_id="r",
        regression=compare(results(kv_tokens=KV_8BIT), results()),
    )
    card = render_model_card(
        report_card_inputs(
            validated, report, status="rejected", rejection_reasons=["regression capacity: KV tokens"]
        )
    )
    assert "## Against production (base, production, candidate)" in card.text
    assert "| KV tokens | 6,016 | 14,464 | 13,696 | x0.9469 | >= x1.00 | **FAIL** |" in card.text


def test_a_token_pasted_into_the_reason_is_masked_on_the_card():
    from quantize_serve.release.card import scrub_secrets

    history = interpret(HUB, three_releases(), RECORDS.get)
    reason = scrub_secrets("rolled back by `HF_TOKEN=hf_abcdefghijklmnopqrstuvwx deploy`")
    text = note_rollback("# m\n", plan_rollback(history), at="now", reason=reason)
    assert "hf_abcdefghijklmnopqrstuvwx" not in text and "<redacted>" in text


def test_a_bad_repo_or_ref_is_one_screen_naming_the_field(capsys):
    from quantize_serve import cli

    assert cli.main(["releases", "notarepo"]) == 2
    err = capsys.readouterr().err
    assert "REPO = 'notarepo': not a Hub repo id" in err and "fix: write it as 'org/name'" in err
    assert cli.main(["rollback", "org/m", "--ref", "main"]) == 2
    assert "--ref = 'main'" in capsys.readouterr().err
