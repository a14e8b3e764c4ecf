"""Render a :class:`~terra.sim.scene.Scene` from an ego pose with the front camera, vectorised in numpy.

Pure function of (scene, pose, size): identical pixels every call."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from terra.core.errors import TerraInputError
from terra.inputs.ego_motion import to_ego, to_world
from terra.sim.camera import CAMERA_HEIGHT_M, CAMERA_HFOV_RAD, CAMERA_PITCH_RAD, FrontCamera
from terra.sim.lighting import GLOW, NightLights, headlight, night_lights
from terra.sim.scene import BUILDING, CAR, POLE, ROAD_HALF_WIDTH_M, SHOULDER_M, SIGN, Scene, TREE

FOG_M = 120.0  # haze scale: a colour at depth z keeps about exp(-z / FOG_M) of itself
FAR_M = 250.0  # the haze is complete here (the fog curve is rescaled to reach 1), nothing farther is drawn
FIELD_PERIOD_M = 16.0  # field checkerboard squares of 8 m, fixed in the world frame
DASH_PERIOD_M, DASH_ON_M = 10.0, 4.0  # centre line: 4 m dash, 6 m gap
LINE_WIDTH_M = 0.25  # markings are drawn a bit wider than real ones so a 16x tokenizer keeps them
EDGE_INSET_M = 0.15  # edge line's outer border inside the asphalt edge


@dataclass(frozen=True)
class Camera(FrontCamera):
    """The front camera at an image size, with the per-pixel ground geometry that depends only on the size."""

    ground_row0: int  # first row holding any ground pixel
    # Per ground-row pixel, float32; rows [ground_row0, height). Pixels whose ray misses the ground within
    # FAR_M have fwd = left = 0, depth = inf and footprints of 1 km.
    fwd: np.ndarray  # [Hg, W] ground hit point ahead of the camera (m), ego frame
    left: np.ndarray  # [Hg, W] ground hit point to the left (m), ego frame
    ground: np.ndarray  # [Hg, W, 2] both: (fwd, left)
    depth: np.ndarray  # [Hg, W] depth along the optical axis (m)
    foot_lat: np.ndarray  # [Hg, W] ground size of a pixel across the view (m)
    foot_long: np.ndarray  # [Hg, W] ground size of a pixel along the view (m)
    col_azimuth: np.ndarray  # [W] horizontal angle of each column at the horizon (rad, left positive)
    headlight: np.ndarray  # [Hg, W] the ego car's headlights' illuminance of the ground hit point (at night)


@lru_cache(maxsize=8)
def camera(height: int, width: int) -> Camera:
    """The camera for an image size (cached: the ground geometry is the same for every pose)."""
    lens = FrontCamera(height, width)
    row0 = int(np.clip(np.floor(lens.horizon), 0, height))
    rays = lens.rays(row0, FAR_M)
    near = rays.depth < FAR_M
    ones = np.ones(width)
    fwd, left = rays.fwd.astype(np.float32), rays.left.astype(np.float32)
    ground = np.stack([fwd, left], axis=-1)
    depth = (np.where(near, rays.depth, np.inf)[:, None] * ones).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        foot_long = np.where(near, CAMERA_HEIGHT_M / (lens.focal * rays.drop**2), 1e3)[:, None] * ones
    foot_lat = np.where(near, rays.depth / lens.focal, 1e3)[:, None] * ones
    col_azimuth = -np.arctan(rays.across * np.cos(CAMERA_PITCH_RAD))
    arrays = (fwd, left, ground, depth, foot_lat.astype(np.float32), foot_long.astype(np.float32), col_azimuth,
              headlight(fwd, left))
    for arr in arrays:
        arr.setflags(write=False)
    return Camera(height, width, row0, *arrays)


def render(scene: Scene, pose: np.ndarray, height: int, width: int) -> np.ndarray:
    """Image ``uint8 [height, width, 3]`` of ``scene`` seen from the ego pose ``(x, y, yaw)``."""
    pose = np.asarray(pose, dtype=np.float64).reshape(-1)
    if pose.shape != (3,) or not np.all(np.isfinite(pose)):
        raise TerraInputError(f"render pose must be 3 finite numbers (x, y, yaw), got {pose.tolist()}")
    if height < 8 or width < 8:
        raise TerraInputError(f"render size must be at least 8x8 pixels (got {height}x{width})")
    cam = camera(int(height), int(width))
    lights = night_lights(scene, pose)
    img = np.empty((cam.height, cam.width, 3), dtype=np.float32)
    _draw_sky(img, cam, scene.palette)
    _draw_hills(img, cam, scene, pose[2])
    _draw_ground(img, cam, scene, pose, lights)
    _draw_objects(img, cam, scene, pose, lights)
    return np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------------------------- background


def _draw_sky(img: np.ndarray, cam: Camera, pal) -> None:
    """Vertical gradient from the zenith colour at the top to haze at the horizon."""
    rows = np.arange(cam.height) + 0.5
    w = np.clip((cam.horizon - rows) / max(cam.horizon, 1.0), 0.0, 1.0) ** 0.7
    img[:] = (pal.haze[None, :] * (1 - w[:, None]) + pal.sky_top[None, :] * w[:, None])[:, None, :]


def _draw_hills(img: np.ndarray, cam: Camera, scene: Scene, yaw: float) -> None:
    """Far and near skylines, functions of world azimuth: they shift sideways only when the car turns."""
    rows_end = min(cam.ground_row0 + 1, cam.height)  # rows below are ground
    rows = np.arange(rows_end)[:, None] + 0.5
    far = 1e4  # metres: the hills are effectively at infinity
    for rng_idx, colour in ((0, scene.palette.hills_far), (1, scene.palette.hills_near)):
        f, amp, ph = scene.hills[rng_idx].T
        phase = f[None, :] * (yaw + cam.col_azimuth)[:, None] + ph[None, :]
        elev = scene.hills_base[rng_idx] + (amp[None, :] * np.sin(phase)).sum(1)
        _, top, _ = cam.project(far * np.cos(cam.col_azimuth), far * np.sin(cam.col_azimuth), far * np.tan(elev))
        cover = np.clip(rows - top[None, :] + 0.5, 0.0, 1.0)[..., None].astype(np.float32)
        img[:rows_end] += cover * (colour.astype(np.float32) - img[:rows_end])


def _segment_rows(cam: Camera, scene: Scene, pose: np.ndarray) -> list[tuple[int, slice]]:
    """For each road segment in view, the band of ground rows whose forward distance it can cover."""
    row_fwd = cam.fwd[:, 0]  # decreasing with the row; 0 beyond FAR_M
    bands = []
    for i, nearest, farthest in scene.segments_in_view(pose, FAR_M, CAMERA_HFOV_RAD / 2):
        rows = np.flatnonzero((row_fwd >= nearest) & (row_fwd <= farthest) & np.isfinite(cam.depth[:, 0]))
        if rows.size:
            bands.append((i, slice(int(rows[0]), int(rows[-1]) + 1)))
    return bands


def _fog(depth: np.ndarray) -> np.ndarray:
    """Haze coverage at optical ``depth``: 0 at the camera, 1 at ``FAR_M`` and beyond."""
    return np.minimum(np.expm1(-depth / np.float32(FOG_M)) / np.float32(np.expm1(-FAR_M / FOG_M)), 1.0)


def _box(x: np.ndarray, lo: float, hi: float, width: np.ndarray) -> np.ndarray:
    """Fraction of the interval ``[x - width/2, x + width/2]`` that lies inside ``[lo, hi]``."""
    half = width * np.float32(0.5)
    inside = np.minimum(x + half, np.float32(hi)) - np.maximum(x - half, np.float32(lo))
    return np.clip(inside / width, 0.0, 1.0)


def _periodic(x: np.ndarray, period: float, on: float, width: np.ndarray) -> np.ndarray:
    """Box-filtered coverage of a pattern that is 'on' for the first ``on`` metres of every ``period``."""

    period, on = np.float32(period), np.float32(on)

    def integral(v: np.ndarray) -> np.ndarray:  # measure of the 'on' set in [0, v]
        cycles = np.floor(v / period)
        return cycles * on + np.minimum(v - cycles * period, on)

    half = width * np.float32(0.5)
    return (integral(x + half) - integral(x - half)) / width


def _draw_ground(img: np.ndarray, cam: Camera, scene: Scene, pose: np.ndarray, lights: NightLights | None) -> None:
    """Ground pixels: fields, shoulder, asphalt and markings at the ray's hit point, faded into haze."""
    r0 = cam.ground_row0
    # each ground pixel's hit point in the world, one contiguous array per axis (strided views slow every op below)
    wx, wy = (np.ascontiguousarray(axis) for axis in np.moveaxis(to_world(cam.ground, pose), -1, 0))
    s, d = scene.road_coords(wx, wy, _segment_rows(cam, scene, pose))
    ad = np.abs(d)
    foot = np.maximum(cam.foot_lat, cam.foot_long) + np.float32(0.05)
    foot_d = cam.foot_lat * np.float32(1.5) + np.float32(0.02)
    foot_s = cam.foot_long + np.float32(0.02)

    half = FIELD_PERIOD_M / 2
    bx = _periodic(wx, FIELD_PERIOD_M, half, foot)
    by = _periodic(wy, FIELD_PERIOD_M, half, foot)
    edge_hi = ROAD_HALF_WIDTH_M - EDGE_INSET_M
    pal = scene.palette
    layers = (  # bottom to top: (coverage, colour); the base under them all is grass
        (bx + by - 2 * bx * by, pal.grass_alt),  # world-fixed checkerboard (x bands XOR y bands)
        (_box(ad, -1.0, ROAD_HALF_WIDTH_M + SHOULDER_M, foot_d), pal.shoulder),
        (_box(ad, -1.0, ROAD_HALF_WIDTH_M, foot_d), pal.asphalt),
        (_box(ad, edge_hi - LINE_WIDTH_M, edge_hi, foot_d), pal.edge_line),
        (_box(d, -LINE_WIDTH_M / 2, LINE_WIDTH_M / 2, foot_d) * _periodic(s, DASH_PERIOD_M, DASH_ON_M, foot_s),
         pal.centre_line),
        (_fog(cam.depth), pal.haze),
    )
    weights = np.empty(wx.shape + (len(layers) + 1,), dtype=np.float32)
    remaining = np.ones_like(wx)
    for k in range(len(layers), 0, -1):
        alpha = layers[k - 1][0]
        weights[..., k] = alpha * remaining
        remaining -= weights[..., k]
    weights[..., 0] = remaining
    palette = np.stack([pal.grass] + [colour for _, colour in layers]).astype(np.float32)
    if lights is None:
        colour = weights @ palette
    else:  # rows 4 and 5 of the palette: the markings
        colour = lights.ground(weights, palette, cam.fwd, cam.left, cam.headlight, retro=(4, 5))
    # Blend the first ground row with the sky by how much of it lies below the horizon.
    cover = np.clip(np.arange(r0, cam.height) + 1.0 - cam.horizon, 0.0, 1.0).astype(np.float32)[:, None, None]
    img[r0:] += cover * (colour - img[r0:])


# ------------------------------------------------------------------------------------------------ objects


def _draw_objects(img: np.ndarray, cam: Camera, scene: Scene, pose: np.ndarray, lights: NightLights | None) -> None:
    """Billboards of the objects in view, painted from far to near so nearer ones cover farther ones."""
    obj = scene.objects
    fwd, left = to_ego(obj.xy, pose).T
    u, v, depth = cam.project(fwd, left, np.zeros_like(fwd))
    scale = cam.focal / np.maximum(depth, 1e-6)  # pixels per metre at the object
    half_w = obj.size[:, 0] / 2 * scale
    visible = (depth > 1.0) & (depth < FAR_M) & (u + half_w > 0) & (u - half_w < cam.width)
    visible &= obj.size[:, 1] * scale > 0.5
    shown = np.flatnonzero(visible)[np.argsort(-depth[visible])]
    light = lights.objects(obj.kind[shown], fwd[shown], left[shown]) if lights is not None else [1.0] * len(shown)
    for i, lit in zip(shown, light):
        glow = GLOW.get(int(obj.kind[i])) if lights is not None and scene.lit[i] else None  # a lit lamp or windows
        _draw_object(img, obj.kind[i], u[i], v[i], scale[i], obj.size[i], obj.colour[i], obj.colour2[i],
                     scene.palette.haze, float(_fog(depth[i])), lit, glow)


def _draw_object(img, kind, u, v, scale, size, c1, c2, haze, fog, light=1.0, glow_colour=None) -> None:
    """One billboard from rectangles ``(x offset, width, bottom, top)`` and ellipses, in metres; colours are multiplied
    by ``light`` before fading into ``haze``; ``glow_colour``: what a lit part shines in."""
    w, h = size
    c1, c2, white = c1 * light, c2 * light, np.full(3, 0.95) * light
    c1, c2 = c1 + fog * (haze - c1), c2 + fog * (haze - c2)
    if glow_colour is not None:
        glow_colour = glow_colour + fog * (haze - glow_colour)
    if kind == TREE:
        _rect(img, u, v, scale, 0.0, 0.35, 0.0, 0.45 * h, c2)
        _ellipse(img, u, v, scale, 0.0, 0.62 * h, w / 2, 0.4 * h, c1)
    elif kind == POLE:
        _rect(img, u, v, scale, 0.0, 0.25, 0.0, h, c2)
        _rect(img, u, v, scale, 0.0, 0.7, h - 0.25, h, c2 * 0.8 if glow_colour is None else glow_colour)
    elif kind == SIGN:
        _rect(img, u, v, scale, 0.0, 0.12, 0.0, h - 0.5 * w, c2)
        _rect(img, u, v, scale, 0.0, w, h - w, h, white * (1 - fog) + fog * haze)
        _rect(img, u, v, scale, 0.0, 0.75 * w, h - 0.875 * w, h - 0.125 * w, c1)
    elif kind == BUILDING:
        _rect(img, u, v, scale, 0.0, w, 0.0, h, c1)
        _rect(img, u, v, scale, 0.0, w * 1.05, h, h + 0.25 * h, c2)
        _rect(img, u, v, scale, 0.0, w * 0.7, 0.45 * h, 0.7 * h, c1 * 0.55 if glow_colour is None else glow_colour)
    elif kind == CAR:
        _rect(img, u, v, scale, 0.0, w, 0.25, 0.95, c1)
        _rect(img, u, v, scale, 0.0, 0.75 * w, 0.95, h, c1 * 0.85)
        _rect(img, u, v, scale, 0.0, 0.6 * w, 1.0, h - 0.08, c2)
        for side in (-1.0, 1.0):
            _rect(img, u, v, scale, side * 0.35 * w, 0.3, 0.0, 0.35, np.full(3, 0.08) * light)
    else:
        raise ValueError(f"unknown object kind {kind}")


def _coverage_1d(lo: float, hi: float, n: int) -> tuple[int, np.ndarray]:
    """First index and per-pixel coverage of the interval ``[lo, hi]`` on pixels ``[j, j + 1]``, clipped to n."""
    j0, j1 = max(int(np.floor(lo)), 0), min(int(np.ceil(hi)), n)
    if j1 <= j0:
        return j0, np.zeros(0, dtype=np.float32)
    # Pixels strictly between the first and the last are covered whole (exactly 1).
    cover = np.ones(j1 - j0, dtype=np.float32)
    cover[0] = min(max(min(j0 + 1, hi) - max(j0, lo), 0.0), 1.0)
    cover[-1] = min(max(min(j1, hi) - max(j1 - 1, lo), 0.0), 1.0)
    return j0, cover


def _rect(img, u, v, scale, x_off, width, bottom, top, colour) -> None:
    """Paint an anti-aliased rectangle given in metres around the billboard's foot (u, v)."""
    left = u + (x_off - width / 2) * scale
    j0, cx = _coverage_1d(left, left + width * scale, img.shape[1])
    i0, cy = _coverage_1d(v - top * scale, v - bottom * scale, img.shape[0])
    if cx.size and cy.size:
        region = img[i0 : i0 + cy.size, j0 : j0 + cx.size]
        region += (cy[:, None] * cx[None, :])[..., None] * (np.asarray(colour, np.float32) - region)


def _ellipse(img, u, v, scale, x_off, centre_up, rx, ry, colour) -> None:
    """Paint an anti-aliased ellipse (centre ``centre_up`` metres above the foot, radii in metres)."""
    uc, vc, rx, ry = u + x_off * scale, v - centre_up * scale, rx * scale, ry * scale
    j0, j1 = max(int(np.floor(uc - rx)), 0), min(int(np.ceil(uc + rx)), img.shape[1])
    i0, i1 = max(int(np.floor(vc - ry)), 0), min(int(np.ceil(vc + ry)), img.shape[0])
    if j1 <= j0 or i1 <= i0:
        return
    du = (np.arange(j0, j1) + 0.5 - uc) / rx
    dv = (np.arange(i0, i1) + 0.5 - vc) / ry
    r = np.sqrt(dv[:, None] ** 2 + du[None, :] ** 2)
    cover = np.clip((1.0 - r) * min(rx, ry) + 0.5, 0.0, 1.0).astype(np.float32)
    region = img[i0:i1, j0:j1]
    region += cover[..., None] * (np.asarray(colour, np.float32) - region)
