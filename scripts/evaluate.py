"""Evaluate a world model + tokenizer on held-out clips of the synthetic world → report.json and a table.

    python scripts/evaluate.py                                       # the shipped demo models, Transformers backend
    python scripts/evaluate.py quality.num_clips=32 adherence.num_cases=20 num_threads=1 out_dir=outputs/eval/demo
    python scripts/evaluate.py backend=vllm sampling=terra           # sampled rollouts on vLLM

Everything is rendered on the fly by :mod:`terra.sim` from scene seeds that the training data never used
(``quality.scene_seed`` / ``adherence.scene_seed`` and up; the scene seeds of the world model's training clips,
``numpy.random.default_rng([exclude_training.seed, i])``'s first draw in ``scripts/make_dataset.py``, are
skipped), so the ground truth is exact. ``domain`` (terra/sim/scene.py: ``day``, the demo models' world, ``night``
or ``left_hand``) sets the scenes of both measurements; the same seeds give the same roads by day and at night,
and those roads mirrored in ``left_hand``.

This script draws the clips; :mod:`terra.evaluation` measures (details there):

Frame quality
    One clip per scene seed (manoeuvres cycled, speed and manoeuvre parameters drawn as for training): the
    first ``num_context`` frames are context, ``horizon`` frames are generated under the clip's own actions and
    compared with the ground truth (PSNR and SSIM per step, with the tokenizer's reconstruction and a repeated
    last context frame as references).

Manoeuvre adherence
    For each case and pair of opposite manoeuvres (``curve_left`` / ``curve_right``, ``accelerate`` /
    ``decelerate``), one context of ``num_context`` frames driving straight along the lane is followed by
    each manoeuvre in turn; each rollout is attributed to the manoeuvre whose ground-truth render its frames at
    ``adherence.horizons`` are closer to.

Every setting is checked (ranges in ``SETTINGS`` below and terra/config/) before torch is imported or
any model loads, the output folder included; a bad one ends with one line on stderr and exit code 2
(terra/apps/runner.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from terra.apps.runner import CONFIG_PATH, check_added_settings, run_app, task
from terra.config.backend import DTYPES, check_backend
from terra.core.device import check_device
from terra.config.checks import Range, check_choice, check_flag, check_settings, select
from terra.core.errors import TerraInputError
from terra.config.output_dir import claim_output_dir
from terra.config.sampling import SamplingConfig
from terra.config.snapshot import checkpoint_path
from terra.generation.actions import FRAME_RATE_HZ
from terra.inputs.trajectory import MANOEUVRES, MANOEUVRE_RANGES, manoeuvre_trajectory
from terra.sim import Clip, Scene, make_clip
from terra.sim.clips import (
    FUTURE_S, SAMPLE_RATE_HZ, SCENE_LENGTH_M, VIEW_MARGIN_M, chain_trajectories, clip_from_trajectory, place,
    random_manoeuvre_params,
)
from terra.sim.scene import DOMAINS
from terra.core.atomic import json_text

if TYPE_CHECKING:
    from terra.evaluation import AdherenceCase

DIRECTION_PAIR = "curve_left/curve_right"
PAIR_PARAMS = {"curve": "radius_m", "accelerate": "accel_mps2", "decelerate": "accel_mps2", "stop": "accel_mps2",
               "lane_change": "change_s"}  # manoeuvre name prefix → the adherence range it draws from
SEED = Range(0, 2**62 - 1, 0, whole=True)
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


# ---------------------------------------------------------------------------------------------- settings


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


# ---------------------------------------------------------------------------------------------- held-out data


def training_scene_seeds(seed: int, num_clips: int) -> set[int]:
    """Scene seeds of ``make_dataset.py``'s clips: clip i's scene is the first draw of ``default_rng([seed, i])``."""
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
    from terra.evaluation import AdherenceCase  # imports torch

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


# ---------------------------------------------------------------------------------------------- the run


def run(cfg: DictConfig, pipeline=None) -> dict:
    """Evaluate as configured, write ``<out_dir>/report.json`` atomically and return the report.

    ``pipeline`` (a :class:`terra.pipeline.WorldModelPipeline`) is built from ``cfg`` when not given; a
    pipeline built here is closed at the end.
    """
    t_start = time.perf_counter()
    sampling = check_config(cfg)
    # every setting is fine: now the heavy modules
    from terra.evaluation import evaluate_adherence, evaluate_quality
    from terra.config.spec import check_window
    from terra.models.checkpoint import read_world_model_config
    from terra.pipeline import WorldModelPipeline
    from terra.core.atomic import mark, write_text
    from terra.core.device import set_threads

    set_threads(None if cfg.num_threads is None else int(cfg.num_threads))
    exclude = training_scene_seeds(int(cfg.exclude_training.seed), int(cfg.exclude_training.num_clips))
    own = pipeline is None
    if own:
        world_model = checkpoint_path(cfg, "model", "world_model")
        config = read_world_model_config(world_model)
        check_window(config.num_temporal_embeddings, int(cfg.num_context))
        pipeline = WorldModelPipeline.from_pretrained(
            world_model, checkpoint_path(cfg, "tokenizer", "path"), backend=cfg.backend.name, device=cfg.device,
            dtype=cfg.dtype, config=config, **select(cfg, "backend.options"))
    else:
        check_window(pipeline.backend.layout.max_frames, int(cfg.num_context))
    load_s = time.perf_counter() - t_start
    image_size = tuple(pipeline.image_size)
    n_ctx = int(cfg.num_context)
    report: dict = {
        "world_model": str(cfg.model.world_model),
        "tokenizer": str(cfg.tokenizer.path),
        "backend": type(pipeline.backend).__name__,
        "device": str(pipeline.device),
        "sampling": OmegaConf.to_container(cfg.sampling),
        "num_context": n_ctx,
        "horizon": int(cfg.horizon),
        "image_size": list(image_size),
        "domain": str(cfg.domain),
    }
    say = _stage_lines(bool(cfg.progress))
    say(f"{report['backend']} on {report['device']} loaded in {load_s:.1f} s")
    try:
        if int(cfg.quality.num_clips) > 0:
            seeds = held_out_seeds(int(cfg.quality.scene_seed), int(cfg.quality.num_clips), exclude)
            say(f"frame quality: rendering {len(seeds)} held-out clips, then their rollouts ...")
            clips = quality_clips(cfg, seeds, image_size)
            report["quality"] = evaluate_quality(pipeline, clips, n_ctx, sampling, int(cfg.seed), bool(cfg.progress))
            report["quality"]["scene_seeds"] = [seeds[0], seeds[-1]]
        if int(cfg.adherence.num_cases) > 0:
            seeds = held_out_seeds(int(cfg.adherence.scene_seed), int(cfg.adherence.num_cases), exclude)
            say(f"manoeuvre adherence: rendering {len(seeds)} cases, then their rollouts ...")
            cases = adherence_cases(cfg, seeds, image_size)
            horizons = [int(h) for h in cfg.adherence.horizons or []]
            report["adherence"] = evaluate_adherence(pipeline, cases, n_ctx, horizons, sampling, int(cfg.seed),
                                                     bool(cfg.progress))
            report["adherence"]["scene_seeds"] = [seeds[0], seeds[-1]]
    finally:
        if own:
            pipeline.close()
    report["targets"] = _targets(cfg, report)
    report["timings"] = {"load_s": round(load_s, 2), "total_s": round(time.perf_counter() - t_start, 2)}
    out = Path(cfg.out_dir) / REPORT
    out.parent.mkdir(parents=True, exist_ok=True)
    mark(out.parent, [REPORT])
    write_text(out, json_text(report, indent=1) + "\n")
    report["path"] = str(out)
    return report


def _stage_lines(progress: bool):
    """A function printing a stage's line on stderr above the generation bars, when they show (a terminal)."""
    from tqdm import tqdm

    shown = progress and sys.stderr.isatty()
    return lambda line: tqdm.write(f"evaluate: {line}", file=sys.stderr) if shown else None


def _targets(cfg: DictConfig, report: dict) -> dict:
    targets = {}
    quality = report.get("quality")
    if quality is not None:
        value, target = quality["mean_psnr_target_frames"], float(cfg.targets.mean_psnr_db)
        targets["mean_psnr_db"] = {"value": value, "target": target, "frames": quality["target_frames"],
                                   "passed": bool(value >= target)}
    pair = report.get("adherence", {}).get("pairs", {}).get(DIRECTION_PAIR)
    if pair is not None:
        target = float(cfg.targets.direction_accuracy_pct)
        targets["direction_accuracy_pct"] = {"value": pair["accuracy_pct"], "target": target,
                                             "passed": bool(pair["accuracy_pct"] >= target)}
    return targets


def format_table(report: dict) -> str:
    """A compact text summary of a report."""
    lines = [f"{report['world_model']} + {report['tokenizer']} on {report['backend']} ({report['device']}), "
             f"sampling {report['sampling']}"]
    quality = report.get("quality")
    if quality is not None:
        lines.append(f"frame quality: {quality['num_clips']} held-out {report['domain']} clips, "
                     f"{report['num_context']} context frames, "
                     f"{quality['horizon']} generated ({quality['s_per_frame']:.3f} s/frame incl. decoding)")
        lines.append(f"{'step':>5} {'PSNR':>7} {'SSIM':>6} {'tok PSNR':>9} {'copy-last':>10}")
        for t in range(quality["horizon"]):
            lines.append(f"{t + 1:>5} {quality['psnr']['mean'][t]:>7.2f} {quality['ssim']['mean'][t]:>6.3f} "
                         f"{quality['tokenizer_psnr']['mean'][t]:>9.2f} {quality['copy_last_psnr']['mean'][t]:>10.2f}")
        lines.append(f"{'mean':>5} {quality['psnr']['overall']:>7.2f} {quality['ssim']['overall']:>6.3f} "
                     f"{quality['tokenizer_psnr']['overall']:>9.2f} {quality['copy_last_psnr']['overall']:>10.2f}")
        lines.append("  PSNR by manoeuvre: "
                     + ", ".join(f"{k} {v['psnr']:.1f} dB" for k, v in quality["by_manoeuvre"].items()))
    adherence = report.get("adherence")
    if adherence is not None:
        lines.append(f"manoeuvre adherence ({report['domain']}): generated frames {adherence['horizons']} vs renders "
                     "of each candidate")
        lines.append(f"{'pair':<24} {'cases':>5} {'correct':>8} {'per rollout':>22} {'3-way':>7} {'margin':>8}")
        for key, pair in adherence["pairs"].items():
            per = " ".join(f"{v:.0f}%" for v in pair["rollout_accuracy_pct"].values())
            lines.append(f"{key:<24} {pair['num_cases']:>5} {pair['accuracy_pct']:>7.1f}% {per:>22} "
                         f"{pair['accuracy_with_straight_pct']:>6.1f}% {pair['mean_margin_db']:>6.2f}dB")
    for name, t in report["targets"].items():
        lines.append(f"target {name}: {t['value']:.2f} vs {t['target']:.2f} → {'PASS' if t['passed'] else 'FAIL'}")
    lines.append(f"report: {report['path']} ({report['timings']['total_s']:.0f} s)")
    return "\n".join(lines)


@hydra.main(config_path=CONFIG_PATH, config_name="evaluate", version_base=None)
@task
def main(cfg: DictConfig) -> None:
    """Hydra entry point: evaluate and print the table (errors and exit codes: terra/hydra_app.run_app)."""
    check_added_settings("python scripts/evaluate.py", allowed=("backend.options.",))
    print(format_table(run(cfg)))


if __name__ == "__main__":
    run_app(main, "evaluate", "python scripts/evaluate.py")
