"""The release-time benchmark's choice of runs: a session that cannot hold all three measures some,
and a re-release never runs without the first release it re-releases."""

from __future__ import annotations

import pytest

from benchmarks import h200_release_time as release_time


@pytest.mark.parametrize(("runs", "message"), [
    ("re_release", "re_release needs first_release in the same invocation"),
    ("baseline,bogus", "--runs: unknown bogus"),
])
def test_runs_that_cannot_be_measured_are_refused_before_anything_starts(runs, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(release_time, "cmd_run", lambda args: pytest.fail("the run must not start"))
    with pytest.raises(SystemExit) as exit_info:
        release_time.main(["--cpu-smoke", "--state", str(tmp_path), "--out", str(tmp_path / "out.json"), "--runs", runs])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_session_may_measure_the_baseline_alone_or_the_two_releases(tmp_path, monkeypatch):
    picked = []
    monkeypatch.setattr(release_time, "cmd_run", lambda args: picked.append(args.runs))
    for runs in ("baseline", "first_release,re_release", None):
        extra = ["--runs", runs] if runs else []
        release_time.main(["--cpu-smoke", "--state", str(tmp_path), "--out", str(tmp_path / "o.json"), *extra])
    assert picked == [["baseline"], ["first_release", "re_release"], list(release_time.RUNS)]
