"""The world model's route contract: a frame's route is ``[K, 3]`` floats ``[y, x, s]`` (docs/ARCHITECTURE.md,
"Routes").

A route is the road's centreline ahead of a pose, in that pose's ego frame (x forward, y left, metres): point ``k``
is the centreline point ``s_k`` metres along the road from the pose's nearest centreline point, with
``s_k = ROUTE_HORIZON_M * (k + 1) / K``, so ``K`` points reach as far as a frame shows road. The three values are
ordered as an action point's ``[y, x, time]``. ``routes[t]`` is always the route of frame ``t``: the road ahead of
the pose frame ``t`` was drawn from (files, datasets, requests). A model with ``num_route_tokens = K > 0`` carries,
after each frame's action slots, ``K`` route slots holding the route at the pose the next frame is drawn from: frame
``t``'s route slots hold ``routes[t + 1]`` and condition frame ``t + 1``, like ``actions[t]``
(terra/generation/rollout.py). A frame without a route holds NaN rows (:func:`no_route`), which the model replaces by
its learned "no route" embedding; that is the one place NaN means something, and it never comes from a file: routes
read from files are checked finite and in reach (:func:`validate_routes`) where they enter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from terra.core.errors import TerraInputError
from terra.generation.actions import finite_array

ROUTE_HORIZON_M = 80.0  # the last route point's distance along the road; a demo frame shows road to about 60 m
ROUTE_POINT_VALUES = 3  # [y, x, s], the width of an action point
MAX_ROUTE_M = 1000.0  # |y|, |x| of a route point: a sanity bound (a car that left the road far behind still has one)
# car's distance from the road, which the bound leaves room for


def route_distances(num_points: int) -> np.ndarray:
    """``s_k`` of a route of ``num_points`` points: evenly spaced up to :data:`ROUTE_HORIZON_M`, float32."""
    return (ROUTE_HORIZON_M * np.arange(1, num_points + 1) / num_points).astype(np.float32)


def no_route(num_frames: int, num_points: int) -> np.ndarray:
    """The routes of ``num_frames`` frames without one: NaN rows, which the model embeds as "no route"."""
    return np.full((num_frames, num_points, ROUTE_POINT_VALUES), np.nan, dtype=np.float32)


def route_points(lateral_forward: np.ndarray) -> np.ndarray:
    """Routes ``[..., K, 3]`` from the centreline's ``[..., K, 2]`` ego ``(y, x)`` at :func:`route_distances`."""
    points = np.asarray(lateral_forward, dtype=np.float32)
    s = np.broadcast_to(route_distances(points.shape[-2])[:, None], points.shape[:-1] + (1,))
    return np.concatenate([points, s], axis=-1)


def resample_routes(routes: np.ndarray, num_points: int) -> np.ndarray:
    """Routes ``[..., M, 3]`` (``M >= 2``) at :func:`route_distances` of ``M`` points → ``[..., num_points, 3]`` at
    those of ``num_points``: linear along the road, exact where the distances coincide (a dataset's 16 points give a
    model's 8, every second one); NaN routes stay NaN."""
    routes = np.asarray(routes, dtype=np.float32)
    if routes.shape[-2] == num_points:
        return routes
    have, want = route_distances(routes.shape[-2]), route_distances(num_points)
    upper = np.clip(np.searchsorted(have, want), 1, len(have) - 1)
    weight = np.clip((want - have[upper - 1]) / (have[upper] - have[upper - 1]), 0.0, 1.0)[:, None]
    points = routes[..., :2]
    return route_points(points[..., upper - 1, :] * (1 - weight) + points[..., upper, :] * weight)


def validate_routes(routes: Any, num_points: int, source: str = "routes", min_frames: int = 1) -> np.ndarray:
    """Check routes read from a file or a request, ``[T, K, 2]`` (``y, x``) or ``[T, K, 3]`` (``y, x, s``), against a
    model of ``num_points`` route slots; return them as ``[T, K, 3]`` float32."""
    arr = finite_array(routes, source)
    if arr.ndim != 3 or arr.shape[1] != num_points or arr.shape[2] not in (2, 3):
        raise TerraInputError(
            f"{source}: routes must have shape [frames, {num_points}, 2] (y, x of the centreline at "
            f"{_distances_text(num_points)} m ahead) or [frames, {num_points}, 3] (y, x, s), got {list(arr.shape)}"
        )
    if len(arr) < min_frames:
        raise TerraInputError(f"{source}: covers {len(arr)} frames but the rollout needs routes for {min_frames}; "
                              "give a route for every frame of the trajectory")
    if arr.shape[2] == 3 and not np.allclose(arr[..., 2], route_distances(num_points), atol=1e-3):
        raise TerraInputError(f"{source}: a route's third values must be its points' distances along the road, "
                              f"{_distances_text(num_points)} m; give [y, x] pairs to leave them out")
    reach = np.abs(arr[..., :2]).max() if arr.size else 0.0
    if reach > MAX_ROUTE_M:
        raise TerraInputError(f"{source}: a route point lies {reach:.0f} m from the car, more than "
                              f"{MAX_ROUTE_M:.0f} m; routes are in each frame's ego frame (x forward, y left, metres)")
    return route_points(arr[..., :2])


def _distances_text(num_points: int) -> str:
    return ", ".join(f"{d:g}" for d in route_distances(num_points))


__all__ = ["MAX_ROUTE_M", "ROUTE_HORIZON_M", "ROUTE_POINT_VALUES", "no_route", "resample_routes", "route_distances",
           "route_points", "validate_routes"]
