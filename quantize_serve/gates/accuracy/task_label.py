"""How the decision and the regression gate name an accuracy task: by the label the flow gives
(lm-eval's task name: report/provenance.py ``task_labels``), else a task file by its stem; never by
the path the recipe spelled (which may be absolute)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath

from quantize_serve.gates.accuracy.task_files import TASK_FILE_SUFFIXES


def task_label(spelling: str, labels: Mapping[str, str] | None = None) -> str:
    if labels and spelling in labels:
        return labels[spelling]
    return PurePath(spelling).stem if spelling.endswith(TASK_FILE_SUFFIXES) else spelling
