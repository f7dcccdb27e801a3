"""The base every recipe section shares (``extra="forbid"``) and the constants several sections and
stages read (Hub ref names, bounds, the stress test's long-prompt margin)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
)

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# Flags the server wrapper owns; a recipe's extra_args must not fight over them.
RESERVED_VLLM_FLAGS = (
    "--model",
    "--host",
    "--port",
    "--served-model-name",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--kv-cache-dtype",
    "--max-num-seqs",
    "--tensor-parallel-size",
    "--max-num-batched-tokens",
    "--kv-cache-memory-bytes",
    "--dtype",
    "--enforce-eager",
    "--kv-offloading-size",
    "--kv-offloading-backend",
)


# Validators do not know the file name; parse_recipe puts it in.
RECIPE_SOURCE = "<recipe>"


# The stress test's long requests are prompt + output = max_model_len - this many tokens
# (quantize_serve.gates.stress uses this constant).
LONG_PROMPT_MARGIN = 4


# Placeholders hub.commit_message may use (quantize_serve/release/publish.py fills exactly these).
COMMIT_MESSAGE_FIELDS = ("method", "scheme", "base_model", "base_revision")


# Refs the pipeline owns on the Hub (quantize_serve/hub/client.py): every candidate is committed to the
# branch `main`, every rejection is tagged `rejected-<sha>`. The release ref may be neither.
CANDIDATE_BRANCH = "main"


REJECTION_TAG_PREFIX = "rejected-"


# A tag or branch name git (and so the Hub) accepts: no spaces or ~^:?*[\, no "..", "//" or "@{",
# not starting with "-" or "/", not ending with "/", "." or ".lock".
GIT_REF_NAME = re.compile(r"^(?![-/])(?!.*(?:\.\.|//|@\{))[A-Za-z0-9._/@+-]+(?<![/.])(?<!\.lock)$")


# The accuracy gate's operating points are true recoveries (quantized / base, see docs/gates.md): below
# 0.5 a model that lost half its score counts as good; above 1.1 no quantized model could reach it.
RECOVERY_RANGE = (0.5, 1.1)


# The accuracy gate's planned looks (fractions of each task's documents): O'Brien-Fleming-like bounds
# make early stops rare unless the decision is clear, so four looks cost little at the last one.
DEFAULT_LOOKS = (0.25, 0.5, 0.75, 1.0)


# gates.accuracy.min_samples: documents per task (inclusive).
MIN_SAMPLES_RANGE = (1, 10_000_000)


# The profile search brackets then bisects: 20 boots resolve any max_num_seqs range a GPU can hold
# (2^10 = 1,024 values in about 10 bisection steps plus bracketing). Each boot is a vLLM start plus
# a stress test, minutes on a GPU, so a larger budget is a typo, not a plan.
MAX_SEARCH_BOOTS = 20


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Method = Literal["awq", "gptq", "smoothquant-gptq", "rtn"]


Scheme = Literal["W4A16", "W4A16_ASYM", "W8A8", "FP8_DYNAMIC"]


def looks_local(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or not REPO_ID.match(value)
