"""The engines tier: the real vLLM, llm-compressor, lm-eval and the Hub client (against the local Hub)."""

from __future__ import annotations

import pytest

from tests.conftest import LANE


@pytest.fixture(scope="session", autouse=True)
def _session_checkpoint_made_here_first(request):
    """In two lanes (`make test`), this tier's lane makes the session's AWQ checkpoint first thing; the
    flows lane needs it half a minute later and reuses it (waiting on its lock if it is still being
    made). So on a clean checkout tests/engines/test_quantize.py reads the log of a real quantization,
    never the one line of a reused checkpoint. Run alone, the tier makes it when a test first needs it."""
    if LANE:
        request.getfixturevalue("awq_checkpoint")
