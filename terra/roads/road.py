"""A road: lane centrelines in a world frame, checked once and ready to be followed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from terra.core.errors import TerraInputError, past, quoted
from terra.roads.cells import CellIndex

LANE_SPACING_M = 1.0  # a lane's points after resampling
MAX_LANES = 20_000  # a city district's map; a million lanes is a mistake or an attack
MAX_POINTS = 2_000_000  # points given, and points after resampling, over all lanes and boundaries
MAX_COORDINATE_M = 1e6  # |x|, |y|: a map is in a local frame (a clip's, a trajectory's), not in UTM or ECEF
MIN_POINT_GAP_M = 0.01  # points closer than this to the one before are one point
CHAIN_GAP_M = 1.5  # a lane without stated successors leads into lanes starting this close to its end ...
CHAIN_HEADING_RAD = np.radians(30.0)  # ... heading within this of its end
HEADING_WINDOW_M = 2.0  # a lane's start and end heading, for chaining: its direction over this length
STRAIGHT_WINDOW_M = 20.0  # a successor's turn: its heading over this much of it against its lane's over the last 1/4
MAX_STARTS_NEAR = 256  # lanes starting by one lane's end (within about 4 m): a junction has tens
MAX_SUCCESSORS = 64  # stated successors of one lane: a junction's lane leads into a few
CELL_M = 8.0  # the cells of the lane index: more than follow.py's reach to a lane (4 m) plus a point's spacing


@dataclass(frozen=True)
class Lane:
    """A lane's centreline ``[N, 2]`` (world m, driving direction), id, successor ids (None: from geometry), source."""

    points: np.ndarray
    id: str = ""
    successors: tuple[str, ...] | None = None
    source: str = ""


class Road:
    """Lane centrelines in one world frame, checked and resampled; what :func:`terra.roads.follow.route_at` follows."""

    def __init__(self, lanes: Sequence[Lane], boundaries: Sequence[np.ndarray] = (), source: str = "road",
                 spacing_m: float = LANE_SPACING_M) -> None:
        self.source = source
        for count, what in ((len(lanes), "lanes"), (len(boundaries), "road boundaries")):
            if count > MAX_LANES:
                raise TerraInputError(f"{source}: holds {count} {what}, more than {MAX_LANES}; give the part of the "
                                      "map the drive uses")
        given = sum(len(lane.points) for lane in lanes) + sum(len(b) for b in boundaries)
        if given > MAX_POINTS:
            raise TerraInputError(f"{source}: holds {given} points, more than {MAX_POINTS}; give the part of the map "
                                  "the drive uses")
        ids = [lane.id or str(i) for i, lane in enumerate(lanes)]
        xy, lane_of = _polylines([lane.points for lane in lanes], [f"{source}: lane {quoted(i)}" for i in ids])
        bxy, boundary_of = _polylines(list(boundaries), [f"{source}: road boundary {i}"
                                                         for i in range(len(boundaries))])
        self.boundaries = tuple(np.split(bxy, np.flatnonzero(np.diff(boundary_of)) + 1)) if len(bxy) else ()
        curve = _Polylines(xy, lane_of, len(lanes))
        counts = np.ceil(curve.lengths / spacing_m).astype(np.int64) + 1
        if counts.sum() > MAX_POINTS:
            most_km = MAX_POINTS * spacing_m / 1000
            raise TerraInputError(f"{source}: its lanes are {past(curve.lengths.sum() / 1000, most_km)} km long in "
                                  f"all, more than {most_km:g} km; give the part of the map the drive uses")
        self.lane_of = np.repeat(np.arange(len(lanes)), counts)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        share = (np.arange(self.starts[-1]) - self.starts[:-1][self.lane_of]) / np.maximum(counts - 1, 1)[self.lane_of]
        self.along = share * curve.lengths[self.lane_of]
        self.xy = curve.at(self.lane_of, self.along)
        self.lengths = curve.lengths
        self.lanes = tuple(Lane(self.xy[a:b], i, lane.successors, lane.source or source)
                           for lane, i, a, b in zip(lanes, ids, self.starts[:-1], self.starts[1:]))
        self.next_lanes = _connections(self.lanes, curve, source)
        self.segment_starts = np.flatnonzero(np.diff(self.lane_of) == 0)  # every point but each lane's last
        self.cells = CellIndex(self.xy[self.segment_starts], CELL_M)

    def __len__(self) -> int:
        return len(self.lanes)

    def __repr__(self) -> str:
        return f"Road({self.source!r}, {len(self.lanes)} lanes, {len(self.boundaries)} boundaries)"

    def lane_points(self, lane: int) -> np.ndarray:
        """``[N, 2]`` resampled centreline of lane ``lane``."""
        return self.xy[self.starts[lane]:self.starts[lane + 1]]

    def lane_along(self, lane: int) -> np.ndarray:
        """``[N]`` arc length of lane ``lane``'s points from its start."""
        return self.along[self.starts[lane]:self.starts[lane + 1]]

    def point_at(self, lane: int, s: np.ndarray | float) -> np.ndarray:
        """``[..., 2]`` points ``s`` metres along lane ``lane`` (clamped to its ends)."""
        along, points = self.lane_along(lane), self.lane_points(lane)
        return np.stack([np.interp(s, along, points[:, 0]), np.interp(s, along, points[:, 1])], axis=-1)

    def heading(self, lane: int, s0: float, s1: float) -> float:
        """Direction (rad) from the point ``s0`` to the point ``s1`` metres along lane ``lane``."""
        d = self.point_at(lane, s1) - self.point_at(lane, s0)
        return float(np.arctan2(d[1], d[0]))


def _polylines(polylines: list, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Polylines end to end, ``xy [P, 2]`` and each point's polyline, checked and near-duplicate points dropped."""
    arrays = []
    for points, what in zip(polylines, names):
        try:
            arr = np.asarray(points, dtype=np.float64)
        except (TypeError, ValueError):
            raise TerraInputError(f"{what}: points must be [x, y] pairs of numbers") from None
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise TerraInputError(f"{what}: points must be [x, y] pairs, got an array of shape {list(arr.shape)}")
        arrays.append(arr)
    if not arrays:
        return np.zeros((0, 2)), np.zeros(0, dtype=np.int64)
    xy = np.concatenate(arrays)
    owner = np.repeat(np.arange(len(arrays)), [len(a) for a in arrays])
    first = np.concatenate([[0], np.cumsum([len(a) for a in arrays])])
    bad = ~np.isfinite(xy).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise TerraInputError(f"{names[owner[row]]}: point {row - first[owner[row]]} is not finite "
                              f"({xy[row].tolist()}); give finite x, y in metres")
    far = np.abs(xy).max(axis=1) > MAX_COORDINATE_M
    if far.any():
        row = int(np.flatnonzero(far)[0])
        raise TerraInputError(f"{names[owner[row]]}: point {row - first[owner[row]]} lies "
                              f"{past(np.abs(xy[row]).max(), MAX_COORDINATE_M)} m from the origin, beyond "
                              f"{MAX_COORDINATE_M:g} m; give the road in the drive's local frame (metres)")
    step = np.hypot(*np.diff(xy, axis=0).T)
    keep = np.concatenate([[True], (step >= MIN_POINT_GAP_M) | (owner[1:] != owner[:-1])])
    xy, owner = xy[keep], owner[keep]
    counts = np.bincount(owner, minlength=len(arrays))
    if (counts < 2).any():
        short = int(np.flatnonzero(counts < 2)[0])
        raise TerraInputError(f"{names[short]}: has {counts[short]} distinct point(s); a polyline needs at least 2")
    return xy, owner


class _Polylines:
    """Checked polylines end to end on one arc-length axis, each starting 1 m past the one before."""

    def __init__(self, xy: np.ndarray, owner: np.ndarray, count: int) -> None:
        step = np.hypot(*np.diff(xy, axis=0).T) if len(xy) else np.zeros(0)
        step[owner[1:] != owner[:-1]] = 1.0
        self.xy, self.axis = xy, np.concatenate([[0.0], np.cumsum(step)])
        first = np.concatenate([[0], np.flatnonzero(np.diff(owner)) + 1]).astype(np.int64)
        last = np.concatenate([first[1:] - 1, [len(xy) - 1]]) if count else first
        self.base = self.axis[first] if count else np.zeros(0)
        self.lengths = self.axis[last] - self.base if count else np.zeros(0)

    def at(self, which: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Points ``s`` metres along polylines ``which`` (clamped to their ends)."""
        if not len(self.xy):
            return np.zeros((0, 2))
        where = self.base[which] + np.clip(s, 0.0, self.lengths[which])
        return np.stack([np.interp(where, self.axis, self.xy[:, 0]), np.interp(where, self.axis, self.xy[:, 1])], -1)


def _direction(vector: np.ndarray) -> np.ndarray:
    return np.arctan2(vector[..., 1], vector[..., 0])


def _connections(lanes: tuple[Lane, ...], curve: _Polylines, source: str) -> tuple[tuple[int, ...], ...]:
    """Each lane's successors as lane indices, straightest first."""
    index: dict[str, int] = {}
    for i, lane in enumerate(lanes):
        if index.setdefault(lane.id, i) != i:
            raise TerraInputError(f"{source}: two lanes have the id {quoted(lane.id)}; give each lane its own id")
    if not lanes:
        return ()
    every = np.arange(len(lanes))
    begin, end = curve.at(every, np.zeros(len(lanes))), curve.at(every, curve.lengths)
    for lane in lanes:
        if lane.successors is not None and len(lane.successors) > MAX_SUCCESSORS:
            raise TerraInputError(f"{source}: lane {quoted(lane.id)} states {len(lane.successors)} successors, more "
                                  f"than {MAX_SUCCESSORS}; a lane leads into the few lanes that continue it")
    unknown = np.flatnonzero([lane.successors is None for lane in lanes])
    starts = CellIndex(begin, CHAIN_GAP_M)
    crowded = np.flatnonzero(starts.counts(end[unknown]) > MAX_STARTS_NEAR)
    if len(crowded):
        lane = lanes[unknown[crowded[0]]]
        raise TerraInputError(f"{source}: more than {MAX_STARTS_NEAR} lanes start by the end of lane "
                              f"{quoted(lane.id)} (within {3 * CHAIN_GAP_M:g} m); a junction has tens: give each "
                              "lane once")
    lane, other = starts.pairs(end[unknown])
    lane = unknown[lane]
    window = np.minimum(HEADING_WINDOW_M, curve.lengths)
    start_heading = _direction(curve.at(every, window) - begin)
    end_heading = _direction(end - curve.at(every, curve.lengths - window))
    gap = np.hypot(*(begin[other] - end[lane]).T)
    joins = (gap < CHAIN_GAP_M) & (_turn(start_heading[other], end_heading[lane]) < CHAIN_HEADING_RAD)
    stated = [(i, index[s]) for i, lane in enumerate(lanes) if lane.successors is not None
              for s in lane.successors if s in index]
    stated_lane, stated_other = np.array(stated, dtype=np.int64).reshape(-1, 2).T
    lane, other = np.concatenate([lane[joins], stated_lane]), np.concatenate([other[joins], stated_other])
    back = np.einsum("ij,ij->i", begin[other] - end[lane], np.stack([np.cos(end_heading[lane]),
                                                                      np.sin(end_heading[lane])], axis=-1))
    forward = (lane != other) & (back > -curve.lengths[lane] / 2)  # a route never runs back over half a lane
    lane, other = lane[forward], other[forward]
    incoming = _direction(end - curve.at(every, curve.lengths - np.minimum(STRAIGHT_WINDOW_M / 4, curve.lengths)))
    outgoing = _direction(curve.at(every, np.minimum(STRAIGHT_WINDOW_M, curve.lengths)) - begin)
    order = np.lexsort((other, _turn(outgoing[other], incoming[lane]), lane))
    found: dict[int, list[int]] = {}
    for i, j in zip(lane[order].tolist(), other[order].tolist()):
        found.setdefault(i, []).append(j)
    return tuple(tuple(dict.fromkeys(found.get(i, ()))) for i in range(len(lanes)))


def _turn(heading: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|heading - reference| wrapped to [0, pi]."""
    return np.abs(np.angle(np.exp(1j * (heading - reference))))


__all__ = ["CHAIN_GAP_M", "CHAIN_HEADING_RAD", "LANE_SPACING_M", "MAX_COORDINATE_M", "MAX_LANES", "MAX_POINTS",
           "Lane", "Road"]
