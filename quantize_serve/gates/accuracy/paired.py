"""The accuracy gate's statistics: a paired, sequential test of recovery with stated error rates.

Pure (numpy only). docs/gates.md states the rule and why; in short:

- Base and candidate are scored on the same documents, so the recovery of a metric is a ratio of two
  means over the same documents, R = mean(num) / mean(den) (num = candidate, den = base where higher is
  better; the other way round where lower is better; per-document nats for perplexities, a scale on
  which word perplexity, byte perplexity and bits per byte are one number).
- "R <= r" is tested with the per-document differences e_i = num_i - r * den_i (Fieller's test): their
  mean is <= 0 exactly when the ratio of means is <= r, and their spread is the *paired* noise, which
  for a model and its own 4-bit copy is mostly the documents whose outcome flipped. The interval shown
  is the set of r that this test does not reject (the Fieller interval).
- For 0/1 outcomes the variance is smoothed with half a flipped document each way, so a run where no
  document flipped still has a finite interval (a 100-document task with no flip does not prove that
  no flip can happen).
- Looks: at fractions t_k of the documents the candidate passes when Z(r_bad) >= c / sqrt(t_k), the
  O'Brien-Fleming shape with c chosen so that a candidate at r_bad crosses at some look with
  probability max_false_pass; it is rejected early when Z(r_good) <= -d / sqrt(t_k), d chosen so that a
  candidate at r_good is stopped so with probability FUTILITY_SHARE of (1 - min_true_pass). The last
  look passes on the first bound alone. The constants come from a seeded simulation of the standard
  Brownian motion at the looks (deterministic).
- Groups: "true recovery" is the task's, over documents like these (new questions of the same subjects and
  new subjects). Where a task's documents come in groups (mmlu's subjects), documents of one group share
  an effect, so the variance is the clustered one (group sums, never below the per-document one).
- Perplexities: "true recovery" is the split's (the corpus lm-eval's perplexity is defined over), not a
  task's of documents like these: documents differ in length by 20x and more, and on the real model's
  per-document nats one document of 500 held 30-40% of the paired variance, so no test on a sample of
  documents kept its level for the task (docs/gates.md). The task's longest documents are scored with
  certainty at every look (documents.take_all), the others are a random sample of the rest of the split:
  the statistic is the certain documents' sum plus the sample's estimate of the others', with the finite
  population correction; a census is exact.
- The decision: a task passes when every metric it gates passes at the same look; the release when every
  task passes. :func:`task_operating_point` gives a task's joint rates (its metrics' statistics correlated
  as their per-document differences are), and the release's true pass is the product over its tasks
  (disjoint documents).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

# Of the chance to miss a good candidate, this share may be spent on early rejections (the rest is the
# last look's): early stops for a candidate that is clearly worse than r_good, never for a good one.
FUTILITY_SHARE = 0.2
# Paths of the standard Brownian motion the bounds and the achieved rates are computed on.
SIMULATED_PATHS = 200_000
SIMULATION_SEED = 20261203
# Pseudo-documents flipped each way added to the variance of 0/1 outcomes (module doc).
PSEUDO_FLIPS = 0.5
# Two-sided ~95% interval shown beside each recovery.
INTERVAL_LEVEL = 0.95
# Largest task the documents-needed search considers.
MAX_DOCS = 10_000_000


@dataclass(frozen=True)
class Paired:
    """One metric of one task, per document: the ratio's numerator and denominator series."""

    num: np.ndarray
    den: np.ndarray
    binary: bool  # 0/1 outcomes (accuracy, exact match): the variance is smoothed (module doc)
    groups: np.ndarray | None = None  # each document's group (int labels); None: independent documents
    # A perplexity's split (module doc): the documents scored with certainty (bool mask), and how many
    # documents the others are a sample of. None: the documents are a sample of the task.
    certain: np.ndarray | None = None
    population: int | None = None

    @classmethod
    def of(
        cls,
        num: list[float],
        den: list[float],
        groups: list[str] | None = None,
        *,
        certain: list[bool] | None = None,
        population: int | None = None,
    ) -> Paired:
        n, d = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
        if n.shape != d.shape or n.ndim != 1 or len(n) == 0:
            raise ValueError(
                f"paired series need one value per document on both sides, got {n.shape} and {d.shape}"
            )
        binary = bool(np.isin(n, (0.0, 1.0)).all() and np.isin(d, (0.0, 1.0)).all())
        labels = None
        if groups is not None and len(set(groups)) > 1:
            labels = np.unique(np.asarray(groups), return_inverse=True)[1]
        if population is not None:  # the split's total: its documents' groups are no sample of groups
            mask = np.zeros(len(n), dtype=bool) if certain is None else np.asarray(certain, dtype=bool)
            return cls(n, d, binary, None, mask, population)
        return cls(n, d, binary, labels)

    @property
    def docs(self) -> int:
        return len(self.num)

    def head(self, docs: int) -> Paired:
        groups = None if self.groups is None else self.groups[:docs]
        certain = None if self.certain is None else self.certain[:docs]
        return Paired(self.num[:docs], self.den[:docs], self.binary, groups, certain, self.population)

    def _expansion(self) -> np.ndarray | None:
        """Each document's weight in the split's total: 1 if scored with certainty, else the documents
        the sample stands for over the sample's size. None: the documents are a sample of the task."""
        if self.population is None or self.certain is None:
            return None
        sampled = int((~self.certain).sum())
        return np.where(self.certain, 1.0, self.population / sampled if sampled else 0.0)

    def design_effect(self, r: float) -> float:
        """The clustered variance of mean(num - r den) over the per-document one (at least 1): how much
        less a document of a group tells than an independent one. 1 without groups."""
        if self.groups is None:
            return 1.0
        present = np.unique(self.groups)
        if len(present) < 2:
            return 1.0
        c = self.num - r * self.den
        c = c - c.mean()
        per_doc = float(c @ c)
        if per_doc <= 0:
            return 1.0
        sums = np.bincount(self.groups, weights=c)[present]
        return max(1.0, float(sums @ sums) * len(present) / (len(present) - 1) / per_doc)

    @property
    def recovery(self) -> float:
        w = self._expansion()
        mean_num, mean_den = (
            (float(self.num.mean()), float(self.den.mean())) if w is None else (w @ self.num, w @ self.den)
        )
        if mean_den == 0:
            return 1.0 if mean_num == 0 else math.inf
        return float(mean_num) / float(mean_den)

    @property
    def flip_rate(self) -> float | None:
        """Share of documents whose 0/1 outcome differs (None for a continuous metric)."""
        return float((self.num != self.den).mean()) if self.binary else None

    def _augmented(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """num, den and weights (summing to 1); 0/1 outcomes as their four cells, with the smoothing
        pseudo-documents (the same moments as per document, in constant time)."""
        if not self.binary:
            return self.num, self.den, np.full(self.docs, 1 / self.docs)
        cell = (2 * self.num + self.den).astype(
            int
        )  # 0: both wrong, 1: base only, 2: candidate only, 3: both
        counts = np.bincount(cell, minlength=4).astype(float) + np.array([0, PSEUDO_FLIPS, PSEUDO_FLIPS, 0])
        num, den = np.array([0.0, 0.0, 1.0, 1.0]), np.array([0.0, 1.0, 0.0, 1.0])
        return num, den, counts / counts.sum()

    def sd_at(self, r: float) -> float:
        """Per-document standard deviation of num - r * den (the paired noise at recovery r)."""
        num, den, w = self._augmented()
        e = num - r * den
        return math.sqrt(float(w @ (e - w @ e) ** 2))

    def score_sd(self, r: float) -> float:
        """The per-document standard deviation the score statistic divides by at recovery r (its
        variance under the hypothesis "recovery = r"): what the documents needed are planned with."""
        num, den, w = self._augmented()
        return math.sqrt(_null_second_moment(num - r * den, w) * self.design_effect(r))

    def z(self, r: float) -> float:
        """The score statistic for "recovery = r": mean(num - r den) over its standard error, the
        variance taken under the hypothesis (the empirical-likelihood weights that make the mean 0).
        Estimating the variance where the hypothesis puts it, not at the observed point, is what keeps
        a test of a ratio of paired proportions at its level with few flips (Tang, Tang & Chan 2003)."""
        if self.population is not None:
            return self._split_z(r)
        num, den, w = self._augmented()
        e = num - r * den
        mean = float(w @ e)
        if mean == 0:
            return 0.0
        variance = _null_second_moment(e, w) * self.design_effect(r)  # score_sd(r) ** 2
        if variance <= 0:
            return math.copysign(math.inf, mean)
        return mean / math.sqrt(variance / self.docs)

    def _split_z(self, r: float) -> float:
        """The score statistic for "the split's recovery = r" (module doc): the certain documents' sum of
        e = num - r den is known; the sample's mean estimates the others', its variance taken under the
        hypothesis (the sample reweighted to the mean that puts the split's total at 0) with the finite
        population correction. A census (every document scored) is exact."""
        e = self.num - r * self.den
        certain = self.certain if self.certain is not None else np.zeros(self.docs, dtype=bool)
        known, sample = float(e[certain].sum()), e[~certain]
        left = self.population or 0
        if len(sample) >= left:  # every document scored: the split's own recovery
            total = known + float(sample.sum())
            if abs(total) <= 1e-9 * float(np.abs(self.num).sum() + r * np.abs(self.den).sum()):
                return 0.0
            return math.copysign(math.inf, total)
        if len(sample) < 2:
            return 0.0  # nothing yet of the documents not taken with certainty
        m0 = -known / left  # the others' mean under the hypothesis
        spread = _null_second_moment(sample - m0, np.full(len(sample), 1 / len(sample)))
        variance = spread * len(sample) / (len(sample) - 1) * (1 / len(sample) - 1 / left)
        total = known / left + float(sample.mean())
        if variance <= 0:
            return 0.0 if total == 0 else math.copysign(math.inf, total)
        return total / math.sqrt(variance)

    def interval(self, level: float = INTERVAL_LEVEL) -> tuple[float, float] | None:
        """The recoveries the two-sided score test at ``level`` does not reject; None when unbounded
        (the denominator's mean is not clearly above 0)."""
        z = NormalDist().inv_cdf(0.5 + level / 2)
        point = self.recovery
        if not math.isfinite(point) or float(self.den.mean()) <= 0:
            return None
        hi = max(point, 1.0) * 2 + 1
        if self.z(hi) > -z:
            return None
        return _root(lambda r: self.z(r) - z, 0.0, point), _root(lambda r: self.z(r) + z, point, hi)


def _null_second_moment(e: np.ndarray, w: np.ndarray) -> float:
    """E[e^2] under the reweighting of ``w`` closest to it (empirical likelihood) that has E[e] = 0;
    when no such reweighting exists (every e on one side of 0), E[e^2] under ``w`` itself."""
    if e.min() >= 0 or e.max() <= 0:
        return float(w @ e**2)
    lo, hi = -1 / e.max(), -1 / e.min()  # 1 + lam * e > 0 for every document
    lo, hi = lo + (hi - lo) * 1e-12, hi - (hi - lo) * 1e-12
    lam = _root(lambda x: float(w @ (e / (1 + x * e))), lo, hi, decreasing=True)
    p = w / (1 + lam * e)
    p /= p.sum()
    return float(p @ e**2)


def _root(f, lo: float, hi: float, *, decreasing: bool = True, steps: int = 80) -> float:  # type: ignore[no-untyped-def]
    """Bisection for f(x) = 0 on [lo, hi], f monotone (decreasing by default)."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if (f(mid) > 0) == decreasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Design:
    """The planned looks and their bounds for one pair of stated error rates."""

    fractions: tuple[float, ...]
    pass_bounds: tuple[float, ...]  # pass at look k when Z(r_bad) >= pass_bounds[k]
    stop_bounds: tuple[float, ...]  # reject early at look k when Z(r_good) <= -stop_bounds[k] (inf: never)


@lru_cache(maxsize=8)
def _brownian(fractions: tuple[float, ...], stream: int = 0) -> np.ndarray:
    """W(t_k)/sqrt(t_k) for SIMULATED_PATHS seeded paths: shape (paths, looks), each column N(0, 1).
    ``stream``: another independent set (one per metric of a task), 0 the set the bounds come from."""
    rng = np.random.default_rng(SIMULATION_SEED if stream == 0 else (SIMULATION_SEED, stream))
    steps = np.diff((0.0, *fractions))
    w = np.cumsum(rng.standard_normal((SIMULATED_PATHS, len(fractions))) * np.sqrt(steps), axis=1)
    return w / np.sqrt(np.asarray(fractions))


@lru_cache(maxsize=64)
def design(fractions: tuple[float, ...], max_false_pass: float, min_true_pass: float) -> Design:
    """The bounds of the module doc for looks at ``fractions`` of the task's limit (1.0 the limit; looks past
    it continue an undecided candidate: :func:`_continued`)."""
    planned = tuple(t for t in fractions if t <= 1.0)
    if planned != fractions:
        return _continued(
            design(planned, max_false_pass, min_true_pass), fractions, max_false_pass, min_true_pass
        )
    if len(fractions) == 1:
        return Design(fractions, (NormalDist().inv_cdf(1 - max_false_pass),), (math.inf,))
    z = _brownian(fractions)
    root_t = np.sqrt(np.asarray(fractions))
    # P(any look k: Z_k >= c / sqrt(t_k)) = P(max_k Z_k sqrt(t_k) >= c): the quantile of that maximum
    c = float(np.quantile((z * root_t).max(axis=1), 1 - max_false_pass))
    d = float(np.quantile((-z[:, :-1] * root_t[:-1]).max(axis=1), 1 - FUTILITY_SHARE * (1 - min_true_pass)))
    return Design(
        fractions, tuple(c / float(t) for t in root_t), tuple(d / float(t) for t in root_t[:-1]) + (math.inf,)
    )


def _continued(
    planned: Design, fractions: tuple[float, ...], max_false_pass: float, min_true_pass: float
) -> Design:
    """Looks past the limit: the looks before the limit keep the planned design's bounds, so a clear
    candidate stops where it did. From the limit on, the pass bound is one constant on the B-value
    Z sqrt(t) (O'Brien-Fleming's shape) that spends what the earlier looks left of max_false_pass, computed on
    the same simulated paths; no early rejection past the limit (the planned looks spent that share), so a
    candidate undecided there is scored to the last look (docs/gates.md has what it changes)."""
    z = _brownian(fractions)
    early = len(planned.fractions) - 1  # looks before the limit
    crossed = (z[:, :early] >= np.asarray(planned.pass_bounds[:early])).any(axis=1)
    late = np.where(crossed, -np.inf, (z[:, early:] * np.sqrt(np.asarray(fractions[early:]))).max(axis=1))
    c = float(np.quantile(late, 1 - (max_false_pass - crossed.mean())))
    root_t = np.sqrt(np.asarray(fractions[early:]))
    return Design(
        fractions,
        planned.pass_bounds[:early] + tuple(c / float(t) for t in root_t),
        planned.stop_bounds[:early] + (math.inf,) * len(root_t),
    )


@dataclass(frozen=True)
class LookVerdict:
    decided: bool  # the metric's decision is clear at this look (always at the last)
    passed: bool


def look_verdict(pair: Paired, d: Design, look: int, bad: float, good: float) -> LookVerdict:
    """The decision of one metric at look index ``look`` of design ``d`` (module doc)."""
    if pair.z(bad) >= d.pass_bounds[look]:
        return LookVerdict(True, True)
    last = look == len(d.fractions) - 1
    if last or pair.z(good) <= -d.stop_bounds[look]:
        return LookVerdict(True, False)
    return LookVerdict(False, False)


def task_verdict(pairs: list[Paired], d: Design, look: int, bad: float, good: float) -> LookVerdict:
    """The decision of a task at look index ``look``: decided when every metric passes already or one is
    rejected; passed when every metric passed."""
    verdicts = [look_verdict(p, d, look, bad, good) for p in pairs]
    decided = all(v.decided and v.passed for v in verdicts) or any(
        v.decided and not v.passed for v in verdicts
    )
    return LookVerdict(decided, all(v.passed for v in verdicts))


@dataclass(frozen=True)
class OperatingPoint:
    """What the design achieves on a task with ``docs`` documents and this paired noise."""

    false_pass: float  # chance to pass a candidate at r_bad
    true_pass: float  # chance to pass a candidate at r_good
    docs_needed: int | None  # documents for min_true_pass (None: none up to MAX_DOCS)


def _paths(fractions: tuple[float, ...], corr: np.ndarray | None) -> np.ndarray:
    """The metrics' statistics at the looks under no drift, shape (metrics, paths, looks): standard
    Brownian paths correlated as ``corr`` (None: one metric)."""
    if corr is None or len(corr) == 1:
        return _brownian(fractions)[None]
    values, vectors = np.linalg.eigh(corr)
    root = vectors * np.sqrt(np.clip(values, 0.0, None))  # root @ root.T = corr (nearest PSD)
    root /= np.linalg.norm(root, axis=1, keepdims=True)  # unit variance each
    independent = np.stack([_brownian(fractions, j) for j in range(len(corr))])
    return np.einsum("ij,jpl->ipl", root, independent)


def _pass_probability(
    d: Design,
    docs: int,
    drift_bad: np.ndarray,
    gap: np.ndarray,
    corr: np.ndarray | None = None,
    scale: np.ndarray | None = None,
) -> float:
    """The chance a task passes: every metric's statistic for "R <= bad" crosses the pass bound at one
    look before any metric's statistic for "R >= good" falls below the stop bound (look_verdict per
    metric, task_decided over them). ``drift_bad``: each metric's (true R - bad) * unit; ``gap``: its
    (good - bad) * unit, unit = mean_den / sd; ``scale``: each statistic's sd at the true recovery (1 at
    bad, where the statistic's variance is the one it assumes)."""
    z = _paths(d.fractions, corr)
    if scale is not None:
        z = z * np.asarray(scale, dtype=float)[:, None, None]
    root_n = np.sqrt(np.asarray(d.fractions) * docs)
    z_bad = z + np.asarray(drift_bad, dtype=float)[:, None, None] * root_n
    z_good = z_bad - np.asarray(gap, dtype=float)[:, None, None] * root_n
    crossed = z_bad >= np.asarray(d.pass_bounds)
    every = crossed.all(axis=0)
    stopped = (~crossed & (z_good <= -np.asarray(d.stop_bounds))).any(axis=0)
    alive = np.ones(every.shape[0], dtype=bool)
    passed = np.zeros(every.shape[0], dtype=bool)
    for k in range(len(d.fractions)):
        passed |= alive & every[:, k]
        alive &= ~every[:, k] & ~stopped[:, k]
    return float(passed.mean())


def operating_point(
    d: Design, docs: int, *, sd: float, mean_den: float, bad: float, good: float, min_true_pass: float
) -> OperatingPoint:
    """False- and true-pass rates of design ``d`` on ``docs`` documents whose paired noise is ``sd``
    per document and whose denominator averages ``mean_den``; and the documents min_true_pass needs."""
    return task_operating_point(
        d, docs, [(sd, mean_den, sd)], None, bad=bad, good=good, min_true_pass=min_true_pass
    )


def _noisy(noise: list[tuple[float, float, float]]) -> list[int]:
    return [i for i, (sd, mean_den, _) in enumerate(noise) if sd > 0 and mean_den > 0]


def _task_pass(
    d: Design, noise: list[tuple[float, float, float]], corr: np.ndarray | None, bad: float, good: float
) -> Callable[[int, int | None], float]:
    """pass(docs, i): the chance the task passes on ``docs`` documents with metric i at ``bad`` and the
    others at ``good`` (i None: every metric at good); metrics without noise left out (they pass at good)."""
    noisy = _noisy(noise)
    gap = np.array([(good - bad) * noise[i][1] / noise[i][0] for i in noisy])
    sub = None if corr is None or len(noisy) == 1 else np.asarray(corr)[np.ix_(noisy, noisy)]
    spread = np.array([min(1.0, noise[i][2] / noise[i][0]) for i in noisy])

    def passes(docs: int, at_bad: int | None) -> float:
        drift, at = gap.copy(), spread.copy()
        if at_bad is not None:
            drift[at_bad], at[at_bad] = 0.0, 1.0
        return _pass_probability(d, docs, drift, gap, sub, at)

    return passes


def task_true_pass(
    d: Design,
    docs: int,
    noise: list[tuple[float, float, float]],
    corr: np.ndarray | None,
    *,
    bad: float,
    good: float,
) -> float:
    """The chance design ``d`` passes a task whose every metric is at ``good`` (task_operating_point)."""
    return _task_pass(d, noise, corr, bad, good)(docs, None) if _noisy(noise) else 1.0


def task_operating_point(
    d: Design,
    docs: int,
    noise: list[tuple[float, float, float]],
    corr: np.ndarray | None,
    *,
    bad: float,
    good: float,
    min_true_pass: float,
) -> OperatingPoint:
    """What design ``d`` achieves for a task that gates the metrics of ``noise`` (each: the statistic's
    per-document sd at bad, the denominator's mean, and the sd of num - bad den where the candidate is: the
    statistic's spread for a good candidate), their statistics correlated as ``corr``: the chance
    to pass a candidate at ``bad`` on one metric (the largest over the metrics: the others at good), the
    chance to pass one at ``good`` on every metric, and the documents ``min_true_pass`` of the latter
    needs. A metric without noise is decided by its point alone and always passes at good."""
    noisy = _noisy(noise)
    if not noisy:
        zero = np.zeros(1)
        return OperatingPoint(
            false_pass=_pass_probability(d, max(docs, 1), zero, zero), true_pass=1.0, docs_needed=1
        )
    passes = _task_pass(d, noise, corr, bad, good)
    needed: int | None = None
    if passes(MAX_DOCS, None) >= min_true_pass:
        lo, hi = 1, MAX_DOCS
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if passes(mid, None) < min_true_pass else (lo, mid)
        needed = lo
    return OperatingPoint(
        false_pass=max(passes(docs, i) for i in range(len(noisy))),
        true_pass=passes(docs, None),
        docs_needed=needed,
    )


def correlation(pairs: list[Paired], r: float) -> np.ndarray:
    """The correlation of the metrics' per-document differences num - r den over their shared documents:
    the correlation of their statistics (0 where a metric does not vary)."""
    e = np.stack([p.num - r * p.den for p in pairs])
    e = e - e.mean(axis=1, keepdims=True)
    norms = np.sqrt((e * e).sum(axis=1))
    norms[norms == 0] = np.inf
    corr = (e @ e.T) / np.outer(norms, norms)
    np.fill_diagonal(corr, 1.0)
    return corr


@dataclass(frozen=True)
class Simulated:
    pass_rate: float
    mean_docs: float  # documents the candidate was scored on, on average


def synthetic_pairs(
    rng: np.random.Generator, *, docs: int, base_accuracy: float, flip_rate: float, recovery: float
) -> Paired:
    """``docs`` paired 0/1 outcomes: the base right with probability ``base_accuracy``, a share
    ``flip_rate`` of the documents flipped so that the candidate's true recovery is ``recovery``."""
    p10 = (flip_rate - (recovery - 1) * base_accuracy) / 2  # base right, candidate wrong
    p01 = flip_rate - p10
    if min(p10, p01) < 0 or base_accuracy < p10 or 1 - base_accuracy < p01:
        raise ValueError(f"flip rate {flip_rate} cannot give recovery {recovery} at accuracy {base_accuracy}")
    base = rng.random(docs) < base_accuracy
    u = rng.random(docs)
    flip = np.where(base, u < p10 / base_accuracy, u < p01 / (1 - base_accuracy))
    return Paired((base ^ flip).astype(float), base.astype(float), True)


def simulate_gate(
    *,
    docs: int,
    base_accuracy: float,
    flip_rate: float,
    recovery: float,
    fractions: tuple[float, ...],
    bad: float,
    max_false_pass: float,
    good: float,
    min_true_pass: float,
    trials: int,
    seed: int,
) -> Simulated:
    """The implemented rule (look_verdict at each look) on synthetic paired 0/1 outcomes: ``docs``
    documents, the base right with probability ``base_accuracy``, a share ``flip_rate`` of them flipped
    so that the candidate's true recovery is ``recovery``. How often it passes, on how many documents."""

    def draw(rng: np.random.Generator) -> list[Paired]:
        return [
            synthetic_pairs(
                rng, docs=docs, base_accuracy=base_accuracy, flip_rate=flip_rate, recovery=recovery
            )
        ]

    d = design(fractions, max_false_pass, min_true_pass)
    return simulate_task(draw, d, bad=bad, good=good, trials=trials, seed=seed)


def simulate_task(
    draw: Callable[[np.random.Generator], list[Paired]],
    d: Design,
    *,
    bad: float,
    good: float,
    trials: int,
    seed: int,
) -> Simulated:
    """The implemented rule for a task's decision (every metric's look_verdict at each look, as
    recovery.task_decided and compare_accuracy take them) on ``trials`` draws of the task's metrics."""
    rng = np.random.default_rng(seed)
    passed = used = 0
    for _ in range(trials):
        pairs = draw(rng)
        docs = pairs[0].docs / d.fractions[-1]  # the limit's (looks past it continue to the draw's end)
        for look, t in enumerate(d.fractions):
            n = round(t * docs)
            verdict = task_verdict([p.head(n) for p in pairs], d, look, bad, good)
            if verdict.decided:
                passed += verdict.passed
                used += n
                break
    return Simulated(pass_rate=passed / trials, mean_docs=used / trials)


def synthetic_task(
    rng: np.random.Generator,
    *,
    docs: int,
    base_accuracy: float,
    flip_rate: float,
    recoveries: tuple[float, ...],
    agreement: float = 1.0,
    groups: int = 1,
    group_spread: float = 0.0,
) -> list[Paired]:
    """A task's metrics on ``docs`` shared documents (synthetic_pairs' model per metric at its recovery):
    the second and later metrics agree with the first on a share ``agreement`` of the documents and are
    drawn afresh on the rest (acc and acc_norm, strict and flexible match). With ``groups`` > 1 the
    documents come in equal groups (mmlu's subjects) whose recovery is the metric's plus a uniform shift in
    [-group_spread, group_spread], drawn per task: the subjects are a sample too."""
    size = docs // groups
    labels = np.tile(np.arange(groups), size)  # interleaved: every look holds a share of every group

    def metric(recovery: float, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        num, den = np.empty((size, groups)), np.empty((size, groups))
        for g in range(groups):  # synthetic_pairs refuses a shift the flip rate cannot give
            pair = synthetic_pairs(
                rng, docs=size, base_accuracy=base_accuracy, flip_rate=flip_rate, recovery=recovery + shift[g]
            )
            num[:, g], den[:, g] = pair.num, pair.den
        return num.ravel(), den.ravel()

    shifts = rng.uniform(-group_spread, group_spread, groups)  # symmetric: the task's recovery stays
    first = metric(recoveries[0], shifts)
    out = [Paired(*first, True, labels if groups > 1 else None)]
    for recovery in recoveries[1:]:
        fresh = metric(recovery, shifts)
        keep = rng.random(len(labels)) < agreement
        num, den = np.where(keep, first[0], fresh[0]), np.where(keep, first[1], fresh[1])
        out.append(Paired(num, den, True, labels if groups > 1 else None))
    return out
