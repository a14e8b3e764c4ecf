"""The world model's route contract: a frame's route is ``[K, 3]`` floats ``[x, y, s]`` (in its slots ``[y, x, s]``)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from terra.contract.actions import finite_array
from terra.core.errors import TerraInputError, past

ROUTE_HORIZON_M = 80.0  # the last route point's distance along the lane; a demo frame shows road to about 60 m
ROUTE_POINT_VALUES = 3  # [x, y, s]; a route slot holds [y, x, s], the width of an action point
MAX_ROUTE_M = 1000.0  # |y|, |x| of a route point: a sanity bound (a car that left the road far behind still has one)
# car's distance from the road, which the bound leaves room for
NO_ROUTE_SLOTS = "the world model has no route slots (num_route_tokens 0)"
MAX_LANE_DISTANCE_M = 4.0  # a car farther than this from every lane's centreline is on no lane of the road
TOLD, NO_LANE_NEAR, ROAD_ENDED, NONE_GIVEN = ("told", f"no lane within {MAX_LANE_DISTANCE_M:g} m", "road ended",
                                              "none given")  # a frame's route: told, or why not
ROUTE_VERDICTS = (TOLD, NO_LANE_NEAR, ROAD_ENDED, NONE_GIVEN)


def route_summary(verdicts: Sequence[str]) -> str | None:
    """One line on how many of ``verdicts`` (one a frame) were told a route and why the others not; None: all
    were."""
    if verdicts.count(TOLD) == len(verdicts):
        return None
    why = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts) if v != TOLD)
    return f"route told in {verdicts.count(TOLD)} of {len(verdicts)} frames: {why}"


def route_distances(points: int) -> np.ndarray:
    """``s_k`` of a route of ``points`` points: evenly spaced up to :data:`ROUTE_HORIZON_M`, float32."""
    return (ROUTE_HORIZON_M * np.arange(1, points + 1) / points).astype(np.float32)


def no_route(num_frames: int, points: int) -> np.ndarray:
    """The routes of ``num_frames`` frames without one: NaN rows, which the model embeds as "no route"."""
    return np.full((num_frames, points, ROUTE_POINT_VALUES), np.nan, dtype=np.float32)


def routes_from_xy(forward_left: np.ndarray) -> np.ndarray:
    """Routes ``[..., K, 3]`` from the centreline's ``[..., K, 2]`` ego ``(x, y)`` at :func:`route_distances`."""
    points = np.asarray(forward_left, dtype=np.float32)
    s = np.broadcast_to(route_distances(points.shape[-2])[:, None], points.shape[:-1] + (1,))
    return np.concatenate([points, s], axis=-1)


def resample_routes(routes: np.ndarray, points: int) -> np.ndarray:
    """Routes ``[..., M, 3]`` (``M >= 2``) resampled to ``[..., points, 3]``, linear along the road; NaN routes stay
    NaN."""
    routes = np.asarray(routes, dtype=np.float32)
    if routes.shape[-2] == points:
        return routes
    have, want = route_distances(routes.shape[-2]), route_distances(points)
    upper = np.clip(np.searchsorted(have, want), 1, len(have) - 1)
    weight = np.clip((want - have[upper - 1]) / (have[upper] - have[upper - 1]), 0.0, 1.0)[:, None]
    forward_left = routes[..., :2]
    return routes_from_xy(forward_left[..., upper - 1, :] * (1 - weight) + forward_left[..., upper, :] * weight)


def route_slot_values(routes: np.ndarray) -> np.ndarray:
    """Routes ``[..., K, 3]`` ``[x, y, s]`` as the model's route slots hold them, ``[y, x, s]``, float32."""
    return np.asarray(routes, dtype=np.float32)[..., [1, 0, 2]]


def slot_routes(routes: np.ndarray, rows: int) -> np.ndarray:
    """The route slots' values ``[rows, K, 3]`` float32: frame ``t``'s slots hold ``routes[t + 1]`` (``routes [T, K,
    3]``)."""
    arr = route_slot_values(routes)
    slots = arr[1 : rows + 1]
    return np.concatenate([slots, no_route(rows - len(slots), arr.shape[1])])


def check_route_shape(shape: tuple[int, ...], route_tokens: int, source: str = "routes", min_frames: int = 1,
                      values: tuple[int, ...] = (2, ROUTE_POINT_VALUES)) -> None:
    """Check routes of ``shape`` ``[frames >= min_frames, K, v]`` (v = 2: ``x, y``; 3: ``x, y, s``) against K =
    ``route_tokens``."""
    if not route_tokens:
        raise TerraInputError(f"{source}: {NO_ROUTE_SLOTS}, so it cannot take a route; leave the route out or use a "
                              "route-conditioned model")
    if len(shape) != 3 or shape[1] != route_tokens or shape[2] not in values:
        forms = [f"[frames, {route_tokens}, 3] (x, y, s)"]
        if 2 in values:
            forms.insert(0, f"[frames, {route_tokens}, 2] (x, y of the centreline at "
                            f"{_distances_text(route_tokens)} m ahead)")
        raise TerraInputError(f"{source}: routes must have shape {' or '.join(forms)}, got {list(shape)}")
    if shape[0] < min_frames:
        raise TerraInputError(f"{source}: covers {shape[0]} frames but the rollout needs routes for {min_frames}: "
                              "one per frame, the context frames' and the generated ones' (one more than the "
                              "actions, the last of which leads into the last frame)")


def validate_routes(routes: Any, route_tokens: int, source: str = "routes", min_frames: int = 1,
                    ahead: bool = False) -> np.ndarray:
    """Routes from a file or a request as ``[T, K, 3]`` float32 ``[x, y, s]``, checked against K = ``route_tokens``."""
    arr = finite_array(routes, source)
    check_route_shape(arr.shape, route_tokens, source, min_frames)
    if arr.shape[2] == 3 and not np.allclose(arr[..., 2], route_distances(route_tokens), atol=1e-3):
        raise TerraInputError(f"{source}: a route's third values must be its points' distances along the road, "
                              f"{_distances_text(route_tokens)} m; give [x, y] pairs to "
                              "leave them out")
    reach = np.abs(arr[..., :2]).max() if arr.size else 0.0
    if reach > MAX_ROUTE_M:
        raise TerraInputError(f"{source}: a route point lies {past(reach, MAX_ROUTE_M)} m from the car, more than "
                              f"{MAX_ROUTE_M:g} m; routes are in each frame's ego frame (x forward, y left, metres)")
    if ahead:
        check_ahead(arr[..., :2], source)
    return routes_from_xy(arr[..., :2])


def check_ahead(forward_left: np.ndarray, source: str) -> None:
    """Check each route of ``forward_left`` (``[T, K, 2]`` ego ``x, y``) starts ahead of its car (``x > 0``)."""
    forward = forward_left[:, 0, 0]
    behind = np.flatnonzero(forward <= 0.0)
    if len(behind):
        t = int(behind[0])
        raise TerraInputError(f"{source}: the route of frame {t} does not lie ahead of the car: its first point, "
                              f"{route_distances(forward_left.shape[1])[0]:g} m along the road, is at x = "
                              f"{float(forward[t]):.3g} m; a route runs ahead along the road, so its first point's "
                              "forward x must be above 0 (its rows are [x, y]: x forward, y left, in that frame's "
                              "ego frame)")


def _distances_text(points: int) -> str:
    return ", ".join(f"{d:g}" for d in route_distances(points))


__all__ = ["MAX_LANE_DISTANCE_M", "MAX_ROUTE_M", "NONE_GIVEN", "NO_LANE_NEAR", "NO_ROUTE_SLOTS", "ROAD_ENDED",
           "ROUTE_HORIZON_M", "ROUTE_POINT_VALUES", "ROUTE_VERDICTS", "TOLD", "check_ahead", "check_route_shape",
           "no_route", "resample_routes", "route_distances", "route_slot_values", "route_summary", "routes_from_xy",
           "slot_routes", "validate_routes"]
