"""Bilinear reads of a 2-D grid at many points, bit for bit scipy's ``map_coordinates(order=1, mode="constant")``
without its per-point cost: the odometry's."""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np


class Taps(NamedTuple):
    """Where bilinear interpolation reads a grid: corners' flat indices, row and column weights, points inside."""

    corners: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    weights: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    inside: np.ndarray


def taps(shape: tuple[int, int], rows: Any, cols: Any, xp: ModuleType = np) -> Taps:
    """The :class:`Taps` of points ``(rows, cols)`` (float64, any shape; numpy, or torch with ``xp=torch``) on a grid of
    ``shape``, as scipy's order-1 ``map_coordinates(mode="constant")`` takes them."""
    height, width = shape
    inside = (rows >= 0) & (rows <= height - 1) & (cols >= 0) & (cols <= width - 1)
    rows, cols = xp.where(inside, rows, 0.0), xp.where(inside, cols, 0.0)
    row0, col0 = xp.floor(rows), xp.floor(cols)
    row_w0, col_w0 = 1.0 - (rows - row0), 1.0 - (cols - col0)
    i0, j0 = xp.asarray(row0, dtype=xp.int64), xp.asarray(col0, dtype=xp.int64)
    i1 = xp.where(i0 + 1 < height, i0 + 1, max(height - 2, 0)) * width
    j1 = xp.where(j0 + 1 < width, j0 + 1, max(width - 2, 0))
    i0 = i0 * width
    return Taps((i0 + j0, i0 + j1, i1 + j0, i1 + j1), (row_w0, 1.0 - row_w0, col_w0, 1.0 - col_w0), inside)


def interpolate(grid: np.ndarray, where: Taps, cval: float) -> np.ndarray:
    """``grid`` (2-D) read bilinearly at ``where``, ``cval`` outside, as scipy's ``map_coordinates(order=1)``."""
    flat = grid.ravel()
    (c00, c01, c10, c11), (row_w0, row_w1, col_w0, col_w1) = where.corners, where.weights
    total = flat[c00] * row_w0 * col_w0 + flat[c01] * row_w0 * col_w1 + flat[c10] * row_w1 * col_w0 \
        + flat[c11] * row_w1 * col_w1
    return np.where(where.inside, total, cval)
