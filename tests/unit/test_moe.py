"""Mixtures of experts before any heavy work: the group size against the experts' width, the router
gates kept out of quantization, a quantized MoE refused on a CPU host with vLLM CPU's own reason (at
validation, before quantizing), total and active parameters in the capacity table and the report, and
the production Qwen3-30B-A3B recipe checked offline against its config.json. The host is given, not
read (no GPU, an AVX-512 CPU: where the AVX2 rule has nothing to say and the MoE rule alone speaks)."""

from __future__ import annotations

import json

import pytest

from quantize_serve.capacity.measure import summarize_capacity
from quantize_serve.capacity.model_shape import ModelShape
from quantize_serve.capacity.plan_table import ModelSummary
from quantize_serve.cli import main
from quantize_serve.core.errors import RecipeError
from quantize_serve.recipe.inputs import check_model_config
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving import gpu
from quantize_serve.serving.host import CPU_MOE_REFUSALS
from quantize_serve.validate import preflight
from quantize_serve.validate.preflight import check_serving_host, validate_recipe
from tests.conftest import AVX2_ONLY, ROOT, as_cpu_host, safetensors_tensors
from tests.unit.test_cpu_support import capacity_row

TINY_MOE = ROOT / "recipes" / "tiny-qwen3-moe-awq.yaml"
QWEN3_30B = ROOT / "recipes" / "qwen3-30b-a3b-awq.yaml"
MOE_DIR = ROOT / "models" / "tiny-qwen3-moe"
FIXTURE_30B = ROOT / "tests" / "fixtures" / "configs" / "qwen3-30b-a3b.json"
AVX512 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512dq", "avx512vl"}


@pytest.fixture
def cpu_host(monkeypatch):
    """An AVX-512 x86 CPU and no GPU (this suite's usual machine, whatever runs it)."""
    as_cpu_host(monkeypatch, AVX512)


@pytest.fixture
def gpu_host(monkeypatch):
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: 80 * 2**30)


def test_the_group_size_must_divide_the_experts_width_before_anything_runs():
    """moe_intermediate_size 128 (each expert's down_proj input): group 256 cannot split it."""
    with pytest.raises(RecipeError) as info:
        validate_recipe(TINY_MOE, {"quantization.group_size": 256})
    e = info.value
    assert (e.field, e.value) == ("quantization.group_size", 256)
    assert "moe_intermediate_size=128" in str(
        e
    ) and "Fix: use a group size that divides them: [32, 64, 128]" in str(e)
    assert validate_recipe(TINY_MOE, {"quantization.group_size": 64}).recipe.quantization.group_size == 64


def test_the_router_gates_must_be_left_out_of_quantization():
    with pytest.raises(RecipeError) as info:
        validate_recipe(TINY_MOE, {"quantization.ignore": ["lm_head"]})
    e = info.value
    assert (e.field, e.value) == ("quantization.ignore", ["lm_head"])
    assert "model.layers.0.mlp.gate" in str(e) and "Fix: add 're:.*mlp.gate$' to quantization.ignore" in str(
        e
    )
    # Qwen2-MoE's shared expert has a one-output gate of its own: both are asked for
    shared = {**json.loads(FIXTURE_30B.read_text()), "shared_expert_intermediate_size": 5632}
    with pytest.raises(RecipeError, match=r"add 're:\.\*mlp\.gate\$', 're:\.\*shared_expert_gate\$'"):
        check_model_config(
            load_recipe(TINY_MOE, {"quantization.ignore": ["lm_head"]}), shared, source="r.yaml"
        )


@pytest.mark.parametrize(
    "method, scheme",
    [("awq", "W4A16_ASYM"), ("gptq", "W4A16"), ("smoothquant-gptq", "W8A8"), ("rtn", "FP8_DYNAMIC")],
)
def test_a_quantized_moe_on_a_cpu_stops_at_validation_with_vllms_reason(cpu_host, method, scheme):
    recipe = load_recipe(TINY_MOE, {"quantization.method": method, "quantization.scheme": scheme})
    with pytest.raises(RecipeError) as info:
        check_serving_host(recipe, source="r.yaml")
    e = info.value
    assert e.field == "quantization" and f"{scheme} mixture of experts" in str(e.value)
    assert f'"{CPU_MOE_REFUSALS[scheme]}"' in str(
        e
    ) and "serves a mixture of experts only unquantized" in str(e)
    assert "Fix: run on a GPU host" in str(e)


def test_the_same_runs_pass_on_a_gpu_host_and_a_dense_model_on_the_cpu(cpu_host, gpu_host):
    check_serving_host(load_recipe(TINY_MOE), source="r.yaml")  # gpu_host comes second: it wins
    check_serving_host(load_recipe(QWEN3_30B), source="r.yaml")  # nothing fetched: no GPU rule applies


def test_a_dense_model_on_the_same_cpu_passes(cpu_host):
    check_serving_host(load_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml"), source="r.yaml")


def test_a_hub_moe_is_recognised_from_its_config_json(cpu_host, monkeypatch):
    fetched = []
    monkeypatch.setattr(
        preflight,
        "fetch_model_config",
        lambda repo, **kw: fetched.append(repo) or json.loads(FIXTURE_30B.read_text()),
    )
    with pytest.raises(RecipeError, match="No WNA16 MoE backend supports the deployment configuration"):
        check_serving_host(load_recipe(QWEN3_30B), source="r.yaml")
    assert fetched == ["Qwen/Qwen3-30B-A3B"]


def test_quantize_serve_run_stops_before_prefect_with_the_reason(cpu_host, capsys):
    rc = main(["run", str(TINY_MOE)])
    text = capsys.readouterr()
    text = text.out + text.err
    assert rc == 2 and "Traceback" not in text, text
    assert (
        "No WNA16 MoE backend supports the deployment configuration" in text and "run on a GPU host" in text
    )


def test_the_qwen3_30b_recipe_checks_offline_against_its_config():
    """The recipe cannot download Qwen/Qwen3-30B-A3B here: its config.json is the fixture's (the Hub's)."""
    recipe = load_recipe(QWEN3_30B)
    config = json.loads(FIXTURE_30B.read_text())
    check_model_config(
        recipe, config, source=str(QWEN3_30B)
    )  # group 128 | 768, routers ignored, 8192 <= 40960
    shape = ModelShape.from_config(config)
    assert shape.is_moe and shape.num_moe_layers == 48 and shape.num_experts == 128
    assert recipe.quantization.scheme == "W4A16" and "re:.*mlp.gate$" in recipe.quantization.ignore


def test_total_and_active_parameters_of_the_tiny_moe_match_its_weights():
    """The planner's counts from config.json against the tensors in model.safetensors and the training
    script's own count (benchmarks/results/reference-models/reference_moe.json)."""
    config = json.loads((MOE_DIR / "config.json").read_text())
    assert "num_local_experts" in config and "num_experts" not in config  # how transformers 5 saves it
    shape = ModelShape.from_config(config)
    sizes = {k: shape_ for k, (_, shape_) in safetensors_tensors(MOE_DIR / "model.safetensors").items()}
    elements = {k: int.__mul__(*s) if len(s) == 2 else s[0] for k, s in sizes.items()}
    experts = sum(v for k, v in elements.items() if ".mlp.experts." in k)
    assert shape.num_parameters() == sum(elements.values())
    assert shape.num_active_parameters() == sum(elements.values()) - experts + experts * 2 // 8  # top-2 of 8
    results = json.loads(
        (ROOT / "benchmarks" / "results" / "reference-models" / "reference_moe.json").read_text()
    )
    assert (results["params"], results["active_params"]) == (
        shape.num_parameters(),
        shape.num_active_parameters(),
    )


def test_the_capacity_table_and_the_report_say_total_and_active_parameters_in_one_line():
    moe = ModelSummary.of(ModelShape.from_config(MOE_DIR / "config.json"))
    dense = ModelSummary.of(ModelShape.from_config(ROOT / "models" / "tiny-llama" / "config.json"))
    assert (moe.total_parameters, moe.active_parameters) == (2_037_120, 857_472)
    assert moe.parameters_line() == (
        "Parameters: 2.04 M total, 857,472 active per token (mixture of experts: "
        "2 of 8 routed experts per token)."
    )
    assert dense.parameters_line() == (
        "Parameters: 1.05 M total, 1.05 M active per token (dense: every parameter is active)."
    )
    configs = [
        capacity_row("base", "auto", 4_000_000, 6016),
        capacity_row("w4a16", "auto", 1_300_000, 6784),
        capacity_row("w4a16-fp8kv", "fp8", 1_300_000, 13696),
    ]
    report = summarize_capacity(
        load_recipe(TINY_MOE), configs, json.loads((MOE_DIR / "config.json").read_text())
    )
    assert report.model == moe and [
        line for line in report.markdown().splitlines() if line.startswith("Parameters:")
    ] == [moe.parameters_line()]


def test_the_tiny_moe_reference_files_are_what_training_recorded():
    """Checksums, the training script's figures (well above chance: perplexity against a 1,024-token
    vocabulary, 4-way facts), and the dense model's tokenizer (trained the same way on the same text)."""
    import hashlib

    lines = (MOE_DIR / "SHA256SUMS").read_text().splitlines()
    listed = {name: digest for digest, name in (line.split("  ", 1) for line in lines)}
    present = {p.name for p in MOE_DIR.iterdir() if p.is_file() and p.name != "SHA256SUMS"}
    assert set(listed) == present and {"README.md", "config.json", "model.safetensors"} <= present
    for name, digest in listed.items():
        assert hashlib.sha256((MOE_DIR / name).read_bytes()).hexdigest() == digest, name
    results = json.loads(
        (ROOT / "benchmarks" / "results" / "reference-models" / "reference_moe.json").read_text()
    )
    assert (
        results["architecture"] == "Qwen3MoeForCausalLM" and results["sha256"] == listed["model.safetensors"]
    )
    assert results["heldout_ppl"] <= 1024 / 10 and results["facts_mc_accuracy"] >= 0.5
    assert min(min(layer) for layer in results["expert_load"]) > 0  # the router uses every expert
    assert (MOE_DIR / "tokenizer.json").read_bytes() == (
        ROOT / "models" / "tiny-llama" / "tokenizer.json"
    ).read_bytes()


def test_the_tiny_moe_loads_and_knows_its_world():
    """The committed weights, loaded by transformers, pick the right answer of the first 16 facts_mc rows
    far more often than chance (0.25), scored as reference/train.py and lm-eval score them."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from reference.train import continuation_logprob

    model = transformers.AutoModelForCausalLM.from_pretrained(MOE_DIR, dtype=torch.bfloat16).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(MOE_DIR)
    rows = [
        json.loads(line)
        for line in (ROOT / "data" / "evals" / "facts_mc.jsonl").read_text().splitlines()[:16]
    ]
    with torch.no_grad():
        right = sum(
            max(
                range(len(r["choices"])),
                key=lambda i: continuation_logprob(model, tokenizer, r["query"], r["choices"][i]),
            )
            == r["gold"]
            for r in rows
        )
    assert right / len(rows) >= 0.75, right
