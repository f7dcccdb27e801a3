"""What the boot a capacity row rests on held, in vLLM's own figures (capacity/measure.py rows)."""

from __future__ import annotations

import re

from pydantic import BaseModel

from quantize_serve.core.model_files import GIB

# vLLM's own account of a boot's KV cache ("GPU KV cache size: 34,912 tokens", "CPU ..." on a CPU), and the
# concurrency it gives ("Maximum concurrency for 2,048 tokens per request: 17.05x")
KV_CACHE_SIZE = re.compile(r"(?:\b\w+ )?KV cache size: [\d,]+ tokens")
MAX_CONCURRENCY = re.compile(r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x")


class BootHeld(BaseModel):
    """What the boot a capacity row rests on held, in vLLM's own figures."""

    kv_cache_tokens: int  # vllm:cache_config_info's kv_cache_size_tokens
    gpu_memory_utilization: float | None = None  # what it served at; None: a fixed budget
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes: a fixed budget
    vllm_said: str | None = None  # its log's lines (KV_CACHE_SIZE; MAX_CONCURRENCY)
    log: str | None = None  # its log's file name in the run folder

    def describe(self) -> str:
        """'34,912 tokens at gpu_memory_utilization 0.49 (vLLM: "GPU KV cache size: 34,912 tokens; ...")'."""
        at = (
            f" at gpu_memory_utilization {self.gpu_memory_utilization:.2f}"
            if self.gpu_memory_utilization is not None
            else f" in a {self.kv_cache_memory_bytes / GIB:.4f} GiB KV budget"
            if self.kv_cache_memory_bytes
            else ""
        )
        return f"{self.kv_cache_tokens:,} tokens{at}{said(self)}"


def vllm_said(log_text: str) -> str | None:
    """vLLM's own lines on a boot's KV cache, the last of each (KV_CACHE_SIZE; MAX_CONCURRENCY), or None."""
    lines = [
        found[-1] for found in (KV_CACHE_SIZE.findall(log_text), MAX_CONCURRENCY.findall(log_text)) if found
    ]
    return "; ".join(lines) or None


def said(held: BootHeld) -> str:
    """' (vLLM: "GPU KV cache size: ...")' where the boot's log said it, else ''."""
    return f' (vLLM: "{held.vllm_said}")' if held.vllm_said else ""
