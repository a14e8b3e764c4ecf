"""Points binned in square cells, to find the ones near a place without looking at all of them (numpy only)."""

from __future__ import annotations

import numpy as np

_OFFSET = 1 << 30  # cell coordinates shifted to be non-negative: |x| / cell_m stays far below this
_STRIDE = 1 << 31


class CellIndex:
    """``points [N, 2]`` binned in cells of ``cell_m`` metres."""

    def __init__(self, points: np.ndarray, cell_m: float) -> None:
        self.points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        self.cell_m = float(cell_m)
        keys = self._keys(self.points)
        self.order = np.argsort(keys, kind="stable")
        self.sorted_keys = keys[self.order]

    def _keys(self, xy: np.ndarray) -> np.ndarray:
        cell = np.floor(xy / self.cell_m).astype(np.int64) + _OFFSET
        return cell[..., 0] * _STRIDE + cell[..., 1]

    def near(self, xy: np.ndarray) -> np.ndarray:
        """Indices (ascending) of the points in the 3 x 3 cells around ``xy`` ``[2]``: all within ``cell_m``."""
        return np.sort(self.pairs(np.asarray(xy, dtype=np.float64)[None])[1])

    def counts(self, places: np.ndarray) -> np.ndarray:
        """``[Q]`` the number of points in the 3 x 3 cells around each of ``places`` ``[Q, 2]``."""
        return self._ranges(places)[1].reshape(len(places), len(_NEIGHBOURS)).sum(axis=1)

    def pairs(self, places: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(place, point)`` index pairs of every point in the 3 x 3 cells around each of ``places`` ``[Q, 2]``."""
        lo, counts = self._ranges(places)
        total = int(counts.sum())
        first = np.cumsum(counts) - counts
        rank = np.arange(total) - np.repeat(first, counts) + np.repeat(lo, counts)
        return np.repeat(np.arange(len(counts)) // len(_NEIGHBOURS), counts), self.order[rank]

    def _ranges(self, places: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each of the 9 cells around each place starts in the sorted points, and how many it holds."""
        keys = self._keys(places[:, None, :] + _NEIGHBOURS * self.cell_m).reshape(-1)  # [Q * 9]
        lo = np.searchsorted(self.sorted_keys, keys, side="left")
        return lo, np.searchsorted(self.sorted_keys, keys, side="right") - lo


_NEIGHBOURS = np.array([[dx, dy] for dx in (-1.0, 0.0, 1.0) for dy in (-1.0, 0.0, 1.0)])
