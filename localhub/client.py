"""Point the Hugging Face clients of this process, and of the processes it starts, at one hub.

``huggingface_hub`` and ``datasets`` read ``HF_ENDPOINT``, the offline switches and their cache
folders once, when they are imported. A test suite imports them early (offline, the public
endpoint), so setting the environment later is not enough: :func:`hub_client_env` sets both the
environment (for child processes: the quantization worker, lm-eval's subprocesses) and the
imported modules' copies, and restores all of them on exit.

A script that starts fresh needs only the environment, before its first import::

    HF_ENDPOINT=http://127.0.0.1:PORT HF_HUB_DISABLE_XET=1 HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def hub_client_env(endpoint: str, *, cache_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Online against ``endpoint``, plain LFS (no Xet), caches under ``cache_dir`` (``hub/`` for
    downloaded files, ``datasets/`` for prepared datasets), for the duration of the block."""
    import datasets.config
    from huggingface_hub import constants

    endpoint = endpoint.rstrip("/")
    cache = Path(cache_dir)
    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_CACHE": str(cache / "hub"),
        "HF_DATASETS_CACHE": str(cache / "datasets"),
    }
    hub_attrs = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_CACHE": str(cache / "hub"),
    }
    datasets_attrs = {
        "HF_ENDPOINT": endpoint,
        "HUB_DATASETS_URL": endpoint + "/datasets/{repo_id}/resolve/{revision}/{path}",
        "HF_HUB_OFFLINE": False,
        "HF_DATASETS_OFFLINE": False,
        "HF_DATASETS_CACHE": cache / "datasets",
        "DOWNLOADED_DATASETS_PATH": cache / "datasets" / "downloads",
        "EXTRACTED_DATASETS_PATH": cache / "datasets" / "downloads" / "extracted",
    }
    saved_env = {k: os.environ.get(k) for k in env}
    saved: list[tuple[Any, str, Any]] = [
        (m, k, getattr(m, k))
        for m, attrs in ((constants, hub_attrs), (datasets.config, datasets_attrs))
        for k in attrs
    ]
    os.environ.update(env)
    for module, attrs in ((constants, hub_attrs), (datasets.config, datasets_attrs)):
        for key, value in attrs.items():
            setattr(module, key, value)
    try:
        yield
    finally:
        for module, key, value in saved:
            setattr(module, key, value)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
