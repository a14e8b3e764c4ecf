"""How long each world of a study stays a simulator: its fidelity horizon, and the statistics within it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from terra.closedloop.policies.builtin import NO_PIXELS
from terra.closedloop.outcomes.frames import read_following, read_lanes
from terra.closedloop.outcomes.truth import metrics_until
from terra.closedloop.study.statistics import Pair
from terra.fidelity.horizon import STEP_S, Survival, drive_horizon, survival
from terra.stats import Bootstrap

BEND_RAD = 0.1  # a drive whose true road turns more than this (6 degrees) from its start is on a bend
PARTS = {"closed_loop": "closed loop", "straights": "closed loop, straights", "bends": "closed loop, bends",
         "open_loop": "open loop"}
FRAME_SERIES = ("commanded", "recovered", "match", "recovered_truth", "lane_world", "lane_truth", "change_world",
                "change_truth")  # per step


@dataclass(frozen=True)
class WorldHorizon:
    """A world's horizons (:data:`PARTS`; None where it has no such drive)."""

    closed_loop: Survival | None
    straights: Survival | None
    bends: Survival | None
    open_loop: Survival | None

    def parts(self) -> dict[str, Survival]:
        return {name: getattr(self, name) for name in PARTS if getattr(self, name) is not None}

    def as_dict(self) -> dict:
        return {name: value.as_dict() for name, value in self.parts().items()}


def _bend(pair: Pair) -> bool | None:
    turn = ((pair.truth.get("metrics") or {}).get("truth") or {}).get("road_turn_rad")
    return None if turn is None else bool(turn > BEND_RAD)


def world_horizon(pairs: Sequence[Pair], bootstrap: Bootstrap = Bootstrap()) -> WorldHorizon:
    """A world's horizons from its drives paired with the truth's (those with frame measurements)."""
    def part(chosen: list[Pair]) -> Survival | None:
        if not chosen:
            return None
        horizons = [drive_horizon(read_lanes(p.world["fidelity"]), read_following(p.world["fidelity"]))
                    for p in chosen]
        return survival(horizons, [p.scenario for p in chosen], bootstrap)

    closed = [p for p in pairs if p.policy not in NO_PIXELS]
    bends = [_bend(p) for p in closed]
    known = None not in bends
    return WorldHorizon(part(closed), part([p for p, b in zip(closed, bends) if known and not b]),
                        part([p for p, b in zip(closed, bends) if known and b]),
                        part([p for p in pairs if p.policy in NO_PIXELS]))


def cut_record(record: dict, frames: int) -> dict:
    """A drive's record as if it had ended after ``frames`` frames."""
    cut = {**record, "world_poses": record.get("world_poses", [])[:frames + 1], "steps": min(record["steps"], frames)}
    metrics = {key: value for key, value in (record.get("metrics") or {}).items() if key != "alpasim"}
    if "truth" in metrics:
        metrics["truth"] = metrics_until(metrics["truth"], frames) or {}
    cut["metrics"] = metrics
    measured = record.get("fidelity")
    if measured:
        cut["fidelity"] = {**{key: measured[key][:frames] for key in FRAME_SERIES if measured.get(key) is not None},
                           "horizons": {h: v for h, v in measured.get("horizons", {}).items() if int(h) <= frames},
                           "lag": None}
    return cut


def within(pairs: Sequence[Pair], seconds: float) -> list[Pair]:
    """``pairs`` cut at the frame ``seconds`` after the last context frame (at least one frame)."""
    frames = max(1, int(round(seconds / STEP_S)))
    return [Pair(cut_record(p.world, frames), cut_record(p.truth, frames)) for p in pairs]


def cut_at(horizon: WorldHorizon, pairs: Sequence[Pair]) -> float | None:
    """Where a world's drives are cut to be judged within its horizon."""
    median = float("nan") if horizon.closed_loop is None else horizon.closed_loop.median.estimate
    longest = max((len(p.world["fidelity"]["lane_world"]) for p in pairs), default=0) * STEP_S
    return float(median) if np.isfinite(median) and median < longest else None
