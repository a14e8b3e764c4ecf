"""Long drives with the states a driving policy leads a car into, for world-model training.

Lane-relative drives (behaviour segments of lateral offset and speed) and chains of ACT-Bench manoeuvres; scene
seeds of the closed-loop study's scenarios are never drawn."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from terra.core.errors import TerraInputError
from terra.contract.actions import FRAME_RATE_HZ
from terra.inputs.trajectory import MANOEUVRES, EgoTrajectory, manoeuvre_trajectory
from terra.sim.clips import (FUTURE_S, SAMPLE_RATE_HZ, VIEW_MARGIN_M, Drive, chain_trajectories, place,
                             random_manoeuvre_params)
from terra.sim.scene import ROAD_HALF_WIDTH_M, SHOULDER_M, Scene

LANE_RELATIVE_SHARE = 0.8
BEHAVIOURS = ("keep", "drift", "lane_change", "off_road", "weave", "bend", "wobble")
BEHAVIOUR_WEIGHTS = (0.1, 0.2, 0.08, 0.16, 0.14, 0.12, 0.2)
MAX_SLOPE = 0.4  # |d offset / d distance|: the heading stays within ~22 degrees of the road's
WEAVE_WAVELENGTH_M = (12.0, 45.0)
WOBBLE_WAVELENGTH_M = (4.0, 12.0)
WOBBLE_AMPLITUDE_M = (0.03, 0.4)  # drawn log-uniform, then bounded by the slope and curvature below
WOBBLE_MAX_SLOPE = 0.2  # of the wobble alone (the slower offsets it rides on keep MAX_SLOPE)
WOBBLE_MAX_CURVATURE = 0.05  # 1/m: a car's turn at the wobble's crest (a 20-m radius)
SMOOTHING_M = (2.0, 4.0)  # a drive's offsets under a Gaussian of this many metres (its sd drawn per drive)
MAX_SPEED_MPS = 70.0 / 3.6
GRID_M = 0.25  # resolution of the lateral offset along the distance driven
RESERVED_SCENARIO_SEEDS = (0, 1, 2, 3)  # the study's scenario seeds, kept out
RESERVED_SCENARIOS = 256  # of each, the first this many scenarios


@lru_cache(maxsize=1)
def reserved_scene_seeds() -> frozenset[int]:
    """Scene seeds of the first :data:`RESERVED_SCENARIOS` synthetic scenarios of each reserved scenario seed."""
    seeds = set()
    for seed in RESERVED_SCENARIO_SEEDS:
        rng = np.random.default_rng([seed, 0xD21E])
        for _ in range(RESERVED_SCENARIOS):
            seeds.add(int(rng.integers(2**31)))
            rng.uniform(size=2)  # the scenario's speed and start, drawn after its scene seed
    return frozenset(seeds)


def random_long_drive(rng: np.random.Generator, num_frames: int, domain: str = "day") -> Drive:
    """A drive of ``num_frames`` frames at 10 Hz (plus the 3 s of future its last actions need) of either kind."""
    if num_frames < 1:
        raise TerraInputError(f"a drive needs at least 1 frame (got num_frames={num_frames})")
    scene_seed = int(rng.integers(2**31))
    while scene_seed in reserved_scene_seeds():
        scene_seed = int(rng.integers(2**31))
    duration = (num_frames - 1) / FRAME_RATE_HZ + FUTURE_S + 0.05
    t = np.arange(int(np.ceil(duration * SAMPLE_RATE_HZ)) + 1) / SAMPLE_RATE_HZ
    speed0 = float(rng.uniform(10.0, 60.0)) / 3.6
    if rng.random() < LANE_RELATIVE_SHARE:
        speed = speed_profile(rng, t, speed0)
        travel = np.concatenate([[0.0], np.cumsum(speed[1:] / SAMPLE_RATE_HZ)])
        scene = Scene.generate(scene_seed, 40.0 + float(travel[-1]) + VIEW_MARGIN_M + 60.0, domain)
        start_s = float(rng.uniform(10.0, 40.0))
        grid = start_s + np.arange(int(np.ceil((float(travel[-1]) + 1.0) / GRID_M)) + 1) * GRID_M
        lateral, names = lateral_profile(rng, np.unwrap(scene.road_pose(grid)[:, 2]), scene.ego_lane_offset_m)
        trajectory = lane_relative_trajectory(scene, t, start_s + travel, start_s, lateral)
        return Drive(scene, trajectory, "long:" + "+".join(names), start_s, speed0 * 3.6)
    local, names = manoeuvre_chain(rng, duration, speed0 * 3.6)
    reach = float(np.hypot(local.x - local.x[0], local.y - local.y[0]).max())
    scene = Scene.generate(scene_seed, 40.0 + reach + VIEW_MARGIN_M + 60.0, domain)
    start_s = float(rng.uniform(10.0, 40.0))
    start = scene.lane_pose(start_s, scene.ego_lane_offset_m + float(rng.uniform(-0.4, 0.4)))
    return Drive(scene, place(local, start), "chain:" + ">".join(names), start_s, speed0 * 3.6)


def speed_profile(rng: np.random.Generator, t: np.ndarray, speed0: float) -> np.ndarray:
    """Speeds (m/s) at ``t`` in segments of 1.5-6 s (cruise, accelerate, brake, stop and go), within [0, MAX_SPEED_MPS].
    """
    dt = 1.0 / SAMPLE_RATE_HZ
    i = 0
    speed = speed0
    out = np.empty_like(t)
    while i < len(t):
        kind = rng.choice(("cruise", "accelerate", "brake", "stop"), p=(0.5, 0.2, 0.22, 0.08))
        n = int(rng.uniform(1.5, 6.0) * SAMPLE_RATE_HZ)
        if kind == "stop":
            a = -float(rng.uniform(2.0, 5.0))
            hold = int(rng.uniform(0.5, 3.0) * SAMPLE_RATE_HZ)
            restart = float(rng.uniform(1.5, 3.0))
            target = float(rng.uniform(15.0, 50.0)) / 3.6
            phase = "brake"
            while i < len(t):
                if phase == "brake":
                    speed = max(0.0, speed + a * dt)
                    phase = "hold" if speed == 0.0 else phase
                elif phase == "hold":
                    hold -= 1
                    phase = "go" if hold <= 0 else phase
                else:
                    speed = min(target, speed + restart * dt)
                    if speed >= target:
                        break
                out[i] = speed
                i += 1
            continue
        a = {"cruise": 0.0, "accelerate": float(rng.uniform(0.5, 2.5)),
             "brake": -float(rng.uniform(1.0, 4.0))}[str(kind)]
        floor = min(speed, float(rng.uniform(5.0, 20.0)) / 3.6)  # braking ends above a stop (stops are their own)
        for _ in range(min(n, len(t) - i)):
            speed = float(np.clip(speed + a * dt, floor, MAX_SPEED_MPS))
            out[i] = speed
            i += 1
    return out


def lateral_profile(rng: np.random.Generator, road_heading: np.ndarray, lane_m: float
                    ) -> tuple[np.ndarray, list[str]]:
    """Lateral offsets (m, left of the road's centre) every :data:`GRID_M` driven, from lane centre ``lane_m``, and the
    behaviours drawn."""
    n = len(road_heading)
    target = np.empty(n)
    fast = np.zeros(n)  # the wobbles, added after the smoothing
    names: list[str] = []
    lane = lane_m
    d = lane_m + float(rng.uniform(-0.4, 0.4))
    i = 0
    while i < n:
        name = str(rng.choice(BEHAVIOURS, p=BEHAVIOUR_WEIGHTS))
        names.append(name)
        swing = None
        if name == "bend":
            seg = _bend(rng, road_heading[i:], d, lane)
        elif name == "wobble":
            seg, swing = _wobble(rng, d, lane)
        else:
            seg, lane = _behaviour(rng, name, d, lane)
        take = min(len(seg), n - i)
        target[i:i + take] = seg[:take]
        if swing is not None:
            fast[i:i + take] = swing[:take]
        i += take
        d = float(seg[take - 1])
    limited = _slope_limited(target, MAX_SLOPE * GRID_M)
    return _smoothed(limited, sigma=float(rng.uniform(*SMOOTHING_M)) / GRID_M) + fast, names


def _behaviour(rng: np.random.Generator, name: str, d: float, lane: float) -> tuple[np.ndarray, float]:
    """One behaviour's target offsets from offset ``d`` in lane ``lane`` (its centre), and the lane after it."""
    def hold(value: float, metres: float) -> np.ndarray:
        return np.full(max(1, int(metres / GRID_M)), value)

    if name == "keep":
        k = int(rng.uniform(20.0, 80.0) / GRID_M)
        sigma, tau = float(rng.uniform(0.05, 0.35)), float(rng.uniform(5.0, 30.0)) / GRID_M
        noise = np.zeros(k)
        for j in range(1, k):  # Ornstein-Uhlenbeck around the lane centre
            noise[j] = noise[j - 1] * (1 - 1 / tau) + sigma * np.sqrt(2 / tau) * rng.normal()
        return np.concatenate([_ramp(d, lane, 10.0), lane + noise]), lane
    if name == "drift":  # to anywhere across the road and its shoulders: a policy's car stops between the lanes too
        reach = ROAD_HALF_WIDTH_M + SHOULDER_M
        away = float(rng.uniform(-reach, reach))
        return np.concatenate([_ramp(d, away, float(rng.uniform(15.0, 60.0))), hold(away, rng.uniform(5.0, 50.0)),
                               _ramp(away, lane, float(rng.uniform(10.0, 40.0)))]), lane
    if name == "lane_change":
        other = -lane  # the other lane's centre (lanes lie either side of the road's centre)
        return np.concatenate([_ramp(d, other, float(rng.uniform(25.0, 80.0))), hold(other, 10.0)]), other
    if name == "off_road":
        side = rng.choice((-1.0, 1.0))
        out = side * (ROAD_HALF_WIDTH_M + float(rng.uniform(0.3, SHOULDER_M + 6.0)))
        return np.concatenate([_ramp(d, out, float(rng.uniform(15.0, 50.0))), hold(out, rng.uniform(5.0, 60.0)),
                               _ramp(out, lane, float(rng.uniform(15.0, 50.0)))]), lane
    # weave: a lane follower that steers hard and late swings about its lane every 12-45 m, and the swing can grow
    # (off the road) or die away; the amplitude held, growing or dying along the segment
    amplitude, wavelength = float(rng.uniform(0.1, 1.5)), float(rng.uniform(*WEAVE_WAVELENGTH_M))
    s = np.arange(int(rng.uniform(40.0, 120.0) / GRID_M)) * GRID_M
    envelope = _envelope(rng, len(s))
    weave = amplitude * envelope * np.sin(2 * np.pi * s / wavelength)
    return np.concatenate([_ramp(d, lane, 10.0), lane + weave]), lane


def _envelope(rng: np.random.Generator, n: int) -> np.ndarray:
    """A swing's amplitude along its ``n`` samples: held, growing or dying (to 0.15 of it), one drawn."""
    kind = str(rng.choice(("held", "growing", "dying")))
    return {"held": np.ones(n), "growing": np.linspace(0.15, 1.0, n), "dying": np.linspace(1.0, 0.15, n)}[kind]


def _ramp(a: float, b: float, metres: float) -> np.ndarray:
    """Offsets from ``a`` to ``b`` over ``metres`` (every :data:`GRID_M`), eased in and out (half a cosine)."""
    k = max(2, int(metres / GRID_M))
    return a + (b - a) * (1.0 - np.cos(np.linspace(0.0, np.pi, k))) / 2.0


def _wobble(rng: np.random.Generator, d: float, lane: float) -> tuple[np.ndarray, np.ndarray]:
    """A wobble from offset ``d``: back to lane centre ``lane`` over 10 m, then 30-100 m about it; returns the slow
    target offsets and the swing added after smoothing."""
    wavelength = float(rng.uniform(*WOBBLE_WAVELENGTH_M))
    amplitude = float(np.exp(rng.uniform(*np.log(WOBBLE_AMPLITUDE_M))))
    back = _ramp(d, lane, 10.0)
    s = np.arange(int(rng.uniform(30.0, 100.0) / GRID_M)) * GRID_M
    envelope = _envelope(rng, len(s))
    # faded in and out over half a wavelength, so that the offset and the heading stay continuous at its ends
    envelope *= np.sin(np.pi / 2 * np.clip(np.minimum(s, s[-1] - s) / (wavelength / 2), 0.0, 1.0)) ** 2
    swing = amplitude * envelope * np.sin(2 * np.pi * s / wavelength)
    slope, curvature = np.abs(np.diff(swing)).max() / GRID_M, np.abs(np.diff(swing, 2)).max() / GRID_M**2
    swing *= min(1.0, WOBBLE_MAX_SLOPE / max(slope, 1e-9), WOBBLE_MAX_CURVATURE / max(curvature, 1e-9))
    return np.concatenate([back, np.full(len(s), lane)]), np.concatenate([np.zeros(len(back)), swing])


def _bend(rng: np.random.Generator, road_heading: np.ndarray, d: float, lane: float) -> np.ndarray:
    """Offsets of a car turning ``k`` times as much as the road for 30-120 m, then steering back to the lane centre."""
    k = float(rng.uniform(0.0, 0.7) if rng.random() < 0.6 else rng.uniform(1.3, 1.8))
    count = min(len(road_heading), max(2, int(rng.uniform(30.0, 120.0) / GRID_M)))
    turn = road_heading[:count] - road_heading[0]
    heading = rng.normal(0.0, 0.03) + (k - 1.0) * turn  # the car's heading relative to the road's
    offsets = d + np.concatenate([[0.0], np.cumsum(np.tan(np.clip(heading[:-1], -0.5, 0.5)) * GRID_M)])
    back = float(rng.uniform(15.0, 50.0))
    return np.concatenate([offsets, np.linspace(offsets[-1], lane, max(2, int(back / GRID_M)))])


def _smoothed(values: np.ndarray, sigma: float) -> np.ndarray:
    """``values`` under a Gaussian of ``sigma`` samples, the ends held."""
    radius = max(1, int(3 * sigma))
    kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    padded = np.concatenate([np.full(radius, values[0]), values, np.full(radius, values[-1])])
    return np.convolve(padded, kernel / kernel.sum(), mode="valid")


def _slope_limited(values: np.ndarray, step: float) -> np.ndarray:
    out = np.empty_like(values)
    out[0] = values[0]
    for i in range(1, len(values)):
        out[i] = out[i - 1] + np.clip(values[i] - out[i - 1], -step, step)
    return out


def lane_relative_trajectory(scene: Scene, t: np.ndarray, s: np.ndarray, start_s: float,
                             lateral: np.ndarray) -> EgoTrajectory:
    """The world trajectory at arc lengths ``s`` (times ``t``) with offsets ``lateral``; heading is the motion's."""
    d = np.interp(s - start_s, np.arange(len(lateral)) * GRID_M, lateral)
    poses = scene.lane_pose(s, d)
    x, y = poses[:, 0], poses[:, 1]
    step = np.hypot(np.diff(x), np.diff(y))
    heading = np.arctan2(np.diff(y), np.diff(x))
    yaw0 = heading[0] if step[0] > 1e-4 else poses[0, 2]
    moving = np.r_[True, step > 1e-4]  # a standing car keeps its heading
    yaw = np.r_[yaw0, heading][np.maximum.accumulate(np.where(moving, np.arange(len(x)), 0))]
    return EgoTrajectory(t=t, x=x, y=y, yaw=np.unwrap(yaw))


def manoeuvre_chain(rng: np.random.Generator, duration: float, speed_kmh: float
                    ) -> tuple[EgoTrajectory, list[str]]:
    """ACT-Bench manoeuvres of 1.5-4 s one after another from the origin (heading +x), ``duration`` seconds."""
    names: list[str] = []
    trajectory = None
    speed = speed_kmh
    while trajectory is None or trajectory.t[-1] < duration - 0.5 / SAMPLE_RATE_HZ:
        name = str(rng.choice(MANOEUVRES))
        if name == "stop" and speed < 5.0:
            name = "accelerate"
        names.append(name)
        part = manoeuvre_trajectory(name, float(rng.uniform(1.5, 4.0)), speed_kmh=max(speed, 1.0),
                                    rate_hz=SAMPLE_RATE_HZ, **random_manoeuvre_params(rng, name, max(speed, 1.0)))
        trajectory = part if trajectory is None else chain_trajectories(trajectory, part, duration)
        tail = np.hypot(np.diff(part.x[-2:]), np.diff(part.y[-2:]))
        speed = float(tail[0]) * SAMPLE_RATE_HZ * 3.6
    return trajectory, names
