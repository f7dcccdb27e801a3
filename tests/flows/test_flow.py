"""The flow end to end through a real Prefect server and process worker, deployed from
prefect.yaml, publishing to the local Hub endpoint: the promotion path (one promoted run, read by
the tests below), the rejection path and a cancel from the UI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from quantize_serve.report.steps import RunSteps
from quantize_serve.serving.server import INSPECTED, PREPARED_MARK
from scripts.local_stack import local_stack
from tests.conftest import ROOT

pytestmark = [pytest.mark.w4a16_serving, pytest.mark.fp8_kv_serving]  # the tiny-awq deployment as shipped
TOKEN = "hf_flowtest_local_token_0123456789"
HUB_BASE, HUB_CHATS = "meta-llama/tiny-llama-private", "HuggingFaceH4/ultrachat_200k"
APPROVAL = {"approve": True, "reviewer": "ana", "note": "looks good"}
REPO = "quantize-serve/tiny-llama-awq-w4a16"  # the tiny-awq deployment's repo: every release below goes there
W8A8 = {
    "quantization.method": "smoothquant-gptq",
    "quantization.scheme": "W8A8",
    "quantization.kv_cache_scales": False,
}
# The runs to REPO measure accuracy on one task, the same for all of them (so each compares with the
# figures production recorded): their subjects are the deployment, the Hub inputs, the sign-off and
# the regression gate. The shipped task list runs in the harmful run below, in `make demo` and in
# tests/engines/test_accuracy.py.
ONE_TASK = {"gates.accuracy.tasks": [{"task": "../evals/tasks/qs_heldout_ppl.yaml", "limit": 20}]}
# What "no worse than production" means for the releases after the first (a recipe's gates.regression):
# throughput is not compared, since two runs on one 2-core CPU shared by the suite's two lanes differed
# 4x (426 vs 96 output tok/s), and INT8 and 4-bit weights differ by a few percent in perplexity; the
# subject is capacity, which vLLM reports exactly.
NO_WORSE = {"gates.regression.min_throughput_ratio": None, "gates.regression.max_accuracy_drop": 0.05}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, awq_checkpoint):  # the checkpoint fixture warms the shared cache
    """The runs take a GPU host's work-ahead paths (QS_AHEAD_AS_ON_GPU: the calibration count started as the
    run validates, counted before the base boots), which CPU hosts otherwise never take."""
    home = tmp_path_factory.mktemp("stack")
    runs = home / "runs"
    env = {"QS_RUNS_DIR": str(runs), "QS_AHEAD_AS_ON_GPU": "true"}
    with local_stack(home, hub_token=TOKEN, extra_env=env) as s:
        s.runs = runs
        yield s


def release(stack, overrides: dict, **kwargs) -> SimpleNamespace:
    """One run of the tiny-awq deployment with these overrides; its exit code, output, id and report."""
    rc, output, run_id = stack.run_deployment(
        "tiny-awq", params={"overrides": json.dumps(overrides)}, **kwargs
    )
    found = list(stack.runs.glob(f"*-{(run_id or 'none')[:8]}/report.json"))
    return SimpleNamespace(
        rc=rc, output=output, run_id=run_id, report=json.loads(found[0].read_text()) if found else None
    )


@pytest.fixture(scope="module")
def first_release(stack):
    """The repo's first release: INT8 W8A8 (the regression gate is off: nothing in production yet), its
    row (b) booted, which the later W8A8 release of this base reuses."""
    return release(stack, {**W8A8, **ONE_TASK, "serve.sixteen_bit_kv_row": "boot"})


@pytest.fixture(scope="module")
def promoted(stack, first_release):
    """The one promoted run, read by several tests: the shipped deployment (`tiny-awq`) run as a
    release process runs it, with production's inputs (a private base model and an UltraChat-shaped
    chat dataset for calibration, from the Hub, so it quantizes) and a reviewer's sign-off
    (``approval: manual``), given as the run's ``overrides`` parameter; the run's job variables turn
    the datasets library online (the deployment as shipped is offline). It is the repo's second
    release: AWQ W4A16, compared with the W8A8 release in production, holds more KV tokens."""
    from huggingface_hub import HfApi

    from localhub.client import hub_client_env
    from localhub.datasets import publish_ultrachat

    with hub_client_env(stack.hub_endpoint, cache_dir=stack.home / "publish-cache"):
        api = HfApi(endpoint=stack.hub_endpoint, token=TOKEN)
        api.create_repo(HUB_BASE, private=True, exist_ok=True)
        base_sha = api.upload_folder(repo_id=HUB_BASE, folder_path=ROOT / "models" / "tiny-llama").oid
        publish_ultrachat(api, repo_id=HUB_CHATS, train_sft=128, test_sft=8)
    overrides = {
        "approval": "manual",
        "model.id": HUB_BASE,
        "calibration.dataset": HUB_CHATS,
        "calibration.split": "train_sft",
        "calibration.messages_field": "messages",
        "calibration.text_field": None,
        **ONE_TASK,
        **NO_WORSE,
        "calibration.beside_base": "always",  # as on a GPU host: quantized beside the base's scoring
    }
    reviewer: dict = {}
    answering = threading.Thread(
        target=lambda: reviewer.update(run=approve_when_paused(stack, APPROVAL)), daemon=True
    )
    answering.start()
    online = {
        "env": {"HF_HUB_DISABLE_XET": "1", "HF_DATASETS_OFFLINE": "0"}
    }  # the deployment's env, datasets online
    run = release(stack, overrides, job_variables=online)
    answering.join(timeout=60)
    run.base_sha, run.paused = base_sha, reviewer.get("run")
    return run


@pytest.fixture(scope="module")
def fewer_kv_tokens(stack, promoted):
    """A third release: INT8 W8A8 again (its checkpoint is the first release's), whose larger weights
    leave fewer KV tokens in the same budget than the AWQ release now in production. Its throughput is
    compared, at the lowest limit a recipe takes, with production's recorded as no host serves it (as if
    measured on a faster day of the same hardware): production is served again for its throughput alone."""
    sha = promoted_report(stack, promoted)["release"]["commit_sha"]
    with recorded_throughput(stack, sha, UNREACHABLE_TOK_S):
        return release(stack, {**W8A8, **ONE_TASK, **NO_WORSE, "gates.regression.min_throughput_ratio": 0.1})


UNREACHABLE_TOK_S = 1e9


@contextmanager
def recorded_throughput(stack, sha: str, tok_s: float):
    """Production's ``release-results.json`` at ``sha`` says ``tok_s`` output tokens a second until the block
    ends: the local Hub's stored commit rewritten in place (it keeps its id), and the copy the session's
    Hub cache may hold of it dropped (a commit's files are read from the cache without asking the Hub)."""
    from huggingface_hub import constants

    from localhub.server import Store

    store = Store(stack.home / "hub")
    path = store.repo_dir(REPO) / "commits" / f"{sha}.json"
    cached = Path(constants.HF_HUB_CACHE) / f"models--{REPO.replace('/', '--')}" / "snapshots" / sha
    original = path.read_text()
    commit = json.loads(original)
    record = json.loads(store.blob_path(commit["tree"]["release-results.json"]["sha256"]).read_bytes())
    record["results"]["output_throughput"] = tok_s
    commit["tree"]["release-results.json"] = store._entry(json.dumps(record).encode(), lfs=False)
    (cached / "release-results.json").unlink(missing_ok=True)
    path.write_text(json.dumps(commit))
    try:
        yield
    finally:
        path.write_text(original)
        (cached / "release-results.json").unlink(missing_ok=True)


def approve_when_paused(stack, answer: dict, timeout_s: float = 900):
    """What a reviewer does in the UI: wait for the run to pause at the sign-off form, then answer it.
    The paused run (None if none paused in time)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.flow_runs import resume_flow_run
    from prefect.settings import PREFECT_API_URL, temporary_settings

    paused = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with client_for(stack) as client:
            runs = client.read_flow_runs(flow_run_filter=paused)
        if runs:
            with temporary_settings({PREFECT_API_URL: stack.api_url}):
                resume_flow_run(runs[0].id, run_input=answer)
            return runs[0]
        time.sleep(1)
    return None


def reports(runs: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runs.glob(f"{name}-*/report.json"))]


def promoted_report(stack, promoted) -> dict:
    (path,) = stack.runs.glob(f"*-{promoted.run_id[:8]}/report.json")
    return json.loads(path.read_text())


@contextmanager
def client_for(stack):
    """A Prefect client of the stack's server (not the test session's own API)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        yield client


def release_events(stack, kind: str) -> list:
    from prefect.events.filters import EventFilter, EventNameFilter

    with client_for(stack) as client:
        for _ in range(30):
            page = client.read_events(
                filter=EventFilter(event=EventNameFilter(name=[f"quantize-serve.release.{kind}"])), limit=50
            )
            if page.events:
                return page.events
            time.sleep(1)
    return []


def hub_online():
    """huggingface_hub online in this process (the session runs offline; the stack's Hub is loopback)."""
    from unittest import mock

    from huggingface_hub import constants

    return mock.patch.object(constants, "HF_HUB_OFFLINE", False)


def hub_file(stack, repo_id: str, filename: str, revision: str) -> str:
    from huggingface_hub import hf_hub_download

    with hub_online():
        return Path(
            hf_hub_download(
                repo_id,
                filename,
                revision=revision,
                endpoint=stack.hub_endpoint,
                token=TOKEN,
                cache_dir=stack.runs.parent / "hub-downloads",
            )
        ).read_text()


def hub_tags(stack, repo_id: str) -> dict[str, str]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=stack.hub_endpoint, token=TOKEN)
    with hub_online():
        return {t.name: t.target_commit for t in api.list_repo_refs(repo_id).tags}


def hub_repo(stack, repo_id: str) -> dict:
    """The stack's Hub record of a repo: its tags (with the message each was made with) and commits."""
    return json.loads((stack.home / "hub" / "models" / repo_id / "repo.json").read_text())


def test_deployment_run_promotes(promoted, stack):
    rc, output, run_id = promoted.rc, promoted.output, promoted.run_id
    assert rc == 0, output[-5000:]
    assert TOKEN not in output

    with client_for(stack) as client:
        run = client.read_flow_run(run_id)
        assert run.state.is_completed()
        artifacts = [a for a in client.read_artifacts() if a.flow_run_id == run.id]
    writes = Counter(a.key for a in artifacts)
    keys = set(writes)
    for suffix in (
        "report",
        "decision",
        "capacity",
        "accuracy",
        "stress",
        "hub-revision",
        "progress",
        "steps",  # what the run does and why (report/steps.py)
        "pending-approval",
    ):  # pending-approval: the report the reviewer read
        assert f"tiny-llama-awq-{suffix}" in keys, keys
    assert set(writes.values()) == {1}, writes  # each key once per run: the final report, no draft
    report_md = next(a.data for a in artifacts if a.key == "tiny-llama-awq-report")
    assert "![capacity](data:image/png;base64," in report_md  # the chart shows in the UI

    report = promoted_report(stack, promoted)
    folder = Path(report["report_dir"])
    assert {"report.json", "report.md", "capacity.png"} <= {p.name for p in folder.iterdir()}
    # the production boot's vLLM process started while the device was busy before; row (b) derived from it
    assert PREPARED_MARK in (folder / "vllm-w4a16-fp8kv.log").read_text()
    # no stored reference names this Hub base, so the base's boot started as the run did (report/steps.py
    # boots_base_first), and had vLLM's model info of its architecture before vLLM's server ran (the
    # pipeline's "$ ..." line may come before either: it is written as the boot starts)
    base_log = (folder / "vllm-base.log").read_text()
    inspected = f"(quantize-serve: vLLM's model info of LlamaForCausalLM {INSPECTED})"
    order = [base_log.find(line) for line in (PREPARED_MARK, inspected, "Resolved architecture")]
    assert -1 < order[0] < order[1] < order[2], base_log[:3000]
    assert not (folder / "vllm-w4a16.log").exists() and not report["steps"]["sixteen_bit_kv_reused_from"]
    rows = {r["name"]: r for r in report["capacity"]["configs"]}
    assert rows["w4a16"]["derived"].startswith("derived from the production boot"), rows["w4a16"]
    assert "not booted: that boot's" in rows["w4a16"]["derived"]
    assert rows["w4a16"]["num_blocks"] == rows["w4a16-fp8kv"]["num_blocks"] // 2  # 16-bit: twice the bytes
    assert "w4a16: derived from the production boot" in report_md
    assert report["decision"]["passed"] and report["release"]["status"] == "promoted"
    assert hub_tags(stack, REPO)["production"] == report["release"]["commit_sha"]  # (file order: the first)
    # serve-profile.yaml pins the KV cache the gates validated: the fp8 boot's blocks x 128 tokens x
    # 512 bytes (2 x 4 layers x 2 KV heads x 32 dims x 1 byte); it ships with the promoted card
    fp8 = next(c for c in report["capacity"]["configs"] if c["name"] == "w4a16-fp8kv")
    profile = yaml.safe_load((folder / "serve-profile.yaml").read_text())
    assert (
        profile["kv-cache-memory-bytes"]
        == fp8["num_blocks"] * 128 * 512
        == report["serving_profile"]["kv_cache_memory_bytes"]
    )
    assert profile["model"] == "quantize-serve/tiny-llama-awq-w4a16" and profile["max-num-seqs"] == 16
    assert f"--kv-cache-memory-bytes {profile['kv-cache-memory-bytes']} " in report["serving_command"]
    assert (
        hub_file(
            stack,
            "quantize-serve/tiny-llama-awq-w4a16",
            "serve-profile.yaml",
            report["release"]["commit_sha"],
        )
        == (folder / "serve-profile.yaml").read_text()
    )
    # production serves the release ref (the gated commit), not main's head; (c) was booted at the same
    # revision, so production's first boot here reads the compile-cache entry (c) wrote
    assert profile["revision"] == "production" and " --revision production " in report["serving_command"]
    assert "revision=production" in (folder / "vllm-w4a16-fp8kv.log").read_text()
    assert " --revision production " in hub_file(stack, REPO, "README.md", report["release"]["commit_sha"])
    for path in folder.rglob("*"):
        if path.is_file() and path.suffix in {".md", ".json", ".log", ".txt"}:
            assert TOKEN not in path.read_text(errors="replace"), path
    assert release_events(stack, "promoted")


def test_a_first_release_quantizes_beside_the_base_accuracy_run(promoted, stack):
    """calibration.beside_base (auto on a GPU host; always here): the base boots first, and once its
    capacity is read the checkpoint is quantized while the base's accuracy is scored."""
    report = promoted_report(stack, promoted)
    steps = RunSteps.model_validate(report["steps"])
    assert steps.quantized_beside_base and steps.first_boot == "base", steps
    beside = steps.step("quantize").why
    assert beside.startswith("calibration.beside_base is always"), steps
    # counted in the flow's thread after the count's work ahead (QS_AHEAD_AS_ON_GPU), as on a GPU host
    assert re.search(r"\(\d[\d,]* calibration tokens\)$", beside), steps
    # the quantization worker, started as the run validated, had done its imports (tasks/quantize.py); a
    # second local suite reuses the first's checkpoint (.cache/test-work, tests/conftest.py): nothing to time
    assert report["checkpoint"]["imports_ahead"] or report["checkpoint"]["cached"], report["checkpoint"]
    assert "beside the base's accuracy run" in (Path(report["report_dir"]) / "report.md").read_text()
    with client_for(stack) as client:
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[promoted.run_id]))
        )

    def first(name: str):  # the run's first task run of that task (the base's, for the boots' tasks)
        return min((t for t in tasks if t.name.startswith(name + "-")), key=lambda t: t.start_time)

    quantize, base_capacity, base_accuracy = (
        first("quantize-model"),
        first("measure-capacity"),
        first("run-accuracy"),
    )
    assert base_capacity.end_time <= quantize.start_time < base_accuracy.end_time, (
        base_capacity.end_time,
        quantize.start_time,
        base_accuracy.end_time,
    )


def test_the_reviewer_approved_the_release_from_hub_inputs(promoted, stack):
    """Production's shape: a private Hub base model (read with the token) and a Hub chat dataset for
    calibration; the run paused for sign-off and the reviewer's approval promoted it. (The reviewer
    rejecting: tests/flows/test_approval.py::test_full_flow_rejected_by_the_reviewer_promotes_nothing.)"""
    assert promoted.paused, f"the run never paused for sign-off: {promoted.output[-3000:]}"
    assert promoted.paused.state.state_details.run_input_keyset, "paused without the sign-off form"
    report = promoted_report(stack, promoted)
    assert report["base"]["repo_id"] == HUB_BASE and report["base"]["sha"] == promoted.base_sha
    assert report["overrides"]["calibration.dataset"] == HUB_CHATS
    assert not (ROOT / "None").exists() and not (stack.runs / "None").exists()  # no path made of a None
    assert report["decision"]["passed"] and report["approval_note"] == APPROVAL["note"]
    rel = report["release"]
    assert rel["status"] == "promoted" and rel["approved_by"] == "ana" and rel["ref"] == "production"
    assert rel["candidate_sha"] == report["candidate"]["commit_sha"]
    # the release tag points at the gated card commit made on top of the pushed candidate
    assert rel["commit_sha"] != rel["candidate_sha"]
    commit = json.loads(
        (stack.home / "hub" / "models" / REPO / "commits" / f"{rel['commit_sha']}.json").read_text()
    )
    assert commit["parent"] == rel["candidate_sha"]
    assert hub_file(
        stack, REPO, "release-results.json", rel["commit_sha"]
    )  # what later releases compare with


def test_the_first_release_has_no_regression_gate_and_the_second_is_compared_with_it(
    first_release, promoted, stack
):
    """The W8A8 release was the first (the gate off, one `off` row); the AWQ release after it holds
    more KV tokens than that production release's recorded figures, passes and is promoted."""
    first, second = first_release.report, promoted_report(stack, promoted)
    assert first_release.rc == 0, first_release.output[-3000:]
    assert first["release"]["status"] == "promoted" and first["regression"]["off"]
    assert [c["check"] for c in first["decision"]["checks"]].count("regression") == 1
    regression = second["regression"]
    assert (
        regression["source"] == "recorded" and regression["production_sha"] == first["release"]["commit_sha"]
    )
    capacity = {r["measure"]: r for r in regression["rows"] if r["kind"] == "capacity"}
    kv = next(r for name, r in capacity.items() if "KV tokens" in name)
    assert kv["candidate"] > kv["production"] and kv["passed"]  # 4-bit weights leave more of the budget
    assert all(c["passed"] for c in second["decision"]["checks"] if c["check"].startswith("regression"))
    assert not (Path(second["report_dir"]) / "production-release").exists()  # recorded figures: no 4th boot


def test_a_release_that_beats_its_base_but_loses_to_production_on_capacity_is_rejected(
    fewer_kv_tokens, promoted, first_release, stack
):
    report, checks = fewer_kv_tokens.report, fewer_kv_tokens.report["decision"]["checks"]
    assert fewer_kv_tokens.rc != 0 and report["release"]["status"] == "rejected"
    accuracy = [c for c in checks if c["check"].startswith("accuracy ")]
    assert accuracy and all(c["passed"] for c in accuracy), accuracy  # it beats its base model
    failed = [c for c in checks if not c["passed"]]
    assert failed[0]["check"] == "regression capacity", failed
    assert "KV tokens: candidate" in failed[0]["reason"] and "vs production" in failed[0]["reason"]
    # throughput below production's recorded figure is no regression until production, served again on this
    # host, is faster too; whether W8A8 is, on a shared 2-core CPU, this test does not assert (limit 0.1)
    assert {c["check"] for c in failed[1:]} <= {"regression throughput"}, failed
    regression = report["regression"]
    assert regression["source"] == "recorded, throughput served again"
    (why,) = regression["differences"]
    assert "of production's recorded 1,000,000,000, below 0.10" in why
    throughput = next(r for r in regression["rows"] if r["kind"] == "throughput")
    assert 0 < throughput["production"] < UNREACHABLE_TOK_S  # measured again, not the recorded figure
    kv = next(r for r in regression["rows"] if r["measure"] == "KV tokens")
    assert kv["production"] == promoted_report(stack, promoted)["results"]["kv_cache_tokens"]  # recorded
    again = Path(report["report_dir"]) / "production-release"
    assert (again / "stress").is_dir() and not (again / "accuracy").exists()  # its throughput alone
    assert report["regression"]["production_sha"] == promoted_report(stack, promoted)["release"]["commit_sha"]
    # the first release's base, tasks, serve settings, vLLM and host: the base's figures are reused, not
    # measured
    reused_from = report["steps"]["base_reused_from"]
    assert reused_from and not (Path(report["report_dir"]) / "vllm-base.log").exists()
    # the production boot came first: its process inspected the architecture while the run quantized
    assert INSPECTED in (Path(report["report_dir"]) / "vllm-w8a8-fp8kv.log").read_text()
    # and W8A8 on this base was measured with 16-bit KV by the first release: row (b) is that run's, no boot
    first_run = first_release.report["run_id"]
    assert report["steps"]["sixteen_bit_kv_reused_from"] == first_run
    assert PREPARED_MARK in (Path(first_release.report["report_dir"]) / "vllm-w8a8.log").read_text()
    assert not (Path(report["report_dir"]) / "vllm-w8a8.log").exists()
    rows = {r["name"]: r for r in report["capacity"]["configs"]}
    first_rows = {r["name"]: r for r in first_release.report["capacity"]["configs"]}
    assert rows["w4a16"]["kv_cache_tokens"] == first_rows["w4a16"]["kv_cache_tokens"]  # row (b), by its Boot
    markdown = (Path(report["report_dir"]) / "report.md").read_text()
    assert f"reused from run `{reused_from}`" in markdown
    assert f"Row `w8a8` (16-bit KV) is reused from run `{first_run}`" in markdown
    tags = hub_tags(stack, REPO)
    assert tags[report["release"]["rejection_tag"]] == report["release"]["candidate_sha"]
    assert tags["production"] == report["regression"]["production_sha"]  # production did not move
    side_by_side = "| measure | base | production | candidate | candidate vs production | limit | result |"
    assert side_by_side in (Path(report["report_dir"]) / "report.md").read_text()
    assert side_by_side in hub_file(stack, REPO, "README.md", "main")  # the rejected card


def test_rollback_goes_back_and_forth_and_refuses_a_rejected_commit(
    first_release, promoted, fewer_kv_tokens, stack
):
    """`quantize-serve rollback` puts the first release back, is idempotent, goes forward again with
    --to and refuses the rejected W8A8 candidate; `quantize-serve releases` shows all three."""
    first, second = (
        first_release.report["release"]["commit_sha"],
        promoted_report(stack, promoted)["release"]["commit_sha"],
    )
    rejected = fewer_kv_tokens.report["release"]["candidate_sha"]
    assert hub_tags(stack, REPO)["production"] == second

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(Path(sys.executable).parent / "quantize-serve"), *args],
            cwd=ROOT,
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    back = cli("rollback", REPO)
    assert back.returncode == 0, back.stdout + back.stderr
    assert hub_tags(stack, REPO)["production"] == first
    assert cli("rollback", REPO, "--to", first).returncode == 0  # idempotent
    assert hub_tags(stack, REPO)["production"] == first
    assert release_events(stack, "rolled-back")
    forward = cli("rollback", REPO, "--to", second)
    assert forward.returncode == 0 and hub_tags(stack, REPO)["production"] == second
    refused = cli("rollback", REPO, "--to", rejected)
    assert refused.returncode == 2 and "rejected" in refused.stdout + refused.stderr
    assert hub_tags(stack, REPO)["production"] == second
    history = cli("releases", REPO)
    assert history.returncode == 0
    for sha in (first, second, rejected):
        assert sha[:12] in history.stdout, history.stdout
    assert TOKEN not in back.stdout + back.stderr + history.stdout + refused.stdout + refused.stderr


def test_a_harmful_quantization_is_rejected_on_its_own_and_moves_nothing(stack):
    """recipes/tiny-llama-sparse-gptq.yaml (50% SparseGPT, then GPTQ W4A16: a real llm-compressor
    recipe that vLLM serves) fails the accuracy gate at the default error rates, on held-out
    perplexity (bits per byte: recovery about 0.88 on the log scale); its rates are untouched, and the run
    measures that task alone (the recipe's whole task list runs in tests/engines/test_accuracy.py and `make
    demo`). The run fails, `production` is not created, and the candidate is tagged `rejected-<sha>` with the
    reasons (README: what a rejection looks like)."""
    recipe = ROOT / "recipes/tiny-llama-sparse-gptq.yaml"
    perplexity = {"gates.accuracy.tasks": [{"task": "../evals/tasks/qs_heldout_ppl.yaml"}]}
    rc, output, run_id = stack.run_deployment(
        "tiny-awq", params={"recipe": str(recipe), "overrides": json.dumps(perplexity)}
    )
    assert rc != 0, "a rejected release must fail the run"
    (report,) = reports(stack.runs, "tiny-llama-sparse-gptq")
    assert not report["decision"]["passed"] and report["release"]["status"] == "rejected"
    failed = {c["check"]: c["reason"] for c in report["decision"]["checks"] if not c["passed"]}
    ppl = "accuracy qs_heldout_ppl bits_per_byte"  # the decision names a task by its lm-eval name
    assert ppl in failed and "not shown above 0.93" in failed[ppl] and "nats (log scale)" in failed[ppl]
    assert all(c["threshold"] == 0.93 for c in report["accuracy"])  # the defaults, untouched
    assert all(c["passed"] for c in report["decision"]["checks"] if c["check"] == "stress")
    tags = hub_tags(stack, "quantize-serve/tiny-llama-sparse-gptq-w4a16")
    assert "production" not in tags
    assert tags[report["release"]["rejection_tag"]] == report["release"]["candidate_sha"]
    events = release_events(stack, "rejected")
    assert events and any("bits_per_byte" in json.dumps(e.payload) for e in events)


def run_vllm_processes(stack) -> list:
    """Live vLLM processes booted by flow runs of this stack (their logs lie under its runs folder)."""
    from tests.conftest import vllm_processes_of

    found = []
    for p in vllm_processes_of():
        try:
            if p.environ().get("QS_SERVER_LOG", "").startswith(str(stack.runs)):
                found.append(p)
        except Exception:  # noqa: BLE001 - it ended while we looked
            continue
    return found


@pytest.mark.timeout(600)
def test_cancel_from_the_ui_stops_vllm_and_promotes_nothing(stack):
    """Fault matrix (see tests/engines/test_faults.py): the run is cancelled from the UI while vLLM serves.

    The UI's Cancel sets the run's state to Cancelling; the worker then stops the run's process,
    whose vLLM server must go with it. Nothing is promoted and the `gpu` slot is given back.
    """
    import threading

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    repo = "quantize-serve/tiny-llama-awq-w4a16"
    try:
        release_before = hub_tags(stack, repo).get("production")
    except Exception:  # noqa: BLE001 - run alone: the repo does not exist yet
        release_before = None
    outcome: dict = {}
    runner = threading.Thread(
        target=lambda: outcome.update(
            zip(("rc", "output", "run_id"), stack.run_deployment("tiny-awq", timeout=540))
        ),
        daemon=True,
    )
    started = time.monotonic()
    runner.start()

    def booting_now() -> list:  # a boot under way, not a process only prepared ahead of its boot
        found = []
        for p in run_vllm_processes(stack):
            try:
                if "--served-model-name" in Path(p.environ()["QS_SERVER_LOG"]).read_text(errors="replace"):
                    found.append(p)
            except Exception:  # noqa: BLE001 - it ended while we looked
                continue
        return found

    while runner.is_alive() and not booting_now() and time.monotonic() - started < 400:
        time.sleep(0.5)
    booting = booting_now()
    assert booting, f"no vLLM process of the run appeared: {outcome.get('output', '')[-3000:]}"
    seen, vllm_log = time.monotonic(), Path(booting[0].environ()["QS_SERVER_LOG"])

    with client_for(stack) as client:
        running = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))
            )
        )
        assert len(running) == 1, running
        run_id = running[0].id
        client.set_flow_run_state(run_id, Cancelling())  # what the UI's Cancel button sends
        cancelled = time.monotonic()
        runner.join(timeout=300)
        assert not runner.is_alive(), "the cancelled run did not end"
        state = client.read_flow_run(run_id).state
    while run_vllm_processes(stack) and time.monotonic() - cancelled < 60:
        time.sleep(0.5)
    left = run_vllm_processes(stack)
    print(
        f"vLLM ({vllm_log.relative_to(stack.runs)}) seen {seen - started:.0f} s after the start; run ended "
        f"{time.monotonic() - cancelled:.0f} s after the cancel; state {state.type.value}"
    )

    assert state.is_cancelled(), f"{state.type}: {state.message}"
    assert outcome["rc"] != 0 and TOKEN not in outcome["output"]
    assert not left, f"vLLM processes of the cancelled run survived: {[p.pid for p in left]}"
    assert hub_tags(stack, repo).get("production") == release_before  # nothing promoted
    with client_for(stack) as client:
        deadline = time.monotonic() + 30
        while (
            slots := client.read_global_concurrency_limit_by_name("gpu").active_slots
        ) and time.monotonic() < deadline:
            time.sleep(1)
    assert slots == 0, "the cancelled run still holds the `gpu` slot: the next run would wait for it"
