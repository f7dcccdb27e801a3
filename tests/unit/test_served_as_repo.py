"""The production boot served under its Hub repo id (serving/repo_layout.py): the boot spec, the Hub-cache
layout, the boot's process and environment, and the published profile. Without vLLM: the real boot of (c)
under the repo id is tests/engines/test_capacity.py's, the keys are
benchmarks/results/release-time/compile_cache_key.json's."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from quantize_serve.serving.spec import capacity_spec
from quantize_serve.core.errors import ServerBootError
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serve_profile import probe as profile_probe
from quantize_serve.serve_profile.output import write_serve_profile
from quantize_serve.serve_profile.pinned import write_serving_profile
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.repo_layout import LOCAL_COMMIT, laid_out_as_hub_cache, lay_out_as_hub_cache
from quantize_serve.serving.server import (
    BOOT,
    BOOT_START_DEFAULTS,
    BOOT_VLLM_DEFAULTS,
    ENTRYPOINT,
    INSPECTED,
    PREPARED_MARK,
    boot_env,
    boot_hub_cache,
    serving_env,
)
from tests.conftest import ROOT
from tests.release_fixtures import capacity_config
from tests.unit.test_results_portable import machine_leaks

RECIPE = load_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml")
REPO = RECIPE.hub.repo_id
REF = RECIPE.hub.release_ref  # "production": the revision the published profile names
TINY = json.loads((ROOT / "models/tiny-llama/config.json").read_text())


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """A checkpoint folder in a work dir (no weights: their bytes do not matter here)."""
    folder = tmp_path / "work" / "checkpoints" / "awq-0123abcd"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(TINY))
    for name in ("tokenizer.json", "tokenizer_config.json", "quantize_manifest.json"):
        (folder / name).write_text(name)
    return folder


def test_the_production_boot_names_the_model_by_its_repo_id_at_the_release_ref(checkpoint):
    spec = capacity_spec(RECIPE, Boot.PRODUCTION, checkpoint, as_published=True)
    assert spec.repo_id == REPO and spec.model_dir == str(checkpoint)  # the files stay the checkpoint's
    assert (spec.revision, REF) == ("production", "production")  # hub.release_ref, not the head of main
    assert spec.vllm_config()["model"] == REPO and spec.vllm_config()["revision"] == REF
    assert spec.vllm_args()[:4] == ["--model", REPO, "--revision", REF]
    assert spec.published_config(REPO) == spec.vllm_config()  # the boot is what the profile says
    assert "revision" not in spec.published_config("placeholder")  # a revision only of its repo
    before = capacity_spec(RECIPE, Boot.PRODUCTION, checkpoint)
    assert before.repo_id is None and before.vllm_config()["model"] == str(checkpoint)
    assert "revision" not in before.vllm_config()
    assert {k: v for k, v in spec.vllm_config().items() if k not in ("model", "revision")} == {
        k: v for k, v in before.vllm_config().items() if k != "model"
    }  # only the name differs
    no_hub = RECIPE.model_copy(update={"hub": None})  # nothing published: nothing to name it by
    unnamed = capacity_spec(no_hub, Boot.PRODUCTION, checkpoint, as_published=True)
    assert unnamed.repo_id is None and unnamed.revision is None and "revision" not in unnamed.vllm_config()
    branch = RECIPE.model_copy(
        update={
            "hub": RECIPE.hub.model_copy(update={"release_ref": "release/v1", "release_ref_kind": "branch"})
        }
    )
    assert capacity_spec(branch, Boot.PRODUCTION, checkpoint, as_published=True).revision == "release/v1"


def test_the_flow_serves_only_the_production_settings_under_the_repo_id(checkpoint, tmp_path, monkeypatch):
    from tasks import boot as serve_tasks

    booted = []

    @contextmanager
    def fake_server(spec, *, log_path, stop=None):
        booted.append(spec)
        yield SimpleNamespace(base_url="http://x", boot_seconds=1.0)

    monkeypatch.setattr(serve_tasks, "vllm_server", fake_server)
    monkeypatch.setattr(serve_tasks, "get_run_logger", lambda: logging.getLogger("test"))
    validated = SimpleNamespace(recipe=RECIPE)
    for boot in Boot:
        with serve_tasks.served(validated, boot, str(checkpoint), tmp_path):
            pass
    assert [(s.repo_id, s.revision) for s in booted] == [(None, None), (None, None), (REPO, REF)]


def test_the_search_probes_boot_under_the_repo_id(checkpoint, tmp_path, monkeypatch):
    """The probe at the found settings writes the entry the production boot (c) then reads."""

    @contextmanager
    def refused(spec, *, log_path):
        raise ServerBootError("refused")
        yield

    monkeypatch.setattr(profile_probe, "vllm_server", refused)
    probe = profile_probe.vllm_probe(
        RECIPE, checkpoint, tokenizer_dir=str(checkpoint), output_dir=tmp_path, log=lambda _: None
    )
    point = probe(RECIPE.serve)
    assert not point.passed and point.spec.repo_id == REPO and point.spec.model_dir == str(checkpoint)
    assert point.spec.revision == REF  # at the release ref, as the profile written from it names it
    path, command = write_serve_profile(point, tmp_path / "serve-profile.yaml", model=REPO)
    assert yaml.safe_load(path.read_text())["revision"] == REF and f"--revision {REF} " in command
    # the probe at (c)'s settings is keyed as (c) is: the same model, revision and settings
    assert (
        point.spec.vllm_config()
        == capacity_spec(RECIPE, Boot.PRODUCTION, checkpoint, as_published=True).vllm_config()
    )


def test_the_layout_is_the_hub_clients_cache_of_the_checkpoint(checkpoint, tmp_path):
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    cache = tmp_path / "hub-cache"
    snapshot = lay_out_as_hub_cache(checkpoint, REPO, cache)
    assert snapshot == cache / "models--quantize-serve--tiny-llama-awq-w4a16" / "snapshots" / LOCAL_COMMIT
    # huggingface_hub resolves the repo id offline, at the default branch (`vllm serve <repo id>`'s), to it
    assert Path(snapshot_download(REPO, cache_dir=cache, local_files_only=True)) == snapshot
    found = try_to_load_from_cache(REPO, "config.json", cache_dir=cache)
    assert Path(found).resolve() == (checkpoint / "config.json").resolve()
    links = {p.name: p.resolve() for p in snapshot.iterdir()}
    assert links == {p.name: p.resolve() for p in checkpoint.iterdir()}
    assert all(p.is_symlink() for p in snapshot.iterdir())  # links: nothing copied


def test_the_layout_follows_the_revision_the_profile_names(checkpoint, tmp_path):
    from huggingface_hub import try_to_load_from_cache

    cache = tmp_path / "hub-cache"
    lay_out_as_hub_cache(checkpoint, REPO, cache, revision="production")  # a tag: a ref, as the Hub keeps
    assert Path(try_to_load_from_cache(REPO, "config.json", cache_dir=cache, revision="production")).is_file()
    sha = "a" * 40  # a pinned commit: the snapshot is named by it, no ref needed
    snapshot = lay_out_as_hub_cache(checkpoint, REPO, cache, revision=sha)
    assert snapshot.name == sha and not (snapshot.parent.parent / "refs" / sha).exists()
    assert Path(try_to_load_from_cache(REPO, "config.json", cache_dir=cache, revision=sha)).is_file()


def test_the_boot_lays_out_the_release_ref_at_the_checkpoint(checkpoint, tmp_path, monkeypatch):
    """vllm_server lays out what the spec names: refs/<release ref> -> the snapshot of the candidate's
    checkpoint, which the boot's offline Hub client resolves the profile's revision to."""
    from huggingface_hub import try_to_load_from_cache

    from quantize_serve.core.settings import get_settings
    from quantize_serve.serving import server as server_module

    monkeypatch.setenv("QS_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("QS_SERVING_PYTHON", sys.executable)
    get_settings.cache_clear()
    seen = {}

    def look(spec, settings, log_path, *, append):  # instead of starting vLLM: what its process would read
        cache = boot_hub_cache(log_path)
        repo = cache / "models--quantize-serve--tiny-llama-awq-w4a16"
        seen["ref"] = (repo / "refs" / REF).read_text()
        found = try_to_load_from_cache(REPO, "config.json", cache_dir=cache, revision=REF)
        seen["config"] = Path(found).resolve()
        seen["argv"] = spec.vllm_args()
        raise ServerBootError("stopped before vLLM")

    monkeypatch.setattr(server_module, "_start", look)
    try:
        spec = capacity_spec(RECIPE, Boot.PRODUCTION, checkpoint, as_published=True)
        with pytest.raises(ServerBootError), server_module.vllm_server(spec, log_path=tmp_path / "c.log"):
            pass
    finally:
        get_settings.cache_clear()
    assert seen["ref"] == LOCAL_COMMIT and seen["config"] == (checkpoint / "config.json").resolve()
    assert seen["argv"][:4] == ["--model", REPO, "--revision", REF]


def test_the_layout_lasts_the_boot_and_leaves_the_checkpoint(checkpoint, tmp_path):
    cache = tmp_path / "hub-layouts" / "boot"
    files = {p.name: p.read_text() for p in checkpoint.iterdir()}
    with laid_out_as_hub_cache(checkpoint, REPO, cache) as snapshot:
        assert (snapshot / "config.json").is_file()
    assert not cache.exists() and {p.name: p.read_text() for p in checkpoint.iterdir()} == files


def test_each_boot_reads_its_own_offline_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QS_WORK_DIR", str(tmp_path / "work"))
    from quantize_serve.core.settings import get_settings

    get_settings.cache_clear()
    try:
        log_b, log_c = tmp_path / "run" / "vllm-w4a16.log", tmp_path / "run" / "vllm-w4a16-fp8kv.log"
        env_b, env_c = boot_env(log_b), boot_env(log_c)
        assert env_c["HF_HUB_OFFLINE"] == "1"
        assert env_c["VLLM_CACHE_ROOT"] == str(tmp_path / "work" / "vllm-cache")
        assert env_c["HF_HUB_CACHE"] == str(boot_hub_cache(log_c))
        assert env_c["HF_HUB_CACHE"] != env_b["HF_HUB_CACHE"]  # two boots of one repo never share a layout
        assert Path(env_c["HF_HUB_CACHE"]).is_relative_to(tmp_path / "work" / "hub-layouts")
    finally:
        get_settings.cache_clear()


def test_vllms_engine_core_starts_forked_unless_the_host_says_otherwise(monkeypatch):
    """`vllm serve` would spawn it (a fresh interpreter importing vLLM again); the method stays out of vLLM's
    compile-cache key, so the published profile's variables do not name it."""
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    assert serving_env()["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert not set(BOOT_START_DEFAULTS) & set(BOOT_VLLM_DEFAULTS)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert serving_env()["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


@pytest.fixture
def fake_vllm(tmp_path) -> Path:
    """A stand-in for vLLM's two modules the boot's bootstrap touches: its server module prints what it was
    run with and what the engine arguments' get_model_path makes of a repo id."""
    root = tmp_path / "fake-vllm"
    for package in (
        "vllm",
        "vllm/engine",
        "vllm/entrypoints",
        "vllm/entrypoints/openai",
        "vllm/model_executor",
        "vllm/model_executor/models",
    ):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").touch()
    (root / "vllm" / "model_executor" / "models" / "registry.py").write_text(
        "class _Registry:\n"
        "    def _try_inspect_model_cls(self, arch):\n"
        "        if arch == 'Broken':\n"
        "            raise ValueError('no such model')\n"
        "        print('INSPECT', arch)\n"
        "ModelRegistry = _Registry()\n"
    )
    server = root / Path(*ENTRYPOINT.split(".")).with_suffix(".py")
    (root / "vllm" / "engine" / "arg_utils.py").write_text(
        "def get_model_path(model, revision=None):\n    return '/snapshots/' + model\n"
    )
    server.write_text(
        "import sys\nif __name__ == '__main__':\n"
        "    import vllm.engine.arg_utils as a\n"
        "    name = a.get_model_path('org/model')\n"
        "    print('RAN', __file__ == sys.argv[0], sys.argv[1:], name)\n"
    )
    return root


def test_every_boot_keeps_the_model_name_it_was_given(fake_vllm):
    """Started at once (python -c BOOT ENTRYPOINT ARGS) or prepared ahead (its command line on stdin), the
    boot's process runs vLLM's server module with its arguments after KEEP_MODEL_NAME."""
    env, args = {"PYTHONPATH": str(fake_vllm)}, ["--model", "org/model"]
    ran = "RAN True ['--model', 'org/model'] org/model"  # as `python -m` runs it; the repo id kept
    direct = subprocess.run(
        [sys.executable, "-c", BOOT, ENTRYPOINT, *args], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert ran in direct
    prepared = subprocess.run(
        [sys.executable, "-c", BOOT],
        env=env,
        input=json.dumps(args),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert prepared.startswith(PREPARED_MARK) and ran in prepared


def test_a_prepared_boot_inspects_the_architectures_it_is_sent_before_its_command_line(fake_vllm):
    """prepare_server's {"inspect": [...]} lines: the prepared process has vLLM's registry inspect each
    architecture (its model-info cache then holds it for the boot) and says so, then takes its command line;
    an inspection that fails is said and left to the boot."""
    env, args = {"PYTHONPATH": str(fake_vllm)}, ["--model", "org/model"]
    lines = [{"inspect": ["LlamaForCausalLM", "Qwen3MoeForCausalLM"]}, {"inspect": ["Broken"]}, args]
    out = subprocess.run(
        [sys.executable, "-c", BOOT],
        env=env,
        input="".join(json.dumps(line) + "\n" for line in lines),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[:4] == [
        PREPARED_MARK,
        "INSPECT LlamaForCausalLM",
        "INSPECT Qwen3MoeForCausalLM",
        f"(quantize-serve: vLLM's model info of LlamaForCausalLM, Qwen3MoeForCausalLM {INSPECTED})",
    ]
    assert out[4].startswith("(quantize-serve: vLLM's model info of Broken not inspected ahead (ValueError(")
    assert out[5] == "RAN True ['--model', 'org/model'] org/model"


def test_the_published_profile_names_the_repo_and_says_what_makes_the_hit(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    compiling = RECIPE.model_copy(update={"serve": RECIPE.serve.model_copy(update={"enforce_eager": False})})
    spec = capacity_spec(compiling, Boot.PRODUCTION, checkpoint, as_published=True)
    measured = capacity_config(
        weights_bytes=949_536,
        kv_cache_memory_bytes=7_012_352,
        kv_cache_tokens=13_696,
        block_size=128,
        boot_seconds=30.0,
    )
    profile = write_serving_profile(
        spec,
        measured,
        TINY,
        tmp_path / "release" / "serve-profile.yaml",
        model=REPO,
        device_memory_bytes=None,
    )
    text = Path(profile.path).read_text()
    published = yaml.safe_load(text)
    assert published["model"] == REPO and profile.command.startswith(f"vllm serve {REPO} --revision {REF} ")
    # production (`vllm serve --config` of it) serves the release ref at the revision the boot was keyed on
    assert published["revision"] == REF == spec.vllm_config()["revision"]
    assert "VLLM_CACHE_ROOT" in text and "VLLM_USE_FLASHINFER_SAMPLER=0" in text  # what makes the hit
    assert not machine_leaks(text) and str(tmp_path) not in text and "hub-layouts" not in text
    assert "hf_secret_token_value" not in text
    for other in (
        capacity_spec(compiling, Boot.PRODUCTION, checkpoint),  # booted under another name
        capacity_spec(RECIPE, Boot.PRODUCTION, checkpoint, as_published=True),
    ):  # compiled nothing
        text = Path(
            write_serving_profile(
                other, measured, TINY, tmp_path / "other.yaml", model=REPO, device_memory_bytes=None
            ).path
        ).read_text()
        assert "VLLM_CACHE_ROOT" not in text
