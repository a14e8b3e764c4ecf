"""The frame measurements in torch, many frames at once: odometry of frame pairs, lane readings, frame changes,
PSNR and SSIM, lagged squared differences; the numpy path's numbers within float tolerance."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import torch

from terra.fidelity.bilinear import Taps
from terra.fidelity.lanes import (CENTRE_LINE_LEFT_M, EDGE_LINE_RIGHT_M, MIN_SPAN_M, ground_points, ground_rows,
                                  yellow_marking)
from terra.fidelity.odometry import (HUBER, LUMA, MIN_OVERLAP, MIN_SKY_LUMINANCE, MIN_TEXTURE, PHOTOMETRIC_PRIOR,
                                     BirdsEye, Motion, ladder, optical_depth, search_taps)
from terra.metrics import psnr_db
from terra.sim.renderer import camera

PAIRS_AT_ONCE = 64  # frame pairs aligned together (the finest grid's design matrices: 64 x 8,094 x 6 float64)
GEOMETRIC_SCALE = (1.0, 1.0, 0.1)  # the observability check's yaw at 10 m, as the numpy path's


def _tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.require(array, requirements=("C", "W")), device=device)  # torch takes no read-only


class _Grid:
    """A :class:`BirdsEye` grid's constants on a device."""

    def __init__(self, grid: BirdsEye, device: torch.device) -> None:
        self.grid, self.shape = grid, grid.seen.shape
        self.seen = _tensor(grid.seen.ravel(), device)
        self.pixels = _taps(grid.pixels, device)
        self.weight = _tensor(np.maximum(grid.weight, 1e-9), device)
        self.valid = _tensor(grid.valid, device)
        self.template = _tensor(grid.template.ravel(), device)
        self.points = _tensor(grid.points, device)
        self.depth_after = optical_depth(self.points[:, 0])
        self.kernels = [_gaussian_kernel(sigma, device) for sigma in grid.sigma]
        self.search, taps = search_taps(grid, 3)
        self.search_taps = _taps(taps, device)

    def images(self, grey: torch.Tensor) -> torch.Tensor:
        """:meth:`BirdsEye.image` of each of ``grey [F, H, W]``: ``[F, X, Y]`` float64, NaN where not valid."""
        grid = torch.zeros((len(grey), self.seen.numel()), dtype=torch.float64, device=grey.device)
        grid[:, self.seen] = _interpolate(grey.flatten(1), self.pixels, 0.0).float().double()
        grid = grid.view(len(grey), *self.shape)
        for axis, kernel in enumerate(self.kernels):
            grid = _correlate_reflect(grid, kernel, axis + 1)
        return torch.where(self.valid, grid / self.weight, torch.nan)


def _taps(where: Taps, device: torch.device) -> tuple:
    return (tuple(_tensor(c, device) for c in where.corners), tuple(_tensor(w, device) for w in where.weights),
            _tensor(where.inside, device))


def _interpolate(flat: torch.Tensor, where: tuple, cval: float, shared: bool = True) -> torch.Tensor:
    """``flat [N, cells]`` read bilinearly at ``where`` (shared points, or ``[N, P]`` per row), in float64."""
    corners, (row_w0, row_w1, col_w0, col_w1), inside = where

    def read(index: torch.Tensor) -> torch.Tensor:
        if shared:
            return flat.index_select(1, index.flatten()).view(len(flat), *index.shape).double()
        return torch.gather(flat, 1, index).double()

    total = sum(read(corner) * row_w * col_w for corner, row_w, col_w in zip(
        corners, (row_w0, row_w0, row_w1, row_w1), (col_w0, col_w1, col_w0, col_w1)))
    return torch.where(inside, total, cval)


def _gaussian_kernel(sigma: float, device: torch.device, truncate: float = 4.0) -> torch.Tensor:
    """scipy.ndimage's 1-D Gaussian weights for ``sigma`` (radius ``int(truncate * sigma + 0.5)``)."""
    radius = int(truncate * float(sigma) + 0.5)
    x = np.arange(-radius, radius + 1)
    weights = np.exp(-0.5 / float(sigma) ** 2 * x**2)
    return _tensor(weights / weights.sum(), device)


def _correlate_reflect(grid: torch.Tensor, kernel: torch.Tensor, axis: int) -> torch.Tensor:
    """``grid`` correlated with ``kernel`` along ``axis``, scipy.ndimage's ``mode="reflect"`` at the edges."""
    size, radius = grid.shape[axis], len(kernel) // 2
    index = torch.arange(-radius, size + radius, device=grid.device)
    index = torch.where(index < 0, -index - 1, index)
    index = torch.where(index >= size, 2 * size - index - 1, index).clamp(0, size - 1)
    padded = grid.index_select(axis, index)
    out = torch.zeros_like(grid)
    for k in range(len(kernel)):
        out = out + kernel[k] * padded.narrow(axis, k, size)
    return out


def _se2(motion: torch.Tensor) -> torch.Tensor:
    """``[N, 3, 3]`` homogeneous matrices of planar motions ``[N, 3]``."""
    c, s = torch.cos(motion[:, 2]), torch.sin(motion[:, 2])
    zero, one = torch.zeros_like(c), torch.ones_like(c)
    return torch.stack([torch.stack([c, -s, motion[:, 0]], -1), torch.stack([s, c, motion[:, 1]], -1),
                        torch.stack([zero, zero, one], -1)], 1)


def _masked_median(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """numpy's median of each row's ``values`` where ``mask`` (the two middle values' mean for an even count)."""
    count = mask.sum(1).clamp(min=1)
    ordered = torch.sort(torch.where(mask, values, torch.inf), 1).values
    low = torch.gather(ordered, 1, ((count - 1) // 2)[:, None])
    high = torch.gather(ordered, 1, (count // 2)[:, None])
    return ((low + high) / 2)[:, 0]


def _masked_correlation(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The normalised cross-correlation of each row's ``a`` and ``b`` where ``mask`` (0 without spread)."""
    count = mask.sum(1).clamp(min=1)

    def centred(x: torch.Tensor) -> torch.Tensor:
        x = torch.where(mask, x, 0.0)
        return torch.where(mask, x - (x.sum(1) / count)[:, None], 0.0)

    da, db = centred(a), centred(b)
    spread = torch.sqrt((da**2).sum(1) / count) * torch.sqrt((db**2).sum(1) / count)
    return torch.where(spread > 0, (da * db).sum(1) / count / torch.where(spread > 0, spread, 1.0), 0.0)


def _warp(grid: _Grid, earlier: torch.Tensor, motion: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``_warp`` of each pair: values, forward distance, seen (``[N, P]``)."""
    px, py = grid.points[:, 0], grid.points[:, 1]
    x = motion[:, 0, 0, None] * px + motion[:, 0, 1, None] * py + motion[:, 0, 2, None]
    y = motion[:, 1, 0, None] * px + motion[:, 1, 1, None] * py + motion[:, 1, 2, None]
    values = _interpolate(earlier.flatten(1), grid.grid.taps(x, y, torch), torch.nan, shared=False)
    return values, x, torch.isfinite(values)


def _search(grid: _Grid, earlier: torch.Tensor, later: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The coarse search's best motion of each pair ``[N, 3, 3]``, and which pairs kept enough ground in view."""
    template = later.flatten(1)[:, grid.template][:, ::3]
    corners, weights, inside = grid.search_taps
    values = _interpolate(earlier.flatten(1), (corners, weights, inside), torch.nan)  # [N, C, P]
    seen = torch.isfinite(values)
    count = seen.sum(2)
    least = MIN_OVERLAP * template.shape[1]
    cost = torch.where(seen, values - template[:, None], 0.0) ** 2
    cost = torch.where(count >= least, cost.sum(2) / count.clamp(min=1), torch.inf)
    return _tensor(grid.search, earlier.device)[torch.argmin(cost, 1)], count.max(1).values >= least


def _align(grid: _Grid, earlier: torch.Tensor, later: torch.Tensor, motion: torch.Tensor,
           ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_align`` of every pair at once: motions, matches, cells compared and which pairs were aligned."""
    points, cell = grid.points, grid.grid.level
    template = later.flatten(1)[:, grid.template]
    grad_x, grad_y = (g.flatten(1)[:, grid.template] for g in torch.gradient(
        torch.nan_to_num(later, nan=0.0), spacing=(cell.cell_x, cell.cell_y), dim=(1, 2)))
    ok = ok & (torch.hypot(grad_x, grad_y).mean(1) >= MIN_TEXTURE)
    design = torch.zeros((*template.shape, 6), dtype=torch.float64, device=later.device)
    design[..., 0], design[..., 1] = grad_x, grad_y
    design[..., 2] = -grad_x * points[:, 1] + grad_y * points[:, 0]
    design[..., 3] = -1.0
    scaling = _tensor(np.outer(GEOMETRIC_SCALE, GEOMETRIC_SCALE), later.device)
    prior = torch.zeros((6, 6), dtype=torch.float64, device=later.device)
    prior[3:, 3:] = torch.eye(3, dtype=torch.float64, device=later.device) / PHOTOMETRIC_PRIOR**2
    moving = ok.clone()
    for _ in range(cell.iterations):
        if not bool(moving.any()):
            break
        values, moved_x, seen = _warp(grid, earlier, motion)
        in_view = seen.sum(1) >= MIN_OVERLAP * len(points)
        ok, moving = ok & (in_view | ~moving), moving & in_view
        error = torch.where(seen, values - template, 0.0)
        scale = 1.4826 * _masked_median(error.abs(), seen) + 1e-3
        weight = seen * torch.clamp(HUBER * scale[:, None] / error.abs().clamp(min=1e-12), max=1.0)
        recede = torch.where(seen, grid.depth_after - optical_depth(moved_x), 0.0)
        design[..., 4] = -(torch.where(seen, values, 0.0) / 255.0 * recede)
        design[..., 5] = -recede
        normal = torch.einsum("npi,np,npj->nij", design, weight, design)
        eigen = torch.linalg.eigvalsh(normal[:, :3, :3] * scaling)
        observable = eigen[:, 0] > 1e-6 * eigen[:, -1].clamp(min=1e-12)
        ok, moving = ok & (observable | ~moving), moving & observable
        normal = normal + prior * scale[:, None, None] ** 2
        normal = torch.where(moving[:, None, None], normal, torch.eye(6, dtype=torch.float64, device=later.device))
        rhs = torch.where(moving[:, None], torch.einsum("npi,np->ni", design, weight * error), 0.0)
        solution = torch.linalg.solve(normal, rhs)
        motion = torch.where(moving[:, None, None], motion @ torch.linalg.inv(_se2(solution[:, :3])), motion)
        moving = moving & ~((solution[:, 0].abs() + solution[:, 1].abs() < 1e-4) & (solution[:, 2].abs() < 1e-5))
    values, _, seen = _warp(grid, earlier, motion)
    return motion, _masked_correlation(values, template, seen), seen.sum(1), ok


@lru_cache(maxsize=4)
def _grids(height: int, width: int, device: str) -> tuple[_Grid, ...]:
    """The odometry's grids for an image size on ``device`` (cached: the same for every drive)."""
    return tuple(_Grid(grid, torch.device(device)) for grid in ladder(height, width))


def luminance(frames: torch.Tensor) -> torch.Tensor:
    """``[F, H, W]`` float32 luminance (0-255) of uint8 frames ``[F, H, W, 3]``."""
    return frames.float() @ _tensor(LUMA, frames.device)


def estimate_pairs(frames: np.ndarray, pairs: Sequence[tuple[int, int]], min_match: float,
                   device: str) -> list[Motion | None]:
    """``estimate_motion`` for each pair ``(i, j)`` of ``frames [F, H, W, 3]`` on ``device``, many pairs at once."""
    if not pairs:
        return []
    height, width = frames.shape[1:3]
    where = torch.device(device)
    with torch.inference_mode():
        grey = luminance(_tensor(frames, where))
        sky = grey[:, :camera(height, width).ground_row0].mean((1, 2))
        grids = _grids(height, width, str(where))
        images = [grid.images(grey) for grid in grids]
        found: list[Motion | None] = []
        for start in range(0, len(pairs), PAIRS_AT_ONCE):
            chunk = torch.as_tensor(pairs[start:start + PAIRS_AT_ONCE], device=where)
            before, after = chunk[:, 0], chunk[:, 1]
            ok = torch.minimum(sky[before], sky[after]) >= MIN_SKY_LUMINANCE
            motion = None
            for grid, image in zip(grids, images):
                earlier, later = image[before], image[after]
                if motion is None:
                    motion, in_view = _search(grid, earlier, later)
                    ok = ok & in_view
                motion, match, cells, ok = _align(grid, earlier, later, motion, ok)
            ok = ok & (match >= min_match)
            dyaw = torch.atan2(motion[:, 1, 0], motion[:, 0, 0])
            rows = torch.stack([motion[:, 0, 2], motion[:, 1, 2], dyaw, match], 1).cpu().tolist()
            found += [Motion(*row, int(count)) if keep else None
                      for row, count, keep in zip(rows, cells.cpu().tolist(), ok.cpu().tolist())]
    return found


def frame_changes(frames: np.ndarray, device: str) -> np.ndarray:
    """``frame_changes`` of uint8 ``frames [T + 1, H, W, 3]`` on ``device``."""
    with torch.inference_mode():
        frames = _tensor(frames, torch.device(device)).float()
        return ((frames[1:] - frames[:-1]) ** 2).flatten(1).mean(1).double().cpu().numpy()


def lagged_squares(world: np.ndarray, truth: np.ndarray, max_lag: int, device: str) -> np.ndarray:
    """``_lagged_squares`` of uint8 frames ``[T, pixels]`` on ``device``: the same exact sums in float64."""
    steps = len(world)
    with torch.inference_mode():
        where = torch.device(device)
        w, b = _tensor(world, where).double(), _tensor(truth, where).double()
        lags = torch.arange(-max_lag, max_lag + 1, device=where)
        other = torch.arange(steps, device=where)[:, None] - lags  # the true frame t - k
        have = (other >= 0) & (other < steps)
        other = other.clamp(0, steps - 1)
        cross = torch.gather(w @ b.T, 1, other)
        squares = (w * w).sum(1)[:, None] + (b * b).sum(1)[other] - 2.0 * cross
        return torch.where(have, squares, torch.nan).cpu().numpy()


def estimate_steps(series: Sequence[np.ndarray], steps: Sequence[tuple[int, int, tuple[int, int]]],
                   min_match: float, device: str) -> dict[tuple[int, int], Motion | None]:
    """Series s's motion at step t between its frames k and k', for each ``(s, t, (k, k'))`` of ``steps``."""
    frames = sorted({(s, k) for s, _, firsts in steps for k in firsts})
    index = {key: i for i, key in enumerate(frames)}
    if not frames:
        return {}
    found = estimate_pairs(np.stack([series[s][k] for s, k in frames]),
                           [(index[(s, before)], index[(s, after)]) for s, _, (before, after) in steps], min_match,
                           device)
    return {(s, t): motion for (s, t, _), motion in zip(steps, found)}


def lane_readings(frames: np.ndarray, ahead: float, device: str, min_points: int = 12) -> np.ndarray:
    """``find_lane`` of each of uint8 ``frames [T, H, W, 3]`` on ``device``, ``ahead`` m ahead (NaN: no lane)."""
    height, width = frames.shape[1:3]
    band = ground_rows(height, width)
    where = torch.device(device)
    with torch.inference_mode():
        fwd, left, valid = (_tensor(a[band], where).flatten() for a in ground_points(height, width))
        rgb = _tensor(frames[:, band], where).float().flatten(1, 2)
        brightest, darkest = rgb.max(-1).values, rgb.min(-1).values
        yellow = valid & yellow_marking(rgb)
        white = valid & (brightest > 175) & (brightest - darkest < 45) & (left < -0.3)
        marked = yellow | white
        centre = torch.where(yellow, left - CENTRE_LINE_LEFT_M, left + EDGE_LINE_RIGHT_M)
        median = _masked_median(centre, marked)
        keep = marked & ((centre - median[:, None]).abs() < 1.5)
        span = torch.where(keep, fwd, -torch.inf).max(1).values - torch.where(keep, fwd, torch.inf).min(1).values
        found = (marked.sum(1) >= min_points) & (keep.sum(1) >= min_points) & (span >= MIN_SPAN_M)
        weight = keep / fwd.clamp(min=1.0)  # near pixels are sharper
        total, sx, sy = weight.sum(1), weight @ fwd, (weight * centre).sum(1)
        sxx, sxy = weight @ (fwd * fwd), (weight * fwd * centre).sum(1)
        slope = (total * sxy - sx * sy) / (total * sxx - sx * sx)
        offset = (sy - slope * sx) / total
        return torch.where(found, offset + slope * ahead, torch.nan).cpu().numpy()


SSIM_WINDOW, SSIM_K1, SSIM_K2 = 7, 0.01, 0.03  # scikit-image's defaults (a uniform window, sample covariances)


def psnr_ssim(frames: np.ndarray, reference: np.ndarray, device: str) -> tuple[list[float], list[float]]:
    """PSNR and SSIM of uint8 ``frames [T, H, W, 3]`` against ``reference`` on ``device``, as scikit-image has them."""
    where = torch.device(device)
    with torch.inference_mode():
        x, y = (_tensor(a, where).double().permute(0, 3, 1, 2) for a in (frames, reference))
        mse = ((x - y) ** 2).flatten(1).mean(1)
        mean = lambda z: torch.nn.functional.avg_pool2d(z, SSIM_WINDOW, stride=1)  # noqa: E731
        n = SSIM_WINDOW**2
        ux, uy = mean(x), mean(y)
        vx, vy, vxy = ((mean(a * b) - ua * ub) * n / (n - 1) for a, b, ua, ub in ((x, x, ux, ux), (y, y, uy, uy),
                                                                                  (x, y, ux, uy)))
        c1, c2 = (SSIM_K1 * 255) ** 2, (SSIM_K2 * 255) ** 2
        ssim = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux**2 + uy**2 + c1) * (vx + vy + c2))
        return [psnr_db(m) for m in mse.tolist()], ssim.flatten(1).mean(1).tolist()
