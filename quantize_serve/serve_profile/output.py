"""The profile search's outputs: ``serve-profile.yaml`` (for ``vllm serve --config``) and the chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from quantize_serve.core.errors import GateError
from quantize_serve.serve_profile.search import ProfileSearchResult, SearchPoint
from quantize_serve.serving.server import BOOT_VLLM_DEFAULTS, ServerSpec, serve_command, serving_env

PROFILE_FILE = "serve-profile.yaml"  # the run folder's and the release's serving profile


def profile_config(spec: ServerSpec, *, model: str | None = None) -> dict[str, Any]:
    """The boot's vLLM config (``ServerSpec.vllm_config``) as ``serve-profile.yaml`` holds it;
    ``model`` gives the published form (``ServerSpec.published_config``)."""
    return spec.published_config(model) if model else spec.vllm_config()


def compile_cache_note() -> list[str]:
    """What makes production's first boot on the host that ran the gates read the graphs the validated
    boot compiled: the same compile cache and the same vLLM variables (both in vLLM's key)."""
    env = serving_env()
    variables = " ".join(f"{k}={env[k]}" for k in BOOT_VLLM_DEFAULTS)
    return [
        "Compiled graphs: on the host that ran the gates, with its VLLM_CACHE_ROOT (by default the",
        f"vllm-cache of QS_WORK_DIR) and its VLLM_* variables ({variables}), the first boot loads",
        "what the validated boot compiled instead of compiling again.",
    ]


def write_serve_profile(
    found: SearchPoint, path: str | Path, *, model: str | None = None
) -> tuple[Path, str]:
    """Write the search's ``serve-profile.yaml`` for ``vllm serve --config``; return (path, the
    equivalent command). ``model`` replaces the local checkpoint path (e.g. the Hub repo id)."""
    if found.spec is None:
        raise GateError(
            "this search point carries no ServerSpec (an injected probe made it); "
            "only a real boot's point can be written as a serving profile"
        )
    kv = f"{found.peak_kv_cache_usage:.0%}" if found.peak_kv_cache_usage is not None else "unknown"
    return write_profile(
        found.spec,
        path,
        model=model,
        header=[
            "vLLM serving profile found by quantize-serve's profile search: the largest max_num_seqs",
            f"that passed the stress profile (preemptions {found.preemptions}, peak KV usage {kv}, output "
            f"{found.output_throughput or 0:.0f} tok/s).",
        ],
    )


def write_profile(
    spec: ServerSpec, path: str | Path, *, model: str | None = None, header: list[str]
) -> tuple[Path, str]:
    """Write ``spec``'s vLLM config as a file for ``vllm serve --config`` under a comment ``header``;
    return (path, the equivalent command). When the boot compiled (no enforce-eager) and named the model as
    the file does (its repo id), the file also says what makes production's first boot read those graphs."""
    mapping = profile_config(spec, model=model)
    command = serve_command(mapping)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [*header, f"Use: vllm serve --config {path.name}", f"Same as: {command}"]
    if model is not None and model == spec.repo_id and not spec.serve.enforce_eager:
        lines += compile_cache_note()
    path.write_text("".join(f"# {line}\n" for line in lines) + yaml.safe_dump(mapping, sort_keys=False))
    return path, command


def plot_search(
    result: ProfileSearchResult,
    path: str | Path,
    *,
    grid: list[SearchPoint] | None = None,
    title: str | None = None,
) -> Path:
    """max_num_seqs vs pass/fail, peak KV usage and throughput; boot order numbered; PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in result.points if p.dimension == "max_num_seqs"]
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 8), sharex=True)
    series = [("search", pts, "o", 70)] + ([("grid", grid, "s", 110)] if grid else [])
    for name, points, marker, size in series:
        for ax, key, label in (
            (axes[1], "peak_kv_cache_usage", "peak KV usage (%)"),
            (axes[2], "output_throughput", "output tokens/s"),
        ):
            xs = [p.max_num_seqs for p in points if getattr(p, key) is not None]
            ys = [
                getattr(p, key) * (100 if key == "peak_kv_cache_usage" else 1)
                for p in points
                if getattr(p, key) is not None
            ]
            cs = ["tab:green" if p.passed else "tab:red" for p in points if getattr(p, key) is not None]
            ax.scatter(
                xs,
                ys,
                marker=marker,
                s=size,
                facecolors=cs if name == "search" else "none",
                edgecolors=cs,
                label=name,
                zorder=3 if name == "search" else 2,
            )
            ax.set_ylabel(label)
        y = 1.0 if name == "search" else 0.0
        cs = ["tab:green" if p.passed else "tab:red" for p in points]
        axes[0].scatter(
            [p.max_num_seqs for p in points],
            [y] * len(points),
            marker=marker,
            s=size,
            facecolors=cs if name == "search" else "none",
            edgecolors=cs,
            zorder=3,
        )
    for i, p in enumerate(pts, 1):
        axes[0].annotate(
            str(i), (p.max_num_seqs, 1.0), textcoords="offset points", xytext=(0, 9), ha="center", fontsize=8
        )
    axes[0].set_yticks([0.0, 1.0], ["grid", "search"] if grid else ["", "search"])
    axes[0].set_ylim(-0.6, 1.6)
    axes[0].set_ylabel("boots (green pass,\nred fail; n = order)")
    if result.found is not None:
        for ax in axes:
            ax.axvline(result.found.max_num_seqs, color="tab:blue", linestyle="--", linewidth=1)
        axes[0].text(
            result.found.max_num_seqs,
            -0.45,
            f" found {result.found.max_num_seqs}",
            color="tab:blue",
            fontsize=8,
        )
    axes[1].axhline(100, color="grey", linewidth=0.8)
    axes[2].set_xlabel("max_num_seqs (= stress concurrency)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].set_title(
        title
        or f"Serving-profile search: {result.boots} boots, planner start "
        f"{result.planner_start}; {result.stop_reason}",
        fontsize=9,
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
