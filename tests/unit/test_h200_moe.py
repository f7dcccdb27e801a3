"""benchmarks/h200_moe.py without a GPU: a run's report read into the JSON (a real report of the tiny dense
flow on CPU, made by this driver with --recipe recipes/tiny-llama-awq.yaml), the targets it checks (the
experts on Marlin MoE, the release ref on the gated commit), and the refusal on a CPU host, where vLLM
serves no quantized mixture of experts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import h200_moe as hm
from benchmarks.evidence import kernel_report
from quantize_serve.serving.boot import Boot
from tests.conftest import ROOT, as_cpu_host
from tests.unit.test_moe import AVX512

# The tiny dense flow on the 2-core CPU machine (8 MiB budget), promoted: report.json as the run wrote it,
# its paths made relative (benchmarks/evidence.py portable_data), its vLLM logs left out (the tests write
# the lines).
REPORT = ROOT / "tests" / "fixtures" / "reports" / "tiny-llama-awq-cpu.json"
CPU_W4A16 = "(Worker pid=1) INFO [__init__.py:923] Using CPUWNA16LinearKernel for mixed-precision linear\n"
MARLIN_MOE = (
    "INFO [machete.py:60] Using MacheteLinearKernel for CompressedTensorsWNA16\n"
    "INFO [compressed_tensors_moe.py:120] Using CompressedTensorsWNA16MarlinMoEMethod\n"
)
TRITON_MOE = MARLIN_MOE.replace("WNA16MarlinMoEMethod", "WNA16MoEMethod")


def run_folder(tmp_path: Path, logs: dict[Boot, str]) -> Path:
    """A run folder as the flow leaves it: report.json and a vllm-<boot>.log per boot."""
    folder = tmp_path / "tiny-llama-awq-20261202-000000-00000000"
    folder.mkdir()
    shutil.copyfile(REPORT, folder / "report.json")
    for boot, text in logs.items():
        (folder / f"vllm-{boot}.log").write_text(text)
    return folder / "report.json"


def test_a_cpu_flow_report_reads_into_the_json(tmp_path):
    path = run_folder(
        tmp_path,
        {
            Boot.BASE: "INFO Using max model len 512\n",
            Boot.QUANTIZED_16BIT_KV: CPU_W4A16,
            Boot.PRODUCTION: CPU_W4A16,
        },
    )
    out = hm.read_report(path, platform="cpu")
    report = json.loads(REPORT.read_text())
    assert (out["decision"], out["release"]["status"]) == ("passed", "promoted")
    assert (
        out["release"]["commit_sha"] == report["release"]["commit_sha"]
        and out["release"]["ref"] == "production"
    )
    assert out["quantization"]["scheme"] == "W4A16_ASYM" and out["quantization"]["device"] == "cpu"
    assert out["report_dir"] == path.parent.name and out["recipe"] == "tiny-llama-awq"
    rows = out["capacity"]["rows"]
    assert [r["name"] for r in rows] == list(Boot)
    for row, config, check in zip(
        rows, report["capacity"]["configs"], report["capacity"]["planner"], strict=True
    ):
        assert row["kv_cache_tokens"] == config["kv_cache_tokens"] > 0
        assert row["planner_kv_tokens"] == check["predicted_kv_tokens"]
        assert row["planner_error_pct"] == check["error_pct"]
    assert out["capacity"]["fp8_token_ratio"] == report["capacity"]["fp8_token_ratio"]
    assert out["model"]["num_moe_layers"] == 0 and "dense" in out["model"]["summary"]
    assert out["kernels"][Boot.PRODUCTION]["kernels"] == ["CPUWNA16LinearKernel"]
    assert out["kernels"][Boot.PRODUCTION]["kernel_check"] == "passed"
    assert out["kernels"][Boot.BASE]["kernel_check"] is None  # the base has no scheme to check
    assert out["expected_moe_methods"] == [] and all(c["passed"] for c in out["accuracy"])
    assert out["reasons"] and all(": pass: " in r for r in out["reasons"])
    result = {**out, "state": "COMPLETED", "hub_tags": {"production": out["release"]["commit_sha"]}}
    assert hm.targets(result) == {
        "completed": True,
        "promoted": True,
        "release_ref_on_gated_commit": True,
        "kernel_check_passed": True,
        "experts_on_marlin_moe": None,
    }  # dense: no experts


def test_a_boot_without_its_log_is_read_as_such(tmp_path):
    out = hm.read_report(run_folder(tmp_path, {}), platform="cpu")
    assert all(k == {"log": None} for k in out["kernels"].values())
    assert (
        hm.targets({**out, "state": "COMPLETED"})["kernel_check_passed"] is False
    )  # nothing to check is no pass


def moe_result(production_log: str, **more) -> dict:
    """A finished MoE run as read_report gives it on an H200, with ``production_log`` as its fp8-KV boot's
    log."""
    kernels = {
        str(Boot.BASE): {
            "log": "vllm-base.log",
            **kernel_report("INFO Using TritonExperts\n", "bf16", "cuda-fp8"),
        },
        str(Boot.QUANTIZED_16BIT_KV): {
            "log": "vllm-w4a16.log",
            **kernel_report(MARLIN_MOE, "W4A16_ASYM", "cuda-fp8"),
        },
        str(Boot.PRODUCTION): {
            "log": "vllm-w4a16-fp8kv.log",
            **kernel_report(production_log, "W4A16_ASYM", "cuda-fp8"),
        },
    }
    return {
        "state": "COMPLETED",
        "model": {"num_moe_layers": 4},
        "release": {"status": "promoted", "ref": "production", "commit_sha": "c" * 40},
        "hub_tags": {"production": "c" * 40},
        "kernels": kernels,
        "expected_moe_methods": ["CompressedTensorsWNA16MarlinMoEMethod"],
        **more,
    }


def test_the_experts_must_be_on_marlin_moe_on_every_quantized_boot():
    assert hm.targets(moe_result(MARLIN_MOE)) == {
        "completed": True,
        "promoted": True,
        "release_ref_on_gated_commit": True,
        "kernel_check_passed": True,
        "experts_on_marlin_moe": True,
    }
    triton = hm.targets(moe_result(TRITON_MOE))  # vLLM's Triton WNA16 fallback on the production boot
    assert triton["experts_on_marlin_moe"] is False and triton["kernel_check_passed"] is False
    silent = hm.targets(moe_result("INFO Using MacheteLinearKernel for CompressedTensorsWNA16\n"))
    assert (
        silent["kernel_check_passed"] is True and silent["experts_on_marlin_moe"] is True
    )  # the other boot named it
    none_named = moe_result(MARLIN_MOE)
    for k in none_named["kernels"].values():
        k["moe_methods"] = []
    assert hm.targets(none_named)["experts_on_marlin_moe"] is False  # no MoE method logged: not proven


def test_a_run_that_did_not_end_promoted_on_the_gated_commit_misses_its_targets():
    moved = hm.targets(moe_result(MARLIN_MOE, hub_tags={"production": "d" * 40}))
    assert moved["release_ref_on_gated_commit"] is False and moved["promoted"] is True
    failed = hm.targets(
        moe_result(MARLIN_MOE, state="FAILED", release={"status": "rejected", "ref": "production"})
    )
    assert (failed["completed"], failed["promoted"], failed["release_ref_on_gated_commit"]) == (
        False,
        False,
        False,
    )


@pytest.fixture
def cpu_host_env(monkeypatch):
    """An AVX-512 CPU host and no GPU; the environment main() changes is given back afterwards."""
    from quantize_serve.core.settings import get_settings

    as_cpu_host(monkeypatch, AVX512)
    for key in ("QS_RUNS_DIR", "QS_WORK_DIR", "PREFECT_HOME", "PREFECT_API_URL"):
        monkeypatch.setenv(key, "unset-by-the-test")
    yield
    get_settings.cache_clear()


def test_on_a_cpu_host_the_moe_run_is_refused_before_anything_starts(tmp_path, cpu_host_env, capsys):
    out = tmp_path / "h200_moe.json"
    with pytest.raises(SystemExit) as refused:
        hm.main(["--out", str(out), "--work", str(tmp_path / "work")])
    assert refused.value.code == 2
    data = json.loads(out.read_text())
    assert (data["status"], data["device"], data["platform"], data["run_overrides"]) == (
        "refused before the run",
        "no GPU",
        "cpu",
        {},
    )
    assert data["refusal"].startswith("recipes/tiny-qwen3-moe-awq.yaml: 1 problem")
    assert '"No WNA16 MoE backend supports the deployment configuration"' in data["refusal"]
    assert "fix: run on a GPU host" in data["refusal"] and "Marlin MoE for W4A16" in data["refusal"]
    err = capsys.readouterr().err  # the same screen, printed in one line
    assert err.count("\n") == 1 and err.startswith("h200_moe.py: refused before the run (nothing started): ")
    assert " ".join(line.strip() for line in data["refusal"].splitlines()) in err
    assert not (tmp_path / "work" / "runs").exists() and "versions" not in data  # nothing started


def test_more_overrides_are_dotted_keys_with_yaml_values():
    assert hm.parse_sets(
        ["quantization.scheme=W4A16", "serve.max_num_seqs=8", "serve.memory_budget=null"]
    ) == {"quantization.scheme": "W4A16", "serve.max_num_seqs": 8, "serve.memory_budget": None}
    with pytest.raises(SystemExit, match="expected KEY=VALUE"):
        hm.parse_sets(["quantization.scheme"])
