"""The settings of ``terra-evaluate`` checked before anything loads (:func:`check_config`), and the held-out data
it measures on: scene seeds the training clips never used, frame-quality clips and manoeuvre-adherence cases
(terra/evaluation/__init__.py says how they are drawn)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from omegaconf import DictConfig

from terra.config.backend import DTYPES, check_backend
from terra.config.checks import SEED, Range, check_choice, check_flag, check_settings, select
from terra.config.output_dir import claim_output_dir
from terra.config.sampling import SamplingConfig
from terra.config.snapshot import checkpoint_path
from terra.core.device import check_device
from terra.core.errors import TerraInputError
from terra.generation.actions import FRAME_RATE_HZ
from terra.inputs.trajectory import MANOEUVRE_RANGES, MANOEUVRES, manoeuvre_trajectory
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
from terra.sim.scene import DOMAINS

if TYPE_CHECKING:
    from terra.evaluation.measure import AdherenceCase

DIRECTION_PAIR = "curve_left/curve_right"
PAIR_PARAMS = {"curve": "radius_m", "accelerate": "accel_mps2", "decelerate": "accel_mps2", "stop": "accel_mps2",
               "lane_change": "change_s"}  # manoeuvre name prefix → the adherence range it draws from
REPORT = "report.json"  # in out_dir
SETTINGS = {
    "num_context": Range(1, 64, 3, whole=True),
    "horizon": Range(1, 1000, 10, whole=True),
    "seed": SEED,
    "num_threads": Range(1, 1024, 1, whole=True, nullable=True),
    "quality.num_clips": Range(0, 100_000, 32, whole=True),
    "quality.scene_seed": SEED,
    "adherence.num_cases": Range(0, 100_000, 20, whole=True),
    "adherence.scene_seed": SEED,
    "exclude_training.seed": SEED,
    "exclude_training.num_clips": Range(0, 1_000_000, 5000, whole=True),
    "targets.direction_accuracy_pct": Range(0, 100, 90),
    "targets.mean_psnr_db": Range(0, 100, 20),
}


def _range(value, name: str, key: str) -> tuple[float, float]:
    """A ``[low, high]`` setting of numbers inside manoeuvre parameter ``key``'s range, ``0 < low <= high``."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError, OverflowError):
        raise TerraInputError(
            f"{name} must be a [low, high] pair of numbers (got {value}); e.g. {name}=[20,40]") from None
    for bound in (low, high):
        MANOEUVRE_RANGES[key].check(bound, name)
    if not 0 < low <= high:
        raise TerraInputError(f"{name} must satisfy 0 < low <= high (got [{low}, {high}])")
    return low, high


def check_config(cfg: DictConfig) -> SamplingConfig:
    """Raise :class:`TerraInputError` for a bad setting, before anything is imported, loaded or rendered; return
    the checked sampling settings."""
    values = check_settings(cfg, SETTINGS)
    if values["quality.num_clips"] == 0 and values["adherence.num_cases"] == 0:
        raise TerraInputError("nothing to evaluate: set quality.num_clips or adherence.num_cases above 0")
    names = _quality_manoeuvres(cfg)
    for name in names + [n for pair in _pairs(cfg) for n in pair]:
        if name not in MANOEUVRES:
            raise TerraInputError(f"unknown manoeuvre {name!r}; choose from: {', '.join(MANOEUVRES)}")
    if values["adherence.num_cases"] > 0 and not _pairs(cfg):
        raise TerraInputError("adherence.pairs is empty; e.g. adherence.pairs=[[curve_left,curve_right]]")
    horizons = select(cfg, "adherence.horizons") or []
    if not isinstance(horizons, list):
        raise TerraInputError(f"adherence.horizons must be a list (got {horizons!r}); e.g. [4,7,10]")
    for horizon in horizons:
        Range(1, 1000, "[4,7,10]", whole=True).check(horizon, "adherence.horizons")
    for key in ("speed_kmh", "radius_m", "accel_mps2", "change_s"):
        _range(cfg.adherence[key], f"adherence.{key}", key)
    _range(cfg.quality.speed_kmh, "quality.speed_kmh", "speed_kmh")
    check_choice(cfg.domain, "domain", DOMAINS)
    check_flag(cfg.progress, "progress")
    check_device(cfg.device)
    check_choice(cfg.dtype, "dtype", DTYPES)
    check_backend(cfg.backend.name, select(cfg, "backend.options"))
    claim_output_dir(str(cfg.out_dir), "out_dir", files=[REPORT], inputs=[
        ("world model", checkpoint_path(cfg, "model", "world_model")),
        ("tokenizer", checkpoint_path(cfg, "tokenizer", "path"))])
    return SamplingConfig.from_mapping(select(cfg, "sampling"))


def _quality_manoeuvres(cfg: DictConfig) -> list[str]:
    names = cfg.quality.manoeuvres
    if names is None:
        return list(MANOEUVRES)
    names = [names] if isinstance(names, str) else [str(n) for n in names]
    if not names:
        raise TerraInputError("quality.manoeuvres is empty; use null for every manoeuvre")
    return names


def _pairs(cfg: DictConfig) -> list[tuple[str, str]]:
    pairs = []
    for pair in cfg.adherence.pairs or []:
        if isinstance(pair, str) or len(pair) != 2 or pair[0] == pair[1]:
            raise TerraInputError(f"adherence.pairs holds two different manoeuvres per entry (got {pair}); "
                                  "e.g. adherence.pairs=[[curve_left,curve_right]]")
        pairs.append((str(pair[0]), str(pair[1])))
    return pairs


def training_scene_seeds(seed: int, num_clips: int) -> set[int]:
    """Scene seeds of ``terra-make-dataset``'s clips: clip i's scene is the first draw of ``default_rng([seed, i])``."""
    return {int(np.random.default_rng([seed, i]).integers(2**31)) for i in range(num_clips)}


def held_out_seeds(start: int, count: int, exclude: set[int]) -> list[int]:
    """``count`` scene seeds from ``start`` up, skipping ``exclude``."""
    seeds, candidate = [], int(start)
    while len(seeds) < count:
        if candidate not in exclude:
            seeds.append(candidate)
        candidate += 1
    return seeds


def quality_clips(cfg: DictConfig, seeds: list[int], image_size: tuple[int, int]) -> list[Clip]:
    """One clip of ``num_context + horizon`` frames per scene seed, manoeuvres cycled, as drawn for training."""
    names = _quality_manoeuvres(cfg)
    low, high = _range(cfg.quality.speed_kmh, "quality.speed_kmh", "speed_kmh")
    frames = int(cfg.num_context) + int(cfg.horizon)
    duration = (frames - 1) / FRAME_RATE_HZ + FUTURE_S
    clips = []
    for i, seed in enumerate(seeds):
        rng = np.random.default_rng([seed, 0xE7A1])
        scene = Scene.generate(seed, SCENE_LENGTH_M, cfg.domain)
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


def adherence_cases(cfg: DictConfig, seeds: list[int], image_size: tuple[int, int]) -> list[AdherenceCase]:
    """Cases for every pair and scene seed; the context starts on the road's first (straight) segment."""
    from terra.evaluation.measure import AdherenceCase  # imports torch

    ad = cfg.adherence
    n_ctx, frames = int(cfg.num_context), int(cfg.num_context) + int(cfg.horizon)
    lead_s = (n_ctx - 1) / FRAME_RATE_HZ
    cases = []
    for p, pair in enumerate(_pairs(cfg)):
        for seed in seeds:
            rng = np.random.default_rng([seed, 0xAD7E, p])
            scene = Scene.generate(seed, SCENE_LENGTH_M, cfg.domain)
            speed = float(rng.uniform(*_range(ad.speed_kmh, "adherence.speed_kmh", "speed_kmh")))
            # The scene's road starts with a straight of at least 30 m; the context stays on it.
            start_s = float(rng.uniform(10.0, max(10.0, min(20.0, scene.seg_len[0] - speed / 3.6 * lead_s - 1.0))))
            drawn = {key: float(rng.uniform(*_range(ad[key], f"adherence.{key}", key)))
                     for key in dict.fromkeys(PAIR_PARAMS.values())}
            # Both members share the parameters that concern them (one radius for left and right, ...).
            params = {PAIR_PARAMS[k]: drawn[PAIR_PARAMS[k]] for k in PAIR_PARAMS if any(n.startswith(k) for n in pair)}
            clips = {name: straight_then(scene, name, start_s, speed, lead_s, frames, image_size, params)
                     for name in dict.fromkeys((*pair, "straight"))}
            cases.append(AdherenceCase(seed, pair, clips, params))
    return cases
