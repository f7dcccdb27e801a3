"""The base model from the Hub, against the local hub with the REAL ``huggingface_hub`` client:
pinned to a commit, fetched with the recipe's token (environment variable or Prefect Secret block,
never a task parameter), only the files quantizing and serving read, into the work cache
(QS_WORK_DIR), and refused before any byte moves when the disk cannot hold it.
"""

from __future__ import annotations

import errno
import inspect
import logging
import shutil
import uuid
from collections import namedtuple
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from huggingface_hub import constants as hf_constants

from localhub.server import LocalHub
from quantize_serve.core.errors import HubAuthError, HubError, HubNotFoundError
from quantize_serve.core.settings import get_settings
from quantize_serve.hub.client import RetryPolicy
from quantize_serve.hub.download import BASE_MODEL_FILES, base_model_patterns, resolve_base_model
from quantize_serve.validate.preflight import ValidatedRecipe, resolve_base
from tests.conftest import HUB_READ as READ
from tests.conftest import HUB_WRITE as WRITE
from tests.conftest import ROOT, use_local_hub_client

TINY = ROOT / "models" / "tiny-llama"
WRONG = "hf_WrongTokenForBaseModelTests012345678"
FAST = RetryPolicy(attempts=2, base_s=0.01, max_s=0.05)
# What a Llama repo on the Hub holds besides what we need: Meta's consolidated weights, other formats.
EXTRA = {
    "original/consolidated.00.pth": b"pth" * 1000,
    "original/params.json": b"{}",
    "original/tokenizer.model": b"tok",
    "pytorch_model.bin": b"bin" * 1000,
    "model.gguf": b"gguf",
    "flax_model.msgpack": b"msgpack",
    "tf_model.h5": b"h5",
    "notes.txt": b"notes",
}
NEEDED = sorted(
    [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ]
)
Usage = namedtuple("Usage", "total used free")


@pytest.fixture(scope="module")
def base_repo(local_hub: LocalHub) -> str:
    """The tiny Llama as a private repo on the module's local Hub, with Meta's original/ folder and other
    weight formats."""
    client = HfApi(endpoint=local_hub.endpoint, token=WRITE)
    repo = f"org/tiny-llama-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as mp:  # the session is offline; this is loopback
        mp.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        mp.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)
        client.create_repo(repo, private=True)
        client.upload_folder(folder_path=TINY, repo_id=repo)
        for path, data in EXTRA.items():
            client.upload_file(path_or_fileobj=data, path_in_repo=path, repo_id=repo)
    return repo


@pytest.fixture(autouse=True)
def _client_env(local_hub: LocalHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """HF_ENDPOINT / HF_HUB_DISABLE_XET as the client reads them at import, set per test; a private
    HF cache (which base downloads must not use) and work folder (which they must) per test; a
    working directory of its own, to see that no stray folder (``None``) appears in it."""
    use_local_hub_client(monkeypatch, local_hub.endpoint, tmp_path / "hf-cache")
    monkeypatch.setenv("QS_WORK_DIR", str(tmp_path / "work"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    get_settings.cache_clear()
    local_hub.clear_faults()
    yield
    get_settings.cache_clear()
    local_hub.clear_faults()


def validated_for(recipe, repo_id: str, **hub: object) -> ValidatedRecipe:
    """The tiny-llama recipe pointed at a Hub repo, its hub section changed by ``hub``."""
    recipe = recipe.model_copy(
        update={
            "model": recipe.model.model_copy(update={"id": repo_id}),
            "hub": recipe.hub.model_copy(update=hub),
        }
    )
    return ValidatedRecipe(
        recipe=recipe, source="x.yaml", recipe_sha256="0" * 64, calibration_fingerprint="0" * 64
    )


def files_in(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def downloads_since(hub: LocalHub, mark: int) -> list[str]:
    return [r.path for r in hub.requests[mark:] if "/resolve/" in r.path]


def assert_no_none_folder(tmp_path: Path) -> None:
    """The old ``cache_dir=None -> "None"`` bug made a folder named None in the working directory."""
    assert not (Path.cwd() / "None").exists()
    assert not [p for p in tmp_path.rglob("None")], "a folder named None was created"


# --------------------------------------------------------------------------------------------
# What is fetched, and where
# --------------------------------------------------------------------------------------------


def test_only_the_needed_files_are_fetched_into_the_work_cache(
    local_hub: LocalHub, base_repo: str, tmp_path: Path
):
    mark = len(local_hub.requests)
    resolved = resolve_base_model(
        base_repo, revision=None, token=WRITE, endpoint=local_hub.endpoint, retry=FAST
    )
    assert files_in(resolved.local_dir) == NEEDED
    fetched = downloads_since(local_hub, mark)
    assert fetched and not [p for p in fetched if "original/" in p or p.endswith((".bin", ".pth", ".gguf"))]
    assert resolved.local_dir.is_relative_to(tmp_path / "work" / "hub")
    assert resolved.local_dir.name == resolved.sha  # the snapshot of the pinned commit
    assert not (tmp_path / "hf-cache").exists()  # the work cache, not the user's HF cache
    weights = "model.safetensors"
    assert (resolved.local_dir / weights).read_bytes() == (TINY / weights).read_bytes()
    assert_no_none_folder(tmp_path)


def test_base_model_pulled_by_repo_id_and_revision(local_hub: LocalHub, tmp_path: Path):
    """Moved here from tests/engines/test_hub.py: a tag pins its commit, None follows main, unknown ones
    fail."""
    client = HfApi(endpoint=local_hub.endpoint, token=WRITE)
    repo = f"org/base-{uuid.uuid4().hex[:8]}"
    client.create_repo(repo)
    v1 = client.upload_file(path_or_fileobj=b'{"v": 1}', path_in_repo="config.json", repo_id=repo).oid
    client.create_tag(repo, tag="v1.0", revision=v1)
    v2 = client.upload_file(path_or_fileobj=b'{"v": 2}', path_in_repo="config.json", repo_id=repo).oid
    opts = {"token": WRITE, "endpoint": local_hub.endpoint, "retry": FAST, "cache_dir": tmp_path / "c"}

    pinned = resolve_base_model(repo, revision="v1.0", **opts)
    assert pinned.sha == v1 and pinned.revision == "v1.0"
    assert (pinned.local_dir / "config.json").read_bytes() == b'{"v": 1}'
    head = resolve_base_model(repo, revision=None, **opts)
    assert head.sha == v2 and (head.local_dir / "config.json").read_bytes() == b'{"v": 2}'
    with pytest.raises(HubNotFoundError, match="revision 'nope' does not exist"):
        resolve_base_model(repo, revision="nope", **opts)
    with pytest.raises(HubNotFoundError, match="org/missing"):
        resolve_base_model("org/missing", revision=None, **opts)


@pytest.mark.parametrize(
    "files, weights",
    [
        (["model.safetensors", "pytorch_model.bin", "original/consolidated.00.pth"], ["model.safetensors"]),
        (
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json",
                "consolidated.safetensors",
                "original/model.safetensors",
            ],
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json",
            ],
        ),
        (
            [
                "pytorch_model-00001-of-00002.bin",
                "pytorch_model-00002-of-00002.bin",
                "pytorch_model.bin.index.json",
                "model.pt",
                "original/consolidated.00.pth",
            ],
            [
                "pytorch_model-00001-of-00002.bin",
                "pytorch_model-00002-of-00002.bin",
                "pytorch_model.bin.index.json",
            ],
        ),
    ],
    ids=["safetensors", "sharded-with-consolidated", "bin-only"],
)
def test_base_model_patterns_pick_one_weight_format(files: list[str], weights: list[str]):
    from huggingface_hub.utils import filter_repo_objects

    other = [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "chat_template.jinja",
        "README.md",
        "LICENSE",
        "original/params.json",
        "flax_model.msgpack",
        "tf_model.h5",
        "model.gguf",
    ]
    allow, ignore = base_model_patterns(files + other)
    assert "*.safetensors" in BASE_MODEL_FILES
    taken = sorted(filter_repo_objects(files + other, allow_patterns=allow, ignore_patterns=ignore))
    assert taken == sorted(
        weights
        + [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "tokenizer.model",
            "chat_template.jinja",
        ]
    )


# --------------------------------------------------------------------------------------------
# The token: from the recipe's hub section, inside the task, never leaked
# --------------------------------------------------------------------------------------------


def test_private_base_model_uses_the_recipe_token_env(
    local_hub: LocalHub,
    base_repo: str,
    awq_recipe,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture,
):
    caplog.set_level(logging.DEBUG)
    validated = validated_for(awq_recipe, base_repo, token_env="QS_TEST_BASE_TOKEN")
    with pytest.raises(HubAuthError, match="QS_TEST_BASE_TOKEN") as missing:  # private: no token, no model
        resolve_base(validated)
    monkeypatch.setenv("QS_TEST_BASE_TOKEN", WRONG)
    with pytest.raises(HubAuthError, match="rejected the token") as wrong:
        resolve_base(validated)
    monkeypatch.setenv("QS_TEST_BASE_TOKEN", READ)  # reading needs no write rights
    base = resolve_base(validated)
    assert base.repo_id == base_repo and base.identity == f"{base_repo}@{base.sha}"
    assert files_in(Path(base.local_dir)) == NEEDED
    assert Path(base.local_dir).is_relative_to(tmp_path / "work" / "hub")
    for err in (missing.value, wrong.value):
        assert err.__cause__ is None and err.__context__ is None
        assert WRONG not in str(err) and WRONG not in repr(err)
    out, errout = capfd.readouterr()
    for text in (out, errout, caplog.text):
        assert WRONG not in text and READ not in text
    assert_no_none_folder(tmp_path)


# --------------------------------------------------------------------------------------------
# Disk space: checked before the first byte
# --------------------------------------------------------------------------------------------


def test_too_little_disk_space_fails_before_any_download(
    local_hub: LocalHub, base_repo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    seen: list[Path] = []

    def small_disk(path):
        seen.append(Path(path))
        return Usage(10**9, 10**9 - 1000, 1000)

    monkeypatch.setattr(shutil, "disk_usage", small_disk)
    mark = len(local_hub.requests)
    with pytest.raises(HubError) as info:
        resolve_base_model(base_repo, revision="main", token=WRITE, endpoint=local_hub.endpoint, retry=FAST)
    message, cache = str(info.value), tmp_path / "work" / "hub"
    sha = HfApi(endpoint=local_hub.endpoint, token=WRITE).model_info(base_repo).sha
    needed = sum((TINY / f).stat().st_size for f in NEEDED)
    assert f"{base_repo}@{sha}" in message and "was not started" in message, message
    assert f"{needed:,} bytes" in message and "1,000 bytes" in message and str(cache) in message, message
    assert "QS_WORK_DIR" in message and "Fix: free space there" in message, message
    assert downloads_since(local_hub, mark) == []  # not one file request
    assert seen and seen[0] == tmp_path  # the nearest folder that exists: work/hub is not made yet
    assert not cache.exists()
    assert_no_none_folder(tmp_path)


def test_what_the_cache_holds_needs_no_space(
    local_hub: LocalHub, base_repo: str, monkeypatch: pytest.MonkeyPatch
):
    first = resolve_base_model(base_repo, revision=None, token=WRITE, endpoint=local_hub.endpoint, retry=FAST)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9, 0))
    mark = len(local_hub.requests)
    again = resolve_base_model(base_repo, revision=None, token=WRITE, endpoint=local_hub.endpoint, retry=FAST)
    assert again == first and downloads_since(local_hub, mark) == []


def test_a_download_that_fills_the_disk_shares_the_message(
    local_hub: LocalHub, base_repo: str, monkeypatch: pytest.MonkeyPatch
):
    import huggingface_hub

    def fill_the_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, f"No space left on device (token {WRITE})")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fill_the_disk)
    with pytest.raises(HubError) as info:
        resolve_base_model(base_repo, revision=None, token=WRITE, endpoint=local_hub.endpoint, retry=FAST)
    message = str(info.value)
    assert "failed: the disk is full" in message and "QS_WORK_DIR" in message and "Fix:" in message, message
    assert info.value.__context__ is None and WRITE not in message


def test_base_model_token_from_a_prefect_secret_block(
    prefect_api, local_hub: LocalHub, base_repo: str, awq_recipe
):
    from prefect.blocks.system import Secret

    block = f"qs-base-token-{uuid.uuid4().hex[:8]}"
    Secret(value=READ).save(block, overwrite=True)
    validated = validated_for(
        awq_recipe, base_repo, token_env="QS_TEST_UNSET_TOKEN", token_secret_block=block
    )
    base = resolve_base(validated)
    assert files_in(Path(base.local_dir)) == NEEDED


def test_the_task_reads_the_token_itself_and_tries_a_4xx_once(
    prefect_api,
    local_hub: LocalHub,
    base_repo: str,
    awq_recipe,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
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


def test_the_bases_architectures_are_had_before_its_weights_download(
    local_hub: LocalHub, base_repo: str, awq_recipe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """tasks/validate.py base_architectures, for the base's boot to inspect them while the base downloads:
    a local base's from its folder; a Hub base's from its config.json alone, one request with the recipe's
    token, kept in the work cache where the download then finds it; none, and no error, when the Hub refuses
    (resolve-base-model says why, with its retries)."""
    from tasks.validate import base_architectures

    local = ValidatedRecipe(
        recipe=awq_recipe, source="x.yaml", recipe_sha256="0" * 64, calibration_fingerprint="0" * 64
    )
    assert base_architectures.fn(local) == ["LlamaForCausalLM"]
    hub = validated_for(awq_recipe, base_repo, token_env="QS_TEST_BASE_TOKEN")
    monkeypatch.setenv("QS_TEST_BASE_TOKEN", WRONG)
    mark = len(local_hub.requests)
    assert base_architectures.fn(hub) == []
    assert len([r for r in local_hub.requests[mark:] if base_repo in r.path]) == 1  # no retry
    monkeypatch.setenv("QS_TEST_BASE_TOKEN", READ)
    mark = len(local_hub.requests)
    assert base_architectures.fn(hub) == ["LlamaForCausalLM"]
    assert set(downloads_since(local_hub, mark)) == {f"/{base_repo}/resolve/main/config.json"}  # HEADs, GET
    base = resolve_base(hub)
    assert f"/{base_repo}/resolve/{base.sha}/config.json" not in downloads_since(local_hub, mark)
    assert files_in(Path(base.local_dir)) == NEEDED
    assert_no_none_folder(tmp_path)
