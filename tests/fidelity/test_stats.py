"""The cluster bootstrap's intervals cover the truth at their level on data with known truth, and the same intervals
computed the wrong way (drives resampled as if independent) do not; rank correlations equal scipy's; the decision
rule on constructed intervals.

Coverage tests count, over simulated data sets, how often the 95 % interval holds the true value, and accept
[0.90, 0.99]. Each simulation is seeded, so the test is deterministic; its false-alarm rate is the chance that a
correct implementation falls outside the tolerance for a random seed, from the coverage measured over 2,000 data
sets (stated per test).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import binom, kendalltau, pearsonr, spearmanr

from terra.stats import (FAIL, INCONCLUSIVE, PASS, Bootstrap, Clusters, DriveValues, Interval, decide,
                                  kendall_tau_rows, mean, paired_difference, rank_agreement,
                                  regression_slope, spearman_rho_rows, within_slope)
from terra.stats import few_clusters_factor, mmrv_rows, pearson_rows, policies_median_difference, widened

TOLERANCE = (0.90, 0.99)


def correlated_drives(rng: np.random.Generator, scenarios: int = 40, per_scenario: int = 6, truth: float = 1.0):
    """Drives whose values share a scenario effect (intra-scenario correlation 0.5), true mean ``truth``."""
    scenario = np.repeat(np.arange(scenarios), per_scenario)
    values = truth + rng.normal(0, 1, scenarios)[scenario] + rng.normal(0, 1, len(scenario))
    return scenario, values


def coverage_of_mean(resample_drives: bool, datasets: int = 200) -> float:
    rng = np.random.default_rng(123)
    hits = 0
    for i in range(datasets):
        scenario, values = correlated_drives(rng)
        units = np.arange(len(values)) if resample_drives else scenario
        interval = mean(units, values, Bootstrap(seed=i))
        hits += interval.low <= 1.0 <= interval.high
    return hits / datasets


def test_the_interval_of_a_mean_over_scenarios_covers_the_truth():
    """Over 2,000 data sets the coverage is 0.9435; P(Binomial(200, 0.9435) outside [180, 198]) = 0.5 %."""
    assert binom.cdf(179, 200, 0.9435) + binom.sf(198, 200, 0.9435) < 0.006
    assert TOLERANCE[0] <= coverage_of_mean(resample_drives=False) <= TOLERANCE[1]


def test_resampling_drives_instead_of_scenarios_under_covers():
    """The wrong bootstrap ignores the scenario effect: its intervals are too narrow by about sqrt(3.5) (the design
    effect of 6 drives at correlation 0.5), coverage 0.71 over 2,000 data sets, far below the tolerance: over 100
    data sets it reaches 0.85 with probability 8e-4."""
    assert binom.sf(84, 100, 0.71) < 1e-3
    assert coverage_of_mean(resample_drives=True, datasets=100) < 0.85


def test_the_interval_of_a_regression_slope_covers_the_truth():
    """Scenarios with gains of their own (mean 1): over 2,000 data sets the coverage is 0.9335 through the origin
    and 0.9405 with an intercept; with 400 data sets the false-alarm rate is below 0.5 % for each."""
    datasets = 400
    for p in (0.9335, 0.9405):
        assert binom.cdf(0.90 * datasets - 1, datasets, p) + binom.sf(0.99 * datasets, datasets, p) < 0.005
    rng = np.random.default_rng(7)
    hits = np.zeros(2)
    for i in range(datasets):
        scenario = np.repeat(np.arange(30), 20)
        gain = 1.0 + rng.normal(0, 0.2, 30)
        x = rng.uniform(0, 2, len(scenario))
        y = gain[scenario] * x + rng.normal(0, 0.3, len(scenario))
        for k, intercept in enumerate((False, True)):
            interval = regression_slope(scenario, x, y, intercept, Bootstrap(seed=i))
            hits[k] += interval.low <= 1.0 <= interval.high
    assert np.all((TOLERANCE[0] <= hits / datasets) & (hits / datasets <= TOLERANCE[1])), hits / datasets


def test_slopes_through_the_origin_and_with_an_intercept():
    x = np.arange(10.0)
    scenario = np.arange(10) // 2
    assert regression_slope(scenario, x, 2 * x, intercept=False).estimate == pytest.approx(2.0)
    with_offset = regression_slope(scenario, x, 2 * x + 5, intercept=True)
    assert with_offset.estimate == pytest.approx(2.0) and with_offset.low == pytest.approx(2.0)
    assert regression_slope(scenario, x, 2 * x + 5, intercept=False).estimate > 2.5  # the offset leaks in
    frozen = regression_slope(scenario, x, np.full(10, 3.0), intercept=True)
    assert frozen.estimate == pytest.approx(0.0, abs=1e-12)
    constant_x = regression_slope(scenario, np.ones(10), x, intercept=True)
    assert np.isnan(constant_x.estimate) and constant_x.undefined == 1.0
    nan_pairs = regression_slope(np.r_[scenario, 4], np.r_[x, np.nan], np.r_[2 * x, 7.0], intercept=False,
                                 bootstrap=Bootstrap(draws=50))
    assert nan_pairs.estimate == pytest.approx(2.0)


def test_the_within_slope_ignores_differences_between_groups():
    """Per-group constants that follow the groups' means (a frozen world's lane reading: each drive reads where it
    started) have a pooled slope far from 0 and a within slope of 0; the within slope equals least squares with one
    dummy intercept per group."""
    rng = np.random.default_rng(4)
    scenario = np.repeat(np.arange(6), 20)
    group = np.repeat(np.arange(12), 10)  # two drives per scenario
    start = rng.normal(0, 1.0, 12)
    x = start[group] + rng.normal(0, 0.3, len(group))
    frozen = start[group]
    assert regression_slope(scenario, x, frozen, intercept=True).estimate > 0.5
    assert within_slope(scenario, group, x, frozen).estimate == pytest.approx(0.0, abs=1e-12)
    y = 0.7 * x + start[group] * 2 + rng.normal(0, 0.1, len(group))
    y[3] = np.nan
    keep = np.isfinite(y)
    design = np.column_stack([x, group[:, None] == np.arange(12)])[keep]
    expected = np.linalg.lstsq(design, y[keep], rcond=None)[0][0]
    assert within_slope(scenario, group, x, y).estimate == pytest.approx(expected, rel=1e-10)
    with pytest.raises(ValueError, match="nested in scenarios"):
        within_slope(np.arange(len(group)) % 2, group, x, y)


def looped_interval(statistic, scenarios: np.ndarray, bootstrap: Bootstrap) -> Interval:
    """The cluster bootstrap written as a loop over replicates: the reference for the vectorised statistics."""
    clusters = Clusters.of(scenarios)
    members = [np.flatnonzero(clusters.index == c) for c in range(clusters.size)]
    replicates = np.empty(bootstrap.draws)
    for r, counts in enumerate(bootstrap.weights(clusters.size).astype(np.int64)):
        picked = [np.tile(members[c], n) for c, n in enumerate(counts) if n]
        replicates[r] = statistic(np.concatenate(picked))
    return bootstrap.interval(statistic(np.arange(len(clusters.index))), replicates)


def test_the_same_seed_draws_the_same_replicates_for_every_statistic():
    rng = np.random.default_rng(0)
    scenario, values = correlated_drives(rng, scenarios=12, per_scenario=3)
    boot = Bootstrap(draws=300, seed=5)
    vectorised = mean(scenario, values, boot)
    looped = looped_interval(lambda idx: float(values[idx].mean()), scenario, boot)
    assert (looped.estimate, looped.low, looped.high) == pytest.approx(
        (vectorised.estimate, vectorised.low, vectorised.high), rel=1e-12)
    assert mean(scenario, values, boot) == vectorised
    assert mean(scenario, values, Bootstrap(draws=300, seed=6)) != vectorised
    weights = boot.weights(12)
    assert weights.shape == (300, 12) and np.all(weights.sum(1) == 12)
    # Each scenario is drawn once per replicate on average.
    assert boot.weights(12).mean() == pytest.approx(1.0, abs=0.02)


def test_paired_differences_cancel_the_scenario_effect():
    """World = truth + 0.2 with a large shared scenario effect: the paired interval is narrow around 0.2, much
    narrower than the difference of the two worlds' separate means would allow."""
    rng = np.random.default_rng(1)
    scenario = np.repeat(np.arange(30), 4)
    effect = rng.normal(0, 3, 30)[scenario]
    truth = effect + rng.normal(0, 0.1, len(scenario))
    world = truth + 0.2 + rng.normal(0, 0.1, len(scenario))
    paired = paired_difference(scenario, world, truth)
    assert abs(paired.estimate - 0.2) < 0.03 and paired.high - paired.low < 0.05
    separate = mean(scenario, world)
    assert separate.high - separate.low > 1.0
    with pytest.raises(ValueError, match="differ in shape"):
        paired_difference(scenario, world, truth[:-1])


def test_vectorised_rank_correlations_equal_scipy_with_ties():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 4, size=(200, 6)).astype(float)  # many ties
    b = rng.integers(0, 4, size=(200, 6)).astype(float)
    tau, rho = kendall_tau_rows(a, b), spearman_rho_rows(a, b)
    for r in range(200):
        if np.ptp(a[r]) == 0 or np.ptp(b[r]) == 0:
            assert np.isnan(tau[r]) and np.isnan(rho[r])
            continue
        assert tau[r] == pytest.approx(kendalltau(a[r], b[r]).statistic, abs=1e-12)
        assert rho[r] == pytest.approx(spearmanr(a[r], b[r]).statistic, abs=1e-12)


def test_pearson_rows_equal_scipy_and_mmrv_weighs_each_misordering_by_its_true_gap():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(50, 5)), rng.normal(size=(50, 5))
    r = pearson_rows(a, b)
    assert all(r[i] == pytest.approx(pearsonr(a[i], b[i]).statistic, abs=1e-12) for i in range(50))
    truth = np.array([[0.0, 0.1, 0.5, 1.0]])
    assert mmrv_rows(truth * 3 + 1, truth)[0] == 0.0  # the same order on another scale: no violation
    # the two best swapped (gap 0.1) and the worst put first (gaps 1.0, 0.9, 0.5 to the others): per policy the
    # largest violated gap: 1.0, 0.9, 0.5, 1.0 -> mean 0.85 of a spread of 1
    assert mmrv_rows(np.array([[0.1, 0.0, 0.5, -1.0]]), truth)[0] == pytest.approx((1.0 + 0.9 + 0.5 + 1.0) / 4)
    assert mmrv_rows(np.array([[0.1, 0.0, 0.5, 1.0]]), truth)[0] == pytest.approx((0.1 + 0.1) / 4)
    assert np.isnan(mmrv_rows(truth, np.zeros((1, 4)))[0])  # no spread in truth: nothing to violate


def test_intervals_over_few_scenarios_are_widened_and_one_scenario_decides_nothing():
    from scipy.stats import t

    assert few_clusters_factor(4) == pytest.approx(np.sqrt(4 / 3) * t.ppf(0.975, 3) / 1.959964, rel=1e-6)
    assert few_clusters_factor(4) > few_clusters_factor(8) > few_clusters_factor(32) > 1.0
    assert few_clusters_factor(1) == np.inf
    wide = widened(Interval(1.0, 0.9, 1.2, 0.95), 2.0)
    assert (wide.low, wide.high) == pytest.approx((0.8, 1.4))
    assert np.isnan(widened(Interval(1.0, 1.0, 1.0, 0.95), np.inf).low)  # one scenario: no interval at all


def policy_drives(rng, policy_means, scenarios=20, seeds=1, noise=0.05):
    scenario, policy, value = [], [], []
    effect = rng.normal(0, 0.2, scenarios)
    for s in range(scenarios):
        for p, m in enumerate(policy_means):
            for _ in range(seeds):
                scenario.append(f"s{s}")
                policy.append(f"p{p}")
                value.append(m + effect[s] + rng.normal(0, noise))
    return DriveValues(scenario, policy, np.array(value))


def test_rank_agreement_of_policy_means():
    rng = np.random.default_rng(3)
    means = np.linspace(0.0, 1.0, 8)
    truth = policy_drives(rng, means)
    faithful = policy_drives(rng, means, seeds=3)  # three world-model seeds per drive
    reversed_ = policy_drives(rng, means[::-1])
    same = rank_agreement(faithful, truth)
    assert same.kendall_tau.estimate == pytest.approx(1.0) and same.kendall_tau.low > 0.9
    assert same.spearman_rho.low > 0.95
    assert decide(same.kendall_tau, (0.8, 1.0)) == PASS
    wrong = rank_agreement(reversed_, truth)
    assert wrong.kendall_tau.high < -0.9 and decide(wrong.kendall_tau, (0.8, 1.0)) == FAIL
    close = rank_agreement(policy_drives(rng, means * 0.05, noise=0.2), truth)  # rankings lost in noise
    assert close.kendall_tau.high - close.kendall_tau.low > 0.5
    assert same.policies == tuple(f"p{p}" for p in range(8)) and same.means_b.shape == (8,)
    with pytest.raises(ValueError, match="at least 3 policies"):
        rank_agreement(DriveValues(["a"], ["p"], np.ones(1)), DriveValues(["a"], ["p"], np.ones(1)))


def test_decision_of_an_interval_against_a_band():
    def iv(low, high):
        return Interval((low + high) / 2, low, high, 0.95)

    band = (0.8, 1.2)
    assert decide(iv(0.9, 1.1), band) == PASS
    assert decide(iv(0.8, 1.2), band) == PASS  # the band's ends belong to it
    assert decide(iv(-0.1, 0.1), band) == FAIL
    assert decide(iv(1.3, 1.5), band) == FAIL
    assert decide(iv(0.7, 0.9), band) == INCONCLUSIVE
    assert decide(iv(0.5, 1.5), band) == INCONCLUSIVE
    assert decide(iv(float("nan"), float("nan")), band) == INCONCLUSIVE
    assert decide(iv(0.9, 3.0), (0.8, np.inf)) == PASS
    assert decide(iv(-1.0, 0.1), (0.5, np.inf)) == FAIL
    with pytest.raises(ValueError, match="low <= high"):
        decide(iv(0, 1), (1.0, 0.0))


def test_intervals_report_undefined_replicates_and_bad_settings():
    clusters = Clusters.of(["b", "a", "b", "c"])
    assert clusters.labels == ("b", "a", "c") and clusters.index.tolist() == [0, 1, 0, 2]
    assert clusters.sums(np.array([1.0, 2.0, 3.0, 4.0])).tolist() == [4.0, 2.0, 4.0]
    # A mean of drives of which only one scenario has values: undefined whenever that scenario is not drawn.
    partial = mean(["a", "b", "c"], np.array([1.0, np.nan, np.nan]), Bootstrap(draws=1000))
    assert partial.estimate == 1.0 and 0.2 < partial.undefined < 0.4  # (2/3)^3 = 0.30 of the replicates
    assert partial.as_dict()["low"] == 1.0
    empty = Bootstrap(draws=10).interval(0.0, np.full(10, np.nan))
    assert empty.as_dict()["low"] is None and empty.undefined == 1.0
    for bad in ({"draws": 5}, {"level": 1.0}, {"draws": 10.5}):
        with pytest.raises(ValueError, match="bootstrap"):
            Bootstrap(**bad)


def test_the_wing_imports_without_torch():
    code = ("import sys, terra.stats, terra.fidelity.odometry, terra.fidelity.following, "
            "terra.fidelity.agreement, terra.fidelity.exploit; assert 'torch' not in sys.modules, 'torch was imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_policies_median_difference_is_not_decided_by_one_policy():
    """Three policies alike in both worlds and one whose drives land either side of a knife's edge: the mean of the
    paired differences moves with the knife-edge policy, the policies' median does not; a shift of every policy
    moves both."""
    rng = np.random.default_rng(1)
    scenarios = [s for s in range(8) for _ in range(4)]
    policies = ["a", "b", "c", "knife"] * 8
    truth = rng.uniform(0, 1, 32)
    world = truth.copy()
    world[3::4] = rng.integers(0, 2, 8)  # 0 or 1 at random, whatever the truth drive did
    boot = Bootstrap(draws=500)
    median = policies_median_difference(scenarios, policies, world, truth, boot)
    assert median.estimate == 0.0 and median.low == 0.0 and median.high == 0.0
    assert abs(paired_difference(scenarios, world, truth, boot).estimate) > 0.01
    shifted = policies_median_difference(scenarios, policies, truth + 0.3, truth, boot)
    assert shifted.estimate == pytest.approx(0.3) and shifted.low == pytest.approx(0.3)
    with pytest.raises(ValueError, match="one each per drive"):
        policies_median_difference(scenarios, policies[:3], world, truth)
