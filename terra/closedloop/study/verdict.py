"""The fidelity verdict: is a world a simulator of the true world? Judged per statistic, with intervals."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import TYPE_CHECKING, Sequence

import numpy as np

from terra.closedloop.outcomes.frames import read_horizons
from terra.closedloop.study.statistics import (
    FRAMES, KENDALL_TAU, OUTCOMES, RANK_METRIC, STATISTICS, Pair, Statistic, finite_mean, outcome_policies,
    paired_values, undefined, value_or_reason,
)
from terra.fidelity.agreement import horizon_summary
from terra.stats import (
    FAIL, INCONCLUSIVE, PASS, Bootstrap, Interval, decide, few_clusters_factor, mean, paired_difference, widened,
)

if TYPE_CHECKING:
    from terra.closedloop.study.horizons import WorldHorizon

TOO_FEW = "too few scenarios"  # a fourth decision: below MIN_SCENARIOS nothing is decided
MIN_SCENARIOS = 4  # fewer scenarios under a statistic leave it undecided, whatever its interval
NO_PAIRS = "no drive made well in both worlds"  # why a statistic of no paired drives has no value
TIE = 5e-4  # two policies whose true means differ by less tie (the tables' precision)
METRIC_BLOCKS = ("truth", "alpasim", "progress", "history_comfort", "extended_comfort")  # a record's metric blocks
NOT_OUTCOMES = ("first_collision_frame", "road_turn_rad")  # an index, the road's own shape: no difference taken


def path_distance_m(pair: Pair) -> float:
    """The mean distance (m) between the world's and the truth's paths at the same frames (NaN: no frame)."""
    n = min(len(pair.world["world_poses"]), len(pair.truth["world_poses"]))
    if not n:
        return float("nan")
    a, b = np.array(pair.world["world_poses"][:n])[:, :2], np.array(pair.truth["world_poses"][:n])[:, :2]
    return float(np.hypot(*(a - b).T).mean())


def measurements(pairs: Sequence[Pair], bootstrap: Bootstrap) -> dict[str, Interval]:
    """What a world's drives measure without a verdict, each with its interval."""
    scenarios = [p.scenario for p in pairs]
    found = {"path_distance_m": mean(scenarios, np.array([path_distance_m(p) for p in pairs]), bootstrap)}
    horizons = horizon_summary([read_horizons(p.world["fidelity"]) for p in pairs], scenarios, bootstrap)
    return {**found, **{f"{key}_h{h}": value for h, values in horizons.items() for key, value in values.items()}}


def metric_names(records: Sequence[dict]) -> list[tuple[str, str]]:
    """Every numeric or true/false metric of :data:`METRIC_BLOCKS` in ``records``' metrics, block by block."""
    found = {(block, key): None for block in METRIC_BLOCKS for record in records
             for key, value in (record.get("metrics", {}).get(block) or {}).items()
             if isinstance(value, (bool, int, float)) and key not in NOT_OUTCOMES}
    return list(found)


def differences(pairs: Sequence[Pair], bootstrap: Bootstrap) -> dict[str, Interval]:
    """Per metric (``block.metric``), the mean world - truth over the paired drives with its interval."""
    scenarios = [p.scenario for p in pairs]
    return {f"{block}.{metric}": paired_difference(scenarios, *paired_values(pairs, block, metric), bootstrap)
            for block, metric in metric_names([record for p in pairs for record in (p.world, p.truth)])}


@dataclass(frozen=True)
class Ranking:
    """The policies ranked, their mean :data:`RANK_METRIC` in world and truth, and the pairs tied in truth."""

    policies: tuple[str, ...]
    world: tuple[float, ...]
    truth: tuple[float, ...]

    @property
    def ties(self) -> list[tuple[str, str]]:
        truth = dict(zip(self.policies, self.truth))
        return [(a, b) for a, b in combinations(self.policies, 2) if abs(truth[a] - truth[b]) < TIE]

    def as_dict(self) -> dict:
        return {"metric": RANK_METRIC, "policies": list(self.policies), "world": list(self.world),
                "truth": list(self.truth), "ties_in_truth": [list(t) for t in self.ties]}


def ranking_of(pairs: Sequence[Pair]) -> Ranking:
    """The per-policy means of :data:`RANK_METRIC` over the outcome policies' paired drives (NaN: none)."""
    policies = np.array([p.policy for p in pairs])
    names = tuple(dict.fromkeys(policies.tolist()))
    return Ranking(names, *(tuple(finite_mean(values[policies == name]) for name in names)
                            for values in paired_values(pairs, "truth", RANK_METRIC)))


FLAGGED, PASSED, UNDECIDED = "flagged", "passed", "undecided"  # a world's state (WorldVerdict.state)


@dataclass(frozen=True)
class WorldVerdict:
    """One world's statistics, their decisions, and what they rest on; its fidelity horizon when computed."""

    world: str
    values: dict[str, Interval]
    decisions: dict[str, str]
    drives: int
    measured: dict[str, Interval]
    differences: dict[str, Interval]
    reasons: dict[str, str] = field(default_factory=dict)
    scenarios: dict[str, int] = field(default_factory=dict)  # statistic -> the scenarios it rests on
    policies: tuple[str, ...] = ()  # the outcome statistics' policies
    ranking: Ranking | None = None
    horizon: WorldHorizon | None = None
    within: WorldVerdict | None = None
    within_s: float | None = None  # where the drives were cut for ``within``
    steps: int = 0  # the longest of its drives' steps

    @property
    def flagged_by(self) -> list[str]:
        return [name for name, decision in self.decisions.items() if decision == FAIL]

    @property
    def undecided(self) -> list[str]:
        return [name for name, decision in self.decisions.items() if decision not in (PASS, FAIL)]

    @property
    def state(self) -> str:
        """``flagged`` (a statistic fails), ``passed`` (every statistic passes) or ``undecided``."""
        return FLAGGED if self.flagged_by else UNDECIDED if self.undecided else PASSED

    @property
    def too_small(self) -> bool:
        """Whether the study was too small to judge the world."""
        return self.state == UNDECIDED and any(
            self.decisions[name] == TOO_FEW or (self.decisions[name] == INCONCLUSIVE and name not in self.reasons)
            for name in self.undecided)

    @property
    def too_few(self) -> int | None:
        """The scenarios of a world judged on fewer than :data:`MIN_SCENARIOS` (None: enough)."""
        counts = [self.scenarios.get(name, 0) for name, decision in self.decisions.items() if decision == TOO_FEW]
        return max(counts) if counts else None

    def as_dict(self) -> dict:
        return {"world": self.world, "drives": self.drives, "state": self.state, "flagged": bool(self.flagged_by),
                "flagged_by": self.flagged_by, "undecided": self.undecided, "too_small_to_judge": self.too_small,
                "outcome_policies": list(self.policies),
                "ranking": None if self.ranking is None else self.ranking.as_dict(),
                "statistics": {name: {**value.as_dict(), "decision": self.decisions[name],
                                      "scenarios": self.scenarios.get(name), "reason": self.reasons.get(name)}
                               for name, value in self.values.items()},
                "measurements": {name: value.as_dict() for name, value in self.measured.items()},
                "differences": {name: value.as_dict() for name, value in self.differences.items()},
                "horizon": None if self.horizon is None else self.horizon.as_dict(),
                "within_horizon": None if self.within is None else {"cut_s": self.within_s, **self.within.as_dict()}}


def pairs_of(world: dict[str, dict], truth: dict[str, dict]) -> list[Pair]:
    """The drives (id -> record) made well in both worlds, with the world's fidelity measurements."""
    return [Pair(record, truth[drive]) for drive, record in sorted(world.items())
            if record.get("status") == "ok" and record.get("fidelity") and truth.get(drive, {}).get("status") == "ok"]


def _judged(statistic: Statistic, pairs: Sequence[Pair], bootstrap: Bootstrap
            ) -> tuple[Interval, str, str | None, int]:
    """One statistic on its drives."""
    scenarios = len({p.scenario for p in pairs})
    if not pairs:
        reason = NO_PAIRS if statistic.rests_on == FRAMES else \
            "no pixel policy's drive made well in both worlds (policies that read no pixels and probes are left out)"
        return undefined(bootstrap), INCONCLUSIVE, reason, 0
    value, why = value_or_reason(statistic.compute, pairs, bootstrap)
    if why is not None:
        return value, INCONCLUSIVE, why, scenarios
    low, high = statistic.limits
    value = widened(value, few_clusters_factor(scenarios, bootstrap.level))
    value = replace(value, low=float(np.clip(value.low, low, high)), high=float(np.clip(value.high, low, high)))
    if scenarios < MIN_SCENARIOS:
        return value, TOO_FEW, f"{scenarios} scenario{'s' * (scenarios != 1)}, fewer than {MIN_SCENARIOS}", scenarios
    return value, decide(value, statistic.band), None, scenarios


def judge_pairs(name: str, pairs: Sequence[Pair], bootstrap: Bootstrap = Bootstrap(),
                statistics: Sequence[Statistic] = STATISTICS) -> WorldVerdict:
    """The verdict on the world ``name`` of ``statistics`` over its drives paired with the truth's."""
    policies = outcome_policies(pairs)
    outcomes = [p for p in pairs if p.policy in policies]
    values, decisions, reasons, scenarios = {}, {}, {}, {}
    for s in statistics:
        value, decision, reason, count = _judged(s, outcomes if s.rests_on == OUTCOMES else pairs, bootstrap)
        values[s.name], decisions[s.name], scenarios[s.name] = value, decision, count
        if reason is not None:
            reasons[s.name] = reason
    measured = measurements(pairs, bootstrap) if pairs else {}
    if outcomes:  # measured, not judged
        measured["kendall_tau"] = _judged(KENDALL_TAU, outcomes, bootstrap)[0]
    ranking = ranking_of(outcomes) if outcomes else None
    return WorldVerdict(name, values, decisions, len(pairs), measured, differences(pairs, bootstrap), reasons,
                        scenarios, tuple(policies), ranking,
                        steps=max((p.world.get("steps") or 0 for p in pairs), default=0))

