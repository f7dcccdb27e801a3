"""The capacity chart: weights and KV memory under one budget, and max concurrency, per configuration."""

from __future__ import annotations

from pathlib import Path

from quantize_serve.capacity.measure import CapacityConfig
from quantize_serve.core.model_files import GIB

CHART = "capacity.png"


def capacity_chart(configs: list[CapacityConfig], path: Path, *, scheme: str | None = None) -> Path:
    """Weights and KV memory (stacked) and max concurrency for the configurations, named as the capacity
    table names them (``scheme``: the candidate's; each row's KV dtype: Boot.label), a row not measured in
    this run marked so (derived, reused)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [
        c.name.label(scheme, kv_cache_dtype=c.kv_cache_dtype)
        + ("" if c.source == "measured" else f"\n({c.source})")
        for c in configs
    ]
    weights = [c.weights_bytes / GIB for c in configs]
    kv = [c.kv_cache_memory_bytes / GIB for c in configs]
    conc = [c.max_concurrency for c in configs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(names, weights, label="weights", color="#4c72b0")
    ax1.bar(names, kv, bottom=weights, label="KV cache", color="#dd8452")
    ax1.set_ylabel("GiB")
    ax1.set_title("Memory under one budget")
    ax1.legend()
    bars = ax2.bar(names, conc, color="#55a868")
    ax2.bar_label(bars, fmt="%.1fx")
    ax2.set_title(f"Max concurrency at {configs[0].max_model_len:,} tokens")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
