"""A checkpoint folder served under its Hub repo id, the way production names it.

vLLM keys its torch.compile cache (``VLLM_CACHE_ROOT/torch_compile_cache/...``) on its whole config, the
model's name included: a boot of the checkpoint folder never shares an entry with production's
``vllm serve <repo id> --config serve-profile.yaml``. A boot that names the repo id and the revision the
profile names (the release ref, ``hub.release_ref``: vLLM keys on the revision as named) writes the very
entry production's first boot on the same host reads, given the same ``VLLM_CACHE_ROOT`` and ``VLLM_*``
variables (benchmarks/results/release-time/compile_cache_key.json).

So the production boot serves the checkpoint under its repo id from a Hub-cache layout of the checkpoint
(what the Hub client's cache holds after a download: ``models--ORG--NAME/refs/<revision>`` naming a commit,
``snapshots/<commit>/`` holding the files), with ``HF_HUB_OFFLINE=1``: nothing is fetched, the files are
the checkpoint's. The layout is a folder of links, made for one boot and removed after it.

One thing about vLLM makes this more than a layout: in offline mode its engine arguments replace a repo
id by the id's snapshot folder, and that folder, not the id, would then be keyed (KEEP_MODEL_NAME).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The snapshot's commit when the revision is a branch or tag: the layout stands for no commit on the Hub
# (the candidate may not be pushed yet). The key does not hold it: an online boot is keyed on the
# revision as named, offline the layout's ref gives the same
# (benchmarks/results/release-time/compile_cache_key.json).
LOCAL_COMMIT = "0" * 40

# Run in a boot's process before vLLM's server module (server.BOOT). vLLM in offline mode (HF_HUB_OFFLINE=1,
# every boot here) replaces a model named by its repo id with the id's snapshot folder before it builds its
# config (vllm.engine.arg_utils.get_model_path, in vLLM 0.8 to 0.32), and keys its compile cache on that
# folder: a boot under the repo id would still never share an entry with production's online
# `vllm serve <repo id>`, keyed on the id (benchmarks/results/release-time/compile_cache_key.json shows both
# keys). The
# process keeps the name it was given; offline, huggingface_hub still reads only the boot's layout, and a
# local folder was kept by vLLM's own function too. Remove when vLLM's offline mode keeps the repo id.
KEEP_MODEL_NAME = """\
import vllm.engine.arg_utils as engine_args
if hasattr(engine_args, "get_model_path"):
    engine_args.get_model_path = lambda model, revision=None: model
else:
    print("(quantize-serve: this vLLM has no engine_args.get_model_path: the model is named as vLLM does)",
          flush=True)
"""


def lay_out_as_hub_cache(
    model_dir: str | Path, repo_id: str, cache_dir: str | Path, *, revision: str | None = None
) -> Path:
    """Lay out ``model_dir`` in the Hub cache ``cache_dir`` as repo ``repo_id`` at ``revision`` (None: the
    default branch, what ``vllm serve <repo id>`` resolves); return the snapshot folder. Each of its
    entries links to the checkpoint's own (nothing is copied). Laying out again replaces the layout."""
    from huggingface_hub.constants import DEFAULT_REVISION, REPO_TYPE_MODEL
    from huggingface_hub.file_download import REGEX_COMMIT_HASH, repo_folder_name

    model_dir = Path(model_dir).resolve()
    revision = revision or DEFAULT_REVISION
    pinned = REGEX_COMMIT_HASH.fullmatch(revision) is not None  # a commit sha: the Hub client needs no ref
    commit = revision if pinned else LOCAL_COMMIT
    repo = Path(cache_dir) / repo_folder_name(repo_id=repo_id, repo_type=REPO_TYPE_MODEL)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for entry in snapshot.iterdir():
        entry.unlink()
    for entry in model_dir.iterdir():
        (snapshot / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    if not pinned:
        ref = repo / "refs" / revision  # a ref with slashes (refs/pr/1) is folders, as the Hub client writes
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    return snapshot


@contextmanager
def laid_out_as_hub_cache(
    model_dir: str | Path, repo_id: str, cache_dir: str | Path, *, revision: str | None = None
) -> Iterator[Path]:
    """:func:`lay_out_as_hub_cache` for the duration of the block, in ``cache_dir``, a folder of its own:
    removed afterwards (links only; the checkpoint is untouched)."""
    try:
        yield lay_out_as_hub_cache(model_dir, repo_id, cache_dir, revision=revision)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
