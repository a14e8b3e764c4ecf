"""The held-out data ``terra-evaluate`` measures on: scene seeds the training clips never used, frame-quality clips
and manoeuvre-adherence cases, from the checked settings."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from terra.contract.actions import FRAME_RATE_HZ
from terra.contract.routes import resample_routes
from terra.evaluation.settings import EvaluateSpec
from terra.inputs.trajectory import manoeuvre_trajectory
from terra.sim import Clip, Scene, make_clip
from terra.sim.clips import (
    FUTURE_S,
    SAMPLE_RATE_HZ,
    SCENE_LENGTH_M,
    VIEW_MARGIN_M,
    chain_trajectories,
    clip_from_trajectory,
    place,
    random_manoeuvre_params,
)


def clip_routes(clip: Clip, route_tokens: int) -> np.ndarray | None:
    """The routes of ``clip``'s frames for ``route_tokens`` route slots; None for a model without them."""
    return resample_routes(clip.routes, route_tokens) if route_tokens and clip.routes is not None else None


DIRECTION_PAIR = "curve_left/curve_right"
PAIR_PARAMS = {"curve": "radius_m", "accelerate": "accel_mps2", "decelerate": "accel_mps2", "stop": "accel_mps2",
               "lane_change": "change_s"}  # manoeuvre name prefix → the adherence range it draws from


@dataclass
class AdherenceCase:
    """One scene and start: the same straight context followed by each manoeuvre of a pair (and by straight)."""

    seed: int
    pair: tuple[str, str]
    clips: dict[str, Clip]  # pair members and "straight": frames [num_context + horizon, H, W, 3]
    params: dict[str, float]


def drive_scene_seed(seed: int, index: int) -> int:
    """The scene seed of drive ``index`` drawn by ``terra.sim.clips.random_drive(default_rng([seed, index]))``."""
    return int(np.random.default_rng([seed, index]).integers(2**31))


def training_scene_seeds(seed: int, num_clips: int) -> set[int]:
    """Scene seeds of ``terra-make-dataset``'s clips (:func:`drive_scene_seed` of each)."""
    return {drive_scene_seed(seed, i) for i in range(num_clips)}


def held_out_seeds(start: int, count: int, exclude: set[int]) -> list[int]:
    """``count`` scene seeds from ``start`` up, skipping ``exclude``."""
    seeds, candidate = [], int(start)
    while len(seeds) < count:
        if candidate not in exclude:
            seeds.append(candidate)
        candidate += 1
    return seeds


def quality_clips(spec: EvaluateSpec, seeds: list[int], image_size: tuple[int, int]) -> list[Clip]:
    """One clip of ``num_context + horizon`` frames per scene seed, manoeuvres cycled, as drawn for training."""
    names, (low, high), frames = spec.quality.manoeuvres, spec.quality.speed_kmh, spec.num_frames
    duration = (frames - 1) / FRAME_RATE_HZ + FUTURE_S
    clips = []
    for i, seed in enumerate(seeds):
        rng = np.random.default_rng([seed, 0xE7A1])
        scene = Scene.generate(seed, SCENE_LENGTH_M, spec.domain)
        name = names[i % len(names)]
        speed = float(rng.uniform(low, high))
        travel = (speed / 3.6 + 3.5 * duration) * duration
        start_s = float(rng.uniform(10.0, max(10.0, scene.length_m - travel - VIEW_MARGIN_M)))
        lateral = scene.ego_lane_offset_m + float(rng.uniform(-0.4, 0.4))
        params = random_manoeuvre_params(rng, name, speed)  # the training distribution's parameters for this manoeuvre
        clips.append(make_clip(scene, name, frames, *image_size, speed_kmh=speed, start_s=start_s, lateral_m=lateral,
                               **params))
    return clips


def straight_then(scene: Scene, name: str, start_s: float, speed: float, lead_s: float, num_frames: int,
                  image_size: tuple[int, int], params: dict[str, float]) -> Clip:
    """Lane keeping on a straight road for ``lead_s`` seconds, then ``name``, rendered for ``num_frames`` frames."""
    duration = (num_frames - 1) / FRAME_RATE_HZ + FUTURE_S
    local = manoeuvre_trajectory(name, duration - lead_s, speed_kmh=speed, rate_hz=SAMPLE_RATE_HZ, **params)
    if lead_s > 0:
        lead = manoeuvre_trajectory("straight", lead_s, speed_kmh=speed, rate_hz=SAMPLE_RATE_HZ)
        local = chain_trajectories(lead, local, duration)
    world = place(local, scene.lane_pose(start_s))
    return clip_from_trajectory(scene, world, num_frames, *image_size, f"straight>{name}", start_s, speed)


def adherence_cases(spec: EvaluateSpec, seeds: list[int], image_size: tuple[int, int]) -> list[AdherenceCase]:
    """Cases for every pair and scene seed; the context starts on the road's first (straight) segment."""
    adherence, frames = spec.adherence, spec.num_frames
    lead_s = (spec.run.num_context - 1) / FRAME_RATE_HZ
    cases = []
    for p, pair in enumerate(adherence.pairs):
        for seed in seeds:
            rng = np.random.default_rng([seed, 0xAD7E, p])
            scene = Scene.generate(seed, SCENE_LENGTH_M, spec.domain)
            speed = float(rng.uniform(*adherence.speed_kmh))
            # The scene's road starts with a straight of at least 30 m; the context stays on it.
            start_s = float(rng.uniform(10.0, max(10.0, min(20.0, scene.seg_len[0] - speed / 3.6 * lead_s - 1.0))))
            drawn = {key: float(rng.uniform(*adherence.params[key])) for key in dict.fromkeys(PAIR_PARAMS.values())}
            # Both members share the parameters that concern them (one radius for left and right, ...).
            params = {PAIR_PARAMS[k]: drawn[PAIR_PARAMS[k]] for k in PAIR_PARAMS if any(n.startswith(k) for n in pair)}
            clips = {name: straight_then(scene, name, start_s, speed, lead_s, frames, image_size, params)
                     for name in dict.fromkeys((*pair, "straight"))}
            cases.append(AdherenceCase(seed, pair, clips, params))
    return cases
