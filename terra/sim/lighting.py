"""The night's light: moonlight, the ego car's headlights and lit street lamps, as factors on the palette's colours."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from terra.inputs.ego_motion import to_ego
from terra.sim.scene import BUILDING, POLE, SIGN, Scene

AMBIENT = np.array([0.05, 0.06, 0.09], dtype=np.float32)  # moonlight
HEAD_RGB = np.array([1.0, 0.96, 0.88], dtype=np.float32)  # halogen-warm white
HEAD_GAIN = 1.7  # headlight illuminance near the car (1 = full daylight)
HEAD_REACH_M = 16.0  # distance at which the beam has fallen to half
HEAD_SPREAD_RAD = (0.45, 0.30)  # beam half-width (1/e) to the right and to the left of straight ahead
RETRO_GAIN = 1.8  # retroreflective surfaces (markings, signs) send back this much more of the headlights
LAMP_RGB = np.array([1.0, 0.72, 0.38], dtype=np.float32)  # sodium orange
LAMP_GAIN = 0.9  # illuminance under a lamp
LAMP_RADIUS_M = 6.0  # the pool's 1/e radius
LAMP_RANGE_M = 160.0  # lamps farther ahead than this are lost in the haze
GLOW = {POLE: np.array([1.0, 0.88, 0.6]), BUILDING: np.array([0.95, 0.75, 0.35])}  # a lit lamp head, lit windows


def headlight(fwd: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Headlight illuminance at ego-frame ground points (metres ahead and to the left); 0 behind the car."""
    ahead = fwd > 0.1
    safe = np.where(ahead, fwd, 1.0)
    angle = np.arctan(left / safe)
    spread = np.where(angle < 0, HEAD_SPREAD_RAD[0], HEAD_SPREAD_RAD[1])
    falloff = HEAD_REACH_M**2 / (HEAD_REACH_M**2 + safe * safe + left * left)
    return np.where(ahead, HEAD_GAIN * np.exp(-((angle / spread) ** 2)) * falloff, 0.0).astype(np.float32)


def _pool(fwd: np.ndarray, left: np.ndarray, lamp_fwd: float, lamp_left: float) -> np.ndarray:
    d2 = (fwd - np.float32(lamp_fwd)) ** 2 + (left - np.float32(lamp_left)) ** 2
    return np.float32(LAMP_GAIN) * np.exp(d2 * np.float32(-1.0 / LAMP_RADIUS_M**2))


@dataclass(frozen=True)
class NightLights:
    """The lights of a night scene seen from one pose: the lit street lamps ahead, in the ego frame."""

    lamps: np.ndarray  # [L, 2] forward, left (m) of each lamp that is on and may light what is in view

    def ground(self, weights: np.ndarray, palette: np.ndarray, fwd: np.ndarray, left: np.ndarray,
               head: np.ndarray, retro: tuple[int, ...]) -> np.ndarray:
        """RGB ``[Hg, W, 3]`` of ground pixels from layer ``weights [Hg, W, K]`` and ``palette [K, 3]`` (last row:
        haze); rows ``retro`` are retroreflective; ``fwd``, ``left``: the pixels' ego-frame ground points; ``head``:
        headlight."""
        reflect = palette.copy()
        reflect[-1] = 0.0
        boosted = reflect.copy()
        boosted[list(retro)] *= np.float32(RETRO_GAIN)
        lamp = np.zeros_like(head)
        row_fwd = fwd[:, 0]  # decreasing with the row; 0 where the ray misses the ground
        reach = 3.0 * LAMP_RADIUS_M
        for lamp_fwd, lamp_left in self.lamps:
            rows = np.flatnonzero((row_fwd > max(lamp_fwd - reach, 0.0)) & (row_fwd < lamp_fwd + reach))
            if rows.size:
                band = slice(int(rows[0]), int(rows[-1]) + 1)
                lamp[band] += _pool(fwd[band], left[band], lamp_fwd, lamp_left)
        light = AMBIENT + lamp[..., None] * LAMP_RGB
        return ((weights @ reflect) * light + (weights @ boosted) * (head[..., None] * HEAD_RGB)
                + weights[..., -1:] * palette[-1])

    def objects(self, kind: np.ndarray, fwd: np.ndarray, left: np.ndarray) -> np.ndarray:
        """``[M, 3]`` light on objects whose feet are at ego-frame ``fwd``, ``left`` (sign plates retroreflective)."""
        head = headlight(fwd, left) * np.where(kind == SIGN, RETRO_GAIN, 1.0)
        lamp = sum((_pool(fwd, left, f, lit) for f, lit in self.lamps), np.zeros_like(fwd, dtype=np.float32))
        return AMBIENT + head[:, None] * HEAD_RGB + lamp[:, None] * LAMP_RGB


def night_lights(scene: Scene, pose: np.ndarray) -> NightLights | None:
    """The lights of ``scene`` seen from ``pose`` (x, y, yaw), or None by day (the palette is drawn as it is)."""
    if scene.domain != "night":
        return None
    obj = scene.objects
    on = (obj.kind == POLE) & scene.lit
    fwd, left = to_ego(obj.xy[on], pose).T
    reach = 3.0 * LAMP_RADIUS_M  # a pool's light ends here
    near = (fwd > -reach) & (fwd < LAMP_RANGE_M) & (np.abs(left) < np.maximum(fwd, 0.0) + reach)  # in view: 45 deg
    return NightLights(np.stack([fwd[near], left[near]], axis=1))
