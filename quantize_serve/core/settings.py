"""Process-level settings (paths, ports, timeouts), separate from a run's recipe.

They describe *where* the pipeline runs, not *what* it does, so they come from the environment
(prefix ``QS_``) and never from a recipe file.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QS_", extra="ignore")

    serving_python: Path = Field(
        default=PROJECT_ROOT / ".venv-serve" / "bin" / "python",
        description="Python of the serving environment (the one with vLLM installed). Point it at "
        "an existing vLLM install, e.g. QS_SERVING_PYTHON=/opt/venv/bin/python in a vLLM image.",
    )
    pipeline_python: Path = Field(
        default=Path(sys.executable),
        description="Python that runs llm-compressor in its child process (this environment).",
    )
    runs_dir: Path = Field(default=PROJECT_ROOT / "runs", description="Where run folders go.")
    work_dir: Path = Field(
        default=PROJECT_ROOT / ".cache" / "work",
        description="Checkpoints and caches, keyed by their inputs, reused across runs.",
    )
    server_host: str = Field(default="127.0.0.1", description="Address the vLLM servers listen on.")
    server_boot_timeout_s: float = Field(
        default=600.0, gt=0, description="Seconds a vLLM server may take to become healthy."
    )
    server_stop_timeout_s: float = Field(
        default=20.0, gt=0, description="Seconds a vLLM server is given to stop before it is killed."
    )
    reuse_base_reference: bool = Field(
        default=True,
        description="Take a known base's capacity row (a) and base accuracy from a previous "
        "run when base sha, tasks, serve settings, vLLM version and hardware all match "
        "(report/base_reference.py), instead of booting the base again.",
    )
    quantize_on_device: bool = Field(
        default=True,
        description="On a GPU host, load the whole model and keep llm-compressor's calibration "
        "activations on the GPU when both fit its free memory (quantize/worker.py placement); false: "
        "llm-compressor's default placement, the model on the CPU and onloaded one layer at a time.",
    )
    prepare_boots: bool = Field(
        default=True,
        description="Start the next vLLM boot's process (its imports) while the device "
        "works on something else (serving/server.py prepare_server), the quantization worker (its imports) "
        "as the run validates (quantize/run.py prepare_worker), and an accuracy run's lm-eval imports "
        "and task index while its server boots (tasks/accuracy.py prepare_accuracy).",
    )
    ahead_as_on_gpu: bool = Field(
        default=False,
        description="Take the work-ahead paths of a GPU host on any host: the calibration count started as "
        "the run validates and counted before the base boots (tasks/quantize.py), without changing what a "
        "CPU host decides. For testing those paths where no GPU is (the flows tier: test_flow.py, "
        "test_cli.py).",
    )
    gpu_concurrency_limit: str = Field(
        default="gpu", description="Prefect global concurrency limit that serialises GPU stages."
    )
    steps: Literal["fast", "baseline"] = Field(
        default="fast",
        description="baseline: every speed-up off, for the release-time baseline "
        "(benchmarks/scenarios/release-time.yaml): QS_PREPARE_BOOTS, QS_REUSE_BASE_REFERENCE and "
        "QS_QUANTIZE_ON_DEVICE false, vLLM's workers spawned as `vllm serve` spawns them, and the recipe's "
        "speed-ups off as the run's overrides (report/steps.py BASELINE_OVERRIDES: lm-eval's echo scoring, "
        "every document in one look, quantize before the base). The report's steps say so.",
    )

    @model_validator(mode="after")
    def _baseline_turns_the_speed_ups_off(self) -> Settings:
        if self.steps == "baseline":
            self.prepare_boots = self.reuse_base_reference = self.quantize_on_device = False
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
