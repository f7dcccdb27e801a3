"""What a run will do, and why: its decisions as one value (RunSteps), decided by one pure function.

:func:`decide_steps` takes the validated recipe (the format choice's, when the recipe has candidates), the
resolved base and the TP it boots at, the base reference the store holds under this run's key
(tasks/base_reference.py find_base_reference), where calibration fits beside the base's boot
(tasks/quantize.py beside_base; measured only where the base boots: :func:`boots_base`), the host and the
settings, and returns every choice with its reason: the shape measured before the download, the release
format, the base booted or reused from run X, row (b) reused, derived or booted, quantization beside the
base's accuracy run (and the gpu_memory_utilization the base is then served at), the production boot's
graphs compiled ahead, the serving profile search, the host-memory KV tier measured, and which boots are
prepared ahead. It runs once the base is resolved and its format chosen, before the base's boot or the
quantization; the flow (flows/pipeline.py) reads the value, and the report, the model card and the Prefect UI
show its lines. Two choices come before
the base resolves, from the recipe and the store alone: :func:`measures_shape` and :func:`boots_base_first`
(the base's boot prepared as the base downloads); the value records them too.

``QS_STEPS=baseline`` (core/settings.py) turns every speed-up off, for the release-time baseline
(benchmarks/scenarios/release-time.yaml): the settings QS_PREPARE_BOOTS, QS_REUSE_BASE_REFERENCE and
QS_QUANTIZE_ON_DEVICE false and vLLM's workers spawned as `vllm serve` spawns them (settings and
serving/server.py honour it), and the recipe fields :data:`BASELINE_OVERRIDES`, applied as the run's
overrides (tasks/validate.py), so the report lists them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from quantize_serve.capacity.measure import BaseBoot, boot_label
from quantize_serve.core.settings import Settings
from quantize_serve.formats.choose import FormatChoice
from quantize_serve.recipe.model import Recipe
from quantize_serve.report.base_reference import BaseReference, MeasuredRow, format_key
from quantize_serve.serving.boot import Boot
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe

# QS_STEPS=baseline: the recipe's speed-ups off, as the run's overrides: lm-eval's own echo scoring, every
# document in one look, quantize before the base (not beside its accuracy run)
BASELINE_OVERRIDES: dict[str, Any] = {
    "gates.accuracy.scoring": "echo",
    "gates.accuracy.looks": [1.0],
    "calibration.beside_base": "never",
}


def baseline_overrides(settings: Settings) -> dict[str, Any]:
    """The recipe fields QS_STEPS=baseline sets (none otherwise)."""
    return dict(BASELINE_OVERRIDES) if settings.steps == "baseline" else {}


class Step(BaseModel):
    """One choice of the run, in words: what (``choice``) and why; ``outcome``: what it did, where that is
    known only later and differs from the choice's words (compiling ahead: done, skipped or failed)."""

    model_config = ConfigDict(frozen=True)

    name: str
    choice: str
    why: str
    outcome: str | None = None

    def line(self) -> str:
        return f"{self.name}: {self.choice} ({self.why})" + (f"; {self.outcome}" if self.outcome else "")


class BesideBase(BaseModel):
    """Where calibration, the model on the device, fits beside the base's boot (tasks/quantize.py
    beside_base): whether it does, the reason in words, and the gpu_memory_utilization the base is then
    served at when not the recipe's."""

    model_config = ConfigDict(frozen=True)

    fits: bool
    why: str
    served_at: float | None = None


class RunSteps(BaseModel):
    """The run's decisions (typed, for the flow) and ``steps``, each choice with its reason in run order (for
    people: the report, the card, the UI)."""

    model_config = ConfigDict(frozen=True)

    baseline: bool = False  # QS_STEPS=baseline: every speed-up off
    preflight: bool  # serve.preflight: measure - the shape's capacity with dummy weights, before the download
    release_format: str | None = None  # quantization.candidates: the candidate the rule chose
    base_reused_from: str | None = None  # the run whose base figures are reused (None: the base is booted)
    sixteen_bit_kv: Literal["reused", "derived", "booted"]  # capacity row (b)
    sixteen_bit_kv_reused_from: str | None = None
    quantized_beside_base: bool = False  # quantized beside the base's accuracy run
    served_at: float | None = (
        None  # the base's gpu_memory_utilization beside calibration (None: the recipe's)
    )
    compile_ahead: bool = False  # the production boot's graphs compiled beside the base's accuracy run
    profile_search: bool = False  # serve.search: the largest stable max_num_seqs, before the gates
    kv_tier: bool = False  # serve.kv_offload: the production boot's host-memory tier, measured on and off
    first_boot: Boot  # the boot prepared first (its process started) while the base resolves or quantizes
    after_base: tuple[Boot, ...] = ()  # the boots prepared once the base's capacity is read
    steps: tuple[Step, ...] = ()

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def with_outcome(self, name: str, outcome: str | None) -> RunSteps:
        """The same steps, ``name``'s with what it did (None: unchanged)."""
        if outcome is None:
            return self
        steps = tuple(s.model_copy(update={"outcome": outcome}) if s.name == name else s for s in self.steps)
        return self.model_copy(update={"steps": steps})

    def lines(self) -> list[str]:
        return [s.line() for s in self.steps]

    def markdown(self) -> str:
        return "\n".join(f"- {line}" for line in self.lines())


def measures_shape(recipe: Recipe) -> bool:
    """serve.preflight: measure - the three configurations booted with dummy weights before the download."""
    return recipe.serve.preflight == "measure"


def boots_base_first(settings: Settings, stored: bool) -> bool:
    """Whether the run boots its base first whatever the base resolves to: reuse is off, or the store holds no
    reference that could be this base's (``stored``: report/base_reference.py stored_for). Known before the
    base resolves, so the base's boot can import while it downloads."""
    return not settings.reuse_base_reference or not stored


def boots_base(reference: BaseReference | None, settings: Settings) -> bool:
    """Whether the base is booted: no stored reference under this run's key, or reuse off."""
    return reference is None or not settings.reuse_base_reference


def reused_sixteen_bit_kv(recipe: Recipe, reference: BaseReference | None) -> MeasuredRow | None:
    """Row (b) a previous release of this base in this format measured (report/base_reference.py), if the
    reference holds one: marked as reused from that run wherever it is shown."""
    fmt = format_key(recipe)
    row = reference.sixteen_bit_kv.get(fmt) if reference and fmt else None
    if row is None:
        return None
    return row.model_copy(update={"capacity": row.capacity.model_copy(update={"reused_from": row.run_id})})


def decide_steps(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    base_boot: BaseBoot,
    *,
    reference: BaseReference | None,
    beside: BesideBase | None,
    gpu: bool,
    settings: Settings,
    formats: FormatChoice | None = None,
) -> RunSteps:
    """The run's decisions (module docstring). ``reference``: what the store holds under this run's key;
    ``beside``: where calibration fits beside the base (None: not measured, the base is reused); ``gpu``:
    whether this host has one (its memory is known); ``formats``: the format choice, when the recipe has
    candidates."""
    r = validated.recipe
    reused = None if boots_base(reference, settings) else reference
    row = reused_sixteen_bit_kv(r, reused)
    row_b: Literal["reused", "derived", "booted"] = (
        "reused" if row else "booted" if r.serve.sixteen_bit_kv_row == "boot" else "derived"
    )
    beside_now = reused is None and beside is not None and beside.fits
    ahead, ahead_why = compiles_ahead(r, settings, gpu=gpu, beside=beside_now)
    search = bool(r.serve.search and r.serve.search.enabled)
    boot_b = row_b == "booted"
    first = Boot.BASE if reused is None else Boot.QUANTIZED_16BIT_KV if boot_b else Boot.PRODUCTION
    after = (Boot.QUANTIZED_16BIT_KV, Boot.PRODUCTION) if boot_b else (Boot.PRODUCTION,)
    steps = (
        _preflight_step(r),
        _format_step(r, formats),
        _base_step(base, base_boot, reused, settings),
        _row_b_step(r, row),
        _quantize_step(reused, beside),
        Step(name="compile ahead", choice="yes" if ahead else "no", why=ahead_why),
        Step(
            name="serving profile search",
            choice="yes: the largest stable max_num_seqs, before the gates" if search else "no",
            why="serve.search" if search else "serve.search unset or off: the recipe's serve.max_num_seqs",
        ),
        _kv_tier_step(r),
        _prepare_step(r, settings, first, after),
    )
    return RunSteps(
        baseline=settings.steps == "baseline",
        preflight=measures_shape(r),
        release_format=formats.winner if formats else None,
        base_reused_from=reused.run_id if reused else None,
        sixteen_bit_kv=row_b,
        sixteen_bit_kv_reused_from=row.run_id if row else None,
        quantized_beside_base=beside_now,
        served_at=beside.served_at if beside_now and beside else None,
        compile_ahead=ahead,
        profile_search=search,
        kv_tier=r.serve.kv_offload is not None,
        first_boot=first,
        after_base=after,
        steps=steps,
    )


def compiles_ahead(recipe: Recipe, settings: Settings, *, gpu: bool, beside: bool) -> tuple[bool, str]:
    """Whether a run compiles the production boot's graphs ahead, beside the base's accuracy run, and why: it
    quantizes beside the base, the production boot compiles (serve.enforce_eager false), on a GPU host (on a
    CPU the compile would take the cores the base is scored on), with the boots prepared ahead
    (QS_PREPARE_BOOTS)."""
    if not beside:
        return False, "the checkpoint is not made beside the base's accuracy run"
    if recipe.serve.enforce_eager:
        return False, "serve.enforce_eager: the production boot compiles nothing"
    if not settings.prepare_boots:
        return False, _setting_off(settings, "QS_PREPARE_BOOTS")
    if not gpu:
        return False, "a CPU host: the compile would take the cores the base is scored on"
    return True, "beside the base's accuracy run once the checkpoint is saved, in the least memory it fits in"


def _setting_off(settings: Settings, name: str) -> str:
    return f"{name} is false" + (" (QS_STEPS=baseline)" if settings.steps == "baseline" else "")


def _preflight_step(r: Recipe) -> Step:
    if measures_shape(r):
        return Step(
            name="preflight",
            choice="the shape's capacity measured with dummy weights before the download",
            why="serve.preflight: measure",
        )
    return Step(name="preflight", choice="no", why="serve.preflight: off")


def _format_step(r: Recipe, formats: FormatChoice | None) -> Step:
    q = r.quantization
    if formats is not None:
        names = ", ".join(row.name for row in formats.rows if not row.reference)
        return Step(
            name="format",
            choice=f"{formats.winner} ({q.method} {q.scheme})",
            why=f"quantization.candidates: {names}, each measured; {formats.reason}",
        )
    if q.checkpoint:
        return Step(
            name="format", choice="an existing checkpoint, not quantized here", why="quantization.checkpoint"
        )
    return Step(name="format", choice=f"{q.method} {q.scheme}", why="the recipe's quantization")


def _base_step(
    base: BaseModelRef, base_boot: BaseBoot, reused: BaseReference | None, settings: Settings
) -> Step:
    if reused is not None:
        return Step(
            name="base",
            choice=f"reused from run {reused.run_id}",
            why="the same base sha, accuracy tasks, serve settings, vLLM version and hardware: its capacity "
            "row and accuracy as that run measured them",
        )
    why = (
        _setting_off(settings, "QS_REUSE_BASE_REFERENCE")
        if not settings.reuse_base_reference
        else f"no stored reference for {base.identity} under these conditions"
    )
    tp = f" at TP {base_boot.tensor_parallel_size}" + (f": {base_boot.reason}" if base_boot.reason else "")
    return Step(name="base", choice=f"booted{tp}", why=why)


def _row_b_step(r: Recipe, row: MeasuredRow | None) -> Step:
    name = f"row {boot_label(r, Boot.QUANTIZED_16BIT_KV)} (16-bit KV)"
    if row is not None:
        return Step(
            name=name,
            choice=f"reused from run {row.run_id}",
            why="an earlier release of the same base, format, serve settings, vLLM version and hardware",
        )
    if r.serve.sixteen_bit_kv_row == "boot":
        return Step(name=name, choice="booted", why="serve.sixteen_bit_kv_row: boot")
    return Step(
        name=name, choice="derived from the production boot's figures", why="serve.sixteen_bit_kv_row: derive"
    )


def _quantize_step(reused: BaseReference | None, beside: BesideBase | None) -> Step:
    name, first = "quantize", "before the boots"
    if reused is not None:
        return Step(name=name, choice=first, why="the base is reused: no boot of it to quantize beside")
    if beside is None or not beside.fits:
        return Step(name=name, choice=first, why=beside.why if beside else "calibration's room not measured")
    at = f", the base served at gpu_memory_utilization {beside.served_at:.2f}" if beside.served_at else ""
    return Step(name=name, choice=f"beside the base's accuracy run{at}", why=beside.why)


def _kv_tier_step(r: Recipe) -> Step:
    name, tier = "host-memory KV tier", r.serve.kv_offload
    if tier is None:
        return Step(name=name, choice="no", why="serve.kv_offload unset")
    size = (
        f"{tier.size_gib:g} GiB"
        if tier.size_gib is not None
        else f"{tier.host_memory_share:.0%}-of-host-memory"
        if tier.host_memory_share is not None
        else "LMCache-sized"
    )
    ships = "shipped whatever it shows" if tier.ship == "always" else "shipped only where it helps"
    return Step(
        name=name,
        choice=f"the production boot with a {size} tier ({tier.backend}), then one without it, on a "
        f"prefix-reuse workload",
        why=f"serve.kv_offload: {ships} (ship: {tier.ship})",
    )


def _prepare_step(r: Recipe, settings: Settings, first: Boot, after: tuple[Boot, ...]) -> Step:
    name = "boots prepared ahead"
    if not settings.prepare_boots:
        return Step(name=name, choice="none", why=_setting_off(settings, "QS_PREPARE_BOOTS"))
    choice = f"{boot_label(r, first)} first"
    if first is Boot.BASE:
        choice += f", then {', '.join(boot_label(r, b) for b in after)} once the base's capacity is read"
    why = "QS_PREPARE_BOOTS: each boot's imports run while the device works on the step before"
    return Step(name=name, choice=choice, why=why)
