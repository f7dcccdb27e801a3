"""Downloads from the Hub: a base model (or an existing checkpoint) pinned to a commit, only the files
quantizing and serving read, with the disk space checked first; a repo's config.json alone."""

from __future__ import annotations

import errno
import json
import logging
import shutil
from pathlib import Path

from quantize_serve.core.errors import HubError
from quantize_serve.core.settings import get_settings
from quantize_serve.hub.client import (
    DEFAULT_RETRY,
    SHA40,
    ResolvedModel,
    RetryPolicy,
    _api,
    _Call,
    _chain,
    _run,
    resolve_token,
)
from quantize_serve.recipe.model import Recipe

logger = logging.getLogger(__name__)


# What quantizing (llm-compressor) and serving (vLLM) read from a base model repo: the config, the
# weights as safetensors (shards and their index), the tokenizer and the chat template. Nothing else
# is fetched:
# - no file in a subfolder ("*/*"): Meta's repos ship original/ with the consolidated .pth weights,
#   as large as the model itself, which would double the download;
# - no other weight format (*.bin, *.pth, *.pt, *.h5, *.msgpack, *.gguf, Mistral's
#   consolidated*.safetensors) when the repo has safetensors; a repo without any gets its
#   pytorch_model*.bin instead (BASE_MODEL_LEGACY_WEIGHTS), which llm-compressor can still load.
BASE_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "*.tiktoken",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "chat_template.json",
    "*.jinja",
)
BASE_MODEL_IGNORED = ("*/*", "consolidated*")
BASE_MODEL_LEGACY_WEIGHTS = ("pytorch_model*.bin", "pytorch_model*.bin.index.json")
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def base_model_cache() -> Path:
    """Where base models are downloaded: the ``hub`` folder of the work cache (``QS_WORK_DIR``)."""

    return get_settings().work_dir / "hub"


def base_model_patterns(filenames: list[str], *, weights: bool = True) -> tuple[list[str], list[str]]:
    """(allow_patterns, ignore_patterns) for a repo holding ``filenames``: BASE_MODEL_FILES, plus
    the legacy .bin weights only when no safetensors would be taken; ``weights=False``: the config
    and tokenizer files only (what a dummy-weights boot reads)."""
    from huggingface_hub.utils import filter_repo_objects

    allow, ignore = list(BASE_MODEL_FILES), list(BASE_MODEL_IGNORED)
    if not weights:
        return [p for p in allow if "safetensors" not in p], ignore
    if not any(filter_repo_objects(filenames, allow_patterns="*.safetensors", ignore_patterns=ignore)):
        allow += BASE_MODEL_LEGACY_WEIGHTS
    return allow, ignore


def resolve_base_model(
    repo_id: str,
    *,
    revision: str | None,
    token: str | None,
    cache_dir: str | Path | None = None,
    endpoint: str | None = None,
    token_env: str = "HF_TOKEN",
    secret_block: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
    weights: bool = True,
) -> ResolvedModel:
    """Pin ``revision`` (branch, tag, sha or None = main) to a commit, then download that commit.

    Resolving first means the whole run (quantization, card, provenance) names one immutable
    sha, even if the branch moves while we download. Only the files quantizing and serving need
    are fetched (``base_model_patterns``; ``weights=False``: config and tokenizer only), into
    ``cache_dir`` (default: ``base_model_cache()``), and only after checking that the disk holding
    it has room for what the cache lacks.

    ``token`` None means the client's own default (the HF_TOKEN variable or a login on this
    machine); it is looked up here so that it is scrubbed from messages like a given one.
    ``token_env`` and ``secret_block`` only name where the token came from, for messages.
    """
    from huggingface_hub import get_token, snapshot_download

    token = token or get_token()
    cache = Path(cache_dir) if cache_dir is not None else base_model_cache()  # never str(None)
    api = _api(endpoint, token)
    call = _Call(
        "resolve the base model", repo_id, revision, token, token_env, secret_block, retry, writes=False
    )

    def attempt(_: int) -> ResolvedModel:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
        sha = info.sha
        if not sha or not SHA40.match(sha):
            raise HubError(f"the Hub returned no commit sha for {repo_id}@{revision}")
        siblings = info.siblings or []
        allow, ignore = base_model_patterns([s.rfilename for s in siblings], weights=weights)
        wanted = _select(siblings, allow, ignore)
        missing = _missing_bytes(cache, repo_id, wanted)
        free = _free_bytes(cache)
        if free is not None and missing > free:
            raise _disk_space_error(repo_id, sha, cache, missing, started=False)
        logger.info(
            "downloading %d file(s) of %s@%s into %s (%.1f MB not in the cache yet)",
            len(wanted),
            repo_id,
            sha[:12],
            cache,
            missing / 1e6,
        )
        try:
            local = snapshot_download(
                repo_id,
                revision=sha,
                cache_dir=cache,
                token=token,
                endpoint=endpoint,
                allow_patterns=allow,
                ignore_patterns=ignore,
            )
        except OSError as exc:
            if not any(isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS for e in _chain(exc)):
                raise
            local = None
        if local is None:  # raised here, not in the except: no client exception chained
            raise _disk_space_error(repo_id, sha, cache, missing, started=True)
        return ResolvedModel(repo_id=repo_id, revision=revision, sha=sha, local_dir=Path(local))

    resolved = _run(call, attempt)
    logger.info("base model %s@%s resolved to %s", repo_id, revision or "main", resolved.sha)
    return resolved


def _select(siblings: list, allow: list[str], ignore: list[str]) -> list:
    """The siblings snapshot_download will fetch with these patterns (the client's own filter)."""
    from huggingface_hub.utils import filter_repo_objects

    return list(
        filter_repo_objects(siblings, allow_patterns=allow, ignore_patterns=ignore, key=lambda s: s.rfilename)
    )


def _missing_bytes(cache: Path, repo_id: str, siblings: list) -> int:
    """Bytes of ``siblings`` not yet in the cache. The client stores each file once, as
    ``blobs/<etag>`` (the sha256 of an LFS file, the git blob id of a small one), so a file already
    fetched for any revision counts as present."""
    from huggingface_hub.file_download import repo_folder_name

    blobs = cache / repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"
    missing = 0
    for s in siblings:
        etag = s.lfs.sha256 if s.lfs else s.blob_id
        blob = blobs / etag if etag else None
        if blob is None or not blob.is_file() or blob.stat().st_size != (s.size or 0):
            missing += s.size or 0
    return missing


def _free_bytes(folder: Path) -> int | None:
    """Free bytes on the disk that holds ``folder`` (its nearest existing parent); None if unknown."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    try:
        return shutil.disk_usage(existing).free if existing else None
    except OSError:
        return None


def _disk_space_error(repo_id: str, sha: str, cache: Path, needed: int, *, started: bool) -> HubError:
    """The disk cannot hold the base model: before the download (``started=False``, nothing fetched) or
    when a download filled it. Where, how much is free, how much the model needs, the fix."""
    free = _free_bytes(cache)

    def size(n: int | None) -> str:
        if n is None:
            return "an unknown amount"
        return f"{n / 1e9:.1f} GB ({n:,} bytes)" if n >= 1e9 else f"{n / 1e6:.1f} MB ({n:,} bytes)"

    what = f"download the base model {repo_id}@{sha}"
    if started:
        head = (
            f"{what} failed: the disk is full (no space left on the device holding the download "
            f"cache {cache}; {size(free)} free, the files to download take {size(needed)})."
        )
    else:
        head = (
            f"{what} was not started: the disk is full for this model (the files to download take "
            f"{size(needed)}, the device holding the download cache {cache} has {size(free)} free)."
        )
    return HubError(
        f"{head} Fix: free space there, or point QS_WORK_DIR at a disk with room (base models are "
        "downloaded to its hub/ folder, not to HF_HUB_CACHE), and re-run: files already downloaded "
        "are kept."
    )


def fetch_model_config(
    repo_id: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    token_env: str = "HF_TOKEN",
    retry: RetryPolicy = RetryPolicy(attempts=1),
    cache_dir: Path | None = None,
) -> dict:
    """A Hub model's config.json, and nothing else (the planner and the command line's checks need
    only its shape). Made for a command line: one attempt, and one plain request first, because
    ``hf_hub_download`` alone retries a dead network for about half a minute; when the Hub cannot be
    reached, a copy in the local cache (``cache_dir``: default the client's) is used if there is one."""
    import httpx
    from huggingface_hub import (
        constants,
        get_hf_file_metadata,
        hf_hub_download,
        hf_hub_url,
        try_to_load_from_cache,
    )

    call = _Call("fetch config.json", repo_id, revision, token, token_env, None, retry, writes=False)

    def attempt(_: int) -> dict:
        if not constants.HF_HUB_OFFLINE:
            try:
                get_hf_file_metadata(
                    hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint), token=token
                )
            except httpx.TransportError:
                cached = try_to_load_from_cache(
                    repo_id, "config.json", cache_dir=cache_dir, revision=revision
                )
                if not isinstance(cached, str):
                    raise
                return json.loads(Path(cached).read_text())
        path = hf_hub_download(
            repo_id, "config.json", revision=revision, token=token, endpoint=endpoint, cache_dir=cache_dir
        )
        return json.loads(Path(path).read_text())

    return _run(call, attempt)


def download_base(recipe: Recipe, *, cache_dir: Path | None = None, weights: bool = True) -> ResolvedModel:
    """Download the recipe's Hub base model at its pinned commit (the token: the recipe's ``hub.token_env``,
    then ``hub.token_secret_block``; without a hub section, HF_TOKEN or a login on this machine);
    ``weights=False``: its config and tokenizer files only."""
    return download_model(
        recipe, recipe.model.id, recipe.model.revision, cache_dir=cache_dir, weights=weights
    )


def download_model(
    recipe: Recipe, repo_id: str, revision: str | None, *, cache_dir: Path | None = None, weights: bool = True
) -> ResolvedModel:
    """Download a Hub model repo (the base, or an existing checkpoint) at its pinned commit, with the
    recipe's token (see resolve_base)."""
    hub = recipe.hub
    return resolve_base_model(
        repo_id,
        revision=revision,
        token=resolve_token(hub) if hub else None,
        cache_dir=cache_dir,
        token_env=hub.token_env if hub else "HF_TOKEN",
        secret_block=hub.token_secret_block if hub else None,
        weights=weights,
    )


def resolve_dataset_commit(
    repo_id: str,
    *,
    revision: str | None,
    token: str | None,
    endpoint: str | None = None,
    token_env: str = "HF_TOKEN",
    retry: RetryPolicy = DEFAULT_RETRY,
) -> str | None:
    """The commit sha a Hub dataset's ``revision`` (branch, tag, sha; None = main) points at now, so a
    run loads exactly that commit and the card can name it (as the base model's). None offline
    (HF_HUB_OFFLINE): the datasets cache is all there is, and no commit can be asked for."""
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        return None
    token = token or get_token()
    api = _api(endpoint, token)
    call = _Call(
        "resolve the calibration dataset", repo_id, revision, token, token_env, None, retry, writes=False
    )

    def attempt(_: int) -> str:
        sha = api.dataset_info(repo_id, revision=revision).sha
        if not sha or not SHA40.match(sha):
            raise HubError(f"the Hub returned no commit sha for the dataset {repo_id}@{revision or 'main'}")
        return sha

    return _run(call, attempt)
