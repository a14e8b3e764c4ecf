"""Uncertainty of a statistic over drives: a cluster bootstrap over scenarios, and a three-way decision against a
band."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import numpy as np

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap percentile interval at ``level``; NaN bounds when no replicate had a value."""

    estimate: float
    low: float
    high: float
    level: float
    undefined: float = 0.0

    def as_dict(self) -> dict:
        """JSON-ready: NaN becomes None."""
        clean = {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in self.__dict__.items()}
        return clean

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class Bootstrap:
    """The replicates of a cluster bootstrap: ``draws`` resamplings of the scenarios, drawn from ``seed``."""

    draws: int = 2000
    seed: int = 0
    level: float = 0.95

    def __post_init__(self) -> None:
        if not (isinstance(self.draws, int) and self.draws >= 10):
            raise ValueError(f"bootstrap draws must be an integer >= 10 (got {self.draws!r})")
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"bootstrap level must lie in (0, 1) (got {self.level!r})")

    def weights(self, clusters: int) -> np.ndarray:
        """``[draws, clusters]``: how often each scenario is drawn in each replicate."""
        drawn = np.random.default_rng([self.seed, clusters]).integers(clusters, size=(self.draws, clusters))
        drawn += clusters * np.arange(self.draws)[:, None]  # a bin per (replicate, scenario)
        return np.bincount(drawn.ravel(), minlength=self.draws * clusters).reshape(self.draws, clusters).astype(float)

    def interval(self, estimate: float, replicates: np.ndarray) -> Interval:
        """The percentile interval of ``replicates [draws]`` (NaN: undefined) around ``estimate``."""
        replicates = np.asarray(replicates, dtype=np.float64)
        defined = replicates[np.isfinite(replicates)]
        undefined = 1.0 - len(defined) / len(replicates)
        if not len(defined):
            return Interval(float(estimate), float("nan"), float("nan"), self.level, undefined)
        tail = (1.0 - self.level) / 2
        low, high = np.quantile(defined, [tail, 1.0 - tail])
        return Interval(float(estimate), float(low), float(high), self.level, undefined)


@dataclass(frozen=True)
class Clusters:
    """Records (drives, steps) grouped by their scenario: ``index[i]`` is record i's scenario among ``labels``."""

    index: np.ndarray  # [N] int in [0, len(labels))
    labels: tuple

    @classmethod
    def of(cls, scenarios: Sequence[Hashable]) -> "Clusters":
        """The clusters of per-record scenario labels (any hashable values), in order of first appearance."""
        order: dict = {}
        index = np.array([order.setdefault(label, len(order)) for label in scenarios], dtype=np.int64)
        return cls(index, tuple(order))

    @property
    def size(self) -> int:
        return len(self.labels)

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Per-scenario sums ``[C, ...]`` of per-record ``values [N, ...]``."""
        values = np.asarray(values, dtype=np.float64)
        if len(values) != len(self.index):
            raise ValueError(f"{len(values)} values for {len(self.index)} records")
        out = np.zeros((self.size,) + values.shape[1:])
        np.add.at(out, self.index, values)
        return out


def cluster_interval(statistic: Callable[[np.ndarray], np.ndarray], clusters: Clusters,
                     bootstrap: Bootstrap = Bootstrap()) -> Interval:
    """The interval of ``statistic(w [R, C]) -> [R]`` over scenario weights (NaN where undefined)."""
    estimate = statistic(np.ones((1, clusters.size)))[0]
    return bootstrap.interval(estimate, statistic(bootstrap.weights(clusters.size)))


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), np.nan)


def mean(scenarios: Sequence[Hashable], values: np.ndarray, bootstrap: Bootstrap = Bootstrap()) -> Interval:
    """The mean of per-drive ``values`` (NaN: a drive without a value, left out) with its interval."""
    values = np.asarray(values, dtype=np.float64)
    clusters = Clusters.of(scenarios)
    finite = np.isfinite(values)
    sums, counts = clusters.sums(np.where(finite, values, 0.0)), clusters.sums(finite)
    return cluster_interval(lambda w: _ratio(w @ sums, w @ counts), clusters, bootstrap)


def paired_difference(scenarios: Sequence[Hashable], world: np.ndarray, truth: np.ndarray,
                      bootstrap: Bootstrap = Bootstrap()) -> Interval:
    """The mean over drives of ``world - truth``, each drive paired by the caller; NaN pairs left out."""
    world, truth = np.asarray(world, dtype=np.float64), np.asarray(truth, dtype=np.float64)
    if world.shape != truth.shape:
        raise ValueError(f"paired values differ in shape: world {world.shape}, truth {truth.shape}")
    return mean(scenarios, world - truth, bootstrap)


def policies_median_difference(scenarios: Sequence[Hashable], policies: Sequence[Hashable], world: np.ndarray,
                                truth: np.ndarray, bootstrap: Bootstrap = Bootstrap()) -> Interval:
    """The median over policies of each policy's mean ``world - truth``, with its interval over scenarios."""
    difference = np.asarray(world, dtype=np.float64) - np.asarray(truth, dtype=np.float64)
    if not len(scenarios) == len(policies) == len(difference):
        raise ValueError(f"{len(scenarios)} scenarios, {len(policies)} policies and {len(difference)} values: one each "
                         "per drive")
    names = list(dict.fromkeys(policies))
    onehot = np.array([names.index(p) for p in policies])[:, None] == np.arange(len(names))
    finite = np.isfinite(difference)[:, None]
    clusters = Clusters.of(scenarios)
    sums = clusters.sums(onehot * np.where(finite, difference[:, None], 0.0))
    counts = clusters.sums(onehot * finite)

    def median(weights: np.ndarray) -> np.ndarray:
        means = _ratio(weights @ sums, weights @ counts)  # [R, policies]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a replicate without any policy's drive: NaN
            return np.nanmedian(means, axis=1)

    return cluster_interval(median, clusters, bootstrap)


def regression_slope(scenarios: Sequence[Hashable], x: np.ndarray, y: np.ndarray, intercept: bool,
                     bootstrap: Bootstrap = Bootstrap()) -> Interval:
    """Least-squares slope of ``y`` on ``x``: ``sum(xy) / sum(xx)``, or ``cov(x, y) / var(x)`` with ``intercept``."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"x {x.shape} and y {y.shape} differ in shape")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = np.where(keep, x, 0.0), np.where(keep, y, 0.0)
    clusters = Clusters.of(scenarios)
    sums = clusters.sums(np.stack([keep, x, y, x * x, x * y], axis=-1))  # [C, 5]

    def slope(w: np.ndarray) -> np.ndarray:
        n, sx, sy, sxx, sxy = (w @ sums).T
        if not intercept:
            return _ratio(sxy, np.where(n > 0, sxx, 0.0))
        spread = n * sxx - sx * sx  # n^2 var(x): no spread (up to rounding) leaves the slope undefined
        return _ratio(n * sxy - sx * sy, np.where(spread > 1e-12 * n * sxx, spread, 0.0))

    return cluster_interval(slope, clusters, bootstrap)


def within_slope(scenarios: Sequence[Hashable], groups: Sequence[Hashable], x: np.ndarray, y: np.ndarray,
                 bootstrap: Bootstrap = Bootstrap()) -> Interval:
    """Least-squares slope of ``y`` on ``x`` with an intercept of its own for each group (a drive)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if not len(scenarios) == len(groups) == len(x) == len(y):
        raise ValueError(f"{len(scenarios)} scenarios, {len(groups)} groups, {len(x)} x and {len(y)} y: one each per "
                         "record")
    keep = np.isfinite(x) & np.isfinite(y)
    group = Clusters.of(groups)
    if len({(g, s) for g, s in zip(group.index, scenarios)}) != group.size:
        raise ValueError("a group spans several scenarios: groups must be nested in scenarios")
    count = group.sums(keep)
    centred = []
    for values in (x, y):
        values = np.where(keep, values, 0.0)
        centred.append(np.where(keep, values - _ratio(group.sums(values), count)[group.index], np.nan))
    return regression_slope(scenarios, centred[0], centred[1], False, bootstrap)


@dataclass(frozen=True)
class DriveValues:
    """One world's per-drive values of a metric with each drive's scenario and policy."""

    scenario: Sequence[Hashable]
    policy: Sequence[Hashable]
    value: np.ndarray

    def __post_init__(self) -> None:
        if not len(self.scenario) == len(self.policy) == len(self.value):
            raise ValueError(f"{len(self.scenario)} scenarios, {len(self.policy)} policies and {len(self.value)} "
                             "values: one each per drive")


@dataclass(frozen=True)
class RankAgreement:
    """How two worlds rank the policies by their mean metric."""

    policies: tuple
    means_a: np.ndarray  # [P] per-policy mean in world a
    means_b: np.ndarray
    kendall_tau: Interval
    spearman_rho: Interval
    pearson_r: Interval
    mmrv: Interval


def kendall_tau_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Kendall's tau-b between the rows of ``a`` and ``b`` ``[R, P]``; NaN for a row with a NaN or no spread."""
    upper = np.triu_indices(a.shape[1], 1)
    sa = np.sign(a[:, :, None] - a[:, None, :])[:, upper[0], upper[1]]
    sb = np.sign(b[:, :, None] - b[:, None, :])[:, upper[0], upper[1]]
    return _ratio((sa * sb).sum(1), np.sqrt(np.abs(sa).sum(1) * np.abs(sb).sum(1)))


def spearman_rho_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rho between the rows of ``a`` and ``b`` ``[R, P]`` (Pearson's r of average ranks)."""
    from scipy.stats import rankdata

    ra, rb = rankdata(a, axis=1), rankdata(b, axis=1)
    ra, rb = ra - ra.mean(1, keepdims=True), rb - rb.mean(1, keepdims=True)
    rho = _ratio((ra * rb).sum(1), np.sqrt((ra * ra).sum(1) * (rb * rb).sum(1)))
    return np.where(np.isnan(a).any(1) | np.isnan(b).any(1), np.nan, rho)


def pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson's r between the rows of ``a`` and ``b`` ``[R, P]``; NaN for a row with a NaN or without spread."""
    ca, cb = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
    return _ratio((ca * cb).sum(1), np.sqrt((ca * ca).sum(1) * (cb * cb).sum(1)))


def mmrv_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mean maximum rank violation of ``a`` against reference ``b``, rows ``[R, P]``: 0 faithful, 1 the worst."""
    gap = np.abs(b[:, :, None] - b[:, None, :])
    violated = (a[:, :, None] < a[:, None, :]) != (b[:, :, None] < b[:, None, :])
    worst = np.where(violated, gap, 0.0).max(2).mean(1)
    spread = np.ptp(b, axis=1)
    bad = np.isnan(a).any(1) | np.isnan(b).any(1)
    return np.where(bad, np.nan, _ratio(worst, np.where(bad, 0.0, spread)))


def rank_agreement(a: DriveValues, b: DriveValues, bootstrap: Bootstrap = Bootstrap()) -> RankAgreement:
    """Kendall's tau, Spearman's rho, Pearson's r and MMRV of two worlds' per-policy means, with intervals."""
    from scipy.stats import kendalltau, pearsonr, spearmanr

    policies = tuple(dict.fromkeys([*a.policy, *b.policy]))
    if len(policies) < 3:
        raise ValueError(f"a rank correlation needs at least 3 policies (got {len(policies)})")
    clusters = Clusters.of([*a.scenario, *b.scenario])
    split = len(a.value)
    sums = []
    for part, values in ((slice(None, split), a), (slice(split, None), b)):
        onehot = (np.array([policies.index(p) for p in values.policy])[:, None] == np.arange(len(policies)))
        value = np.asarray(values.value, dtype=np.float64)
        finite = np.isfinite(value)[:, None]
        index = Clusters(clusters.index[part], clusters.labels)
        sums.append((index.sums(onehot * np.where(finite, value[:, None], 0.0)), index.sums(onehot * finite)))

    def means(w: np.ndarray) -> list[np.ndarray]:
        return [_ratio(w @ total, w @ count) for total, count in sums]

    point_a, point_b = (m[0] for m in means(np.ones((1, clusters.size))))
    defined = not (np.isnan(point_a).any() or np.isnan(point_b).any() or np.ptp(point_a) == 0 or np.ptp(point_b) == 0)
    tau = float(kendalltau(point_a, point_b).statistic) if defined else float("nan")
    rho = float(spearmanr(point_a, point_b).statistic) if defined else float("nan")
    r = float(pearsonr(point_a, point_b).statistic) if defined else float("nan")
    violation = float(mmrv_rows(point_a[None], point_b[None])[0])
    ma, mb = means(bootstrap.weights(clusters.size))
    return RankAgreement(policies, point_a, point_b, bootstrap.interval(tau, kendall_tau_rows(ma, mb)),
                         bootstrap.interval(rho, spearman_rho_rows(ma, mb)),
                         bootstrap.interval(r, pearson_rows(ma, mb)), bootstrap.interval(violation, mmrv_rows(ma, mb)))


def few_clusters_factor(clusters: int, level: float = 0.95) -> float:
    """The factor ``sqrt(C / (C - 1)) t_{C-1} / z`` that widens a bootstrap interval over ``clusters`` scenarios."""
    from scipy.stats import norm, t

    if clusters < 2:
        return float("inf")
    tail = (1.0 + level) / 2
    return float(np.sqrt(clusters / (clusters - 1)) * t.ppf(tail, clusters - 1) / norm.ppf(tail))


def widened(interval: Interval, factor: float) -> Interval:
    """``interval`` with each side's distance from the estimate multiplied by ``factor``."""
    if not np.isfinite(factor) or not np.isfinite(interval.estimate):
        return Interval(interval.estimate, float("nan"), float("nan"), interval.level, interval.undefined)
    low = interval.estimate - factor * (interval.estimate - interval.low)
    high = interval.estimate + factor * (interval.high - interval.estimate)
    return Interval(interval.estimate, float(low), float(high), interval.level, interval.undefined)


def decide(interval: Interval, band: tuple[float, float]) -> str:
    """``pass`` inside the band ``[low, high]``, ``fail`` entirely outside, else ``inconclusive``."""
    low, high = band
    if not low <= high:
        raise ValueError(f"acceptance band must have low <= high (got [{low}, {high}])")
    if not (np.isfinite(interval.low) and np.isfinite(interval.high)):
        return INCONCLUSIVE
    if low <= interval.low and interval.high <= high:
        return PASS
    if interval.high < low or interval.low > high:
        return FAIL
    return INCONCLUSIVE
