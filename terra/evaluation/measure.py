"""``terra-evaluate``'s two measurements and their held-out data: unused scenes, quality clips, adherence cases."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Callable, TYPE_CHECKING

import numpy as np

from terra.config.sampling import SamplingConfig
from terra.contract.actions import FRAME_RATE_HZ
from terra.contract.routes import resample_routes
from terra.evaluation.settings import EvaluateSpec
from terra.generation.rollout import RolloutRequest
from terra.inputs.trajectory import manoeuvre_trajectory
from terra.metrics import PSNR_CAP_DB, psnr, psnr_db, ssim
from terra.sim import Clip, Scene, make_clip
from terra.sim.clips import (FUTURE_S, SAMPLE_RATE_HZ, SCENE_LENGTH_M, VIEW_MARGIN_M, chain_trajectories,
                             clip_from_trajectory, place, random_manoeuvre_params)
from terra.tokenizer.images import frames_to_tensor


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
    return list(itertools.islice((seed for seed in itertools.count(int(start)) if seed not in exclude), count))


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


if TYPE_CHECKING:
    from terra.pipeline import RolloutResult, WorldModelPipeline

TARGET_STEPS = 10  # the PSNR target covers the first 10 generated frames


def _capped(values: list[float]) -> list[float]:
    return [min(v, PSNR_CAP_DB) for v in values]


def _stats(rows: np.ndarray) -> dict:
    """Per-step mean/std over rollouts (``rows [N, T]``) and the overall mean."""
    return {"mean": rows.mean(axis=0).round(4).tolist(), "std": rows.std(axis=0).round(4).tolist(),
            "overall": round(float(rows.mean()), 4)}


def evaluate_quality(pipeline: WorldModelPipeline, clips: list[Clip], n_ctx: int, sampling: SamplingConfig,
                     seed: int, progress: bool, say: Callable[[str], None] | None = None) -> dict:
    """PSNR/SSIM per horizon step of generated vs ground-truth frames, with the tokenizer and copy-last references."""
    horizon = clips[0].num_frames - n_ctx
    codes = pipeline.encode(frames_to_tensor(np.concatenate([c.frames for c in clips])))
    codes = codes.reshape(len(clips), n_ctx + horizon, *codes.shape[1:])
    route_tokens = pipeline.backend.layout.route_tokens
    requests = [RolloutRequest(codes[i, :n_ctx], clip.actions, horizon, seed=seed + i,
                               routes=clip_routes(clip, route_tokens)) for i, clip in enumerate(clips)]
    results, generate_s = _rollouts(pipeline, requests, sampling, progress, say,
                                    f"frame quality: decoding the {len(requests)} rollouts and the tokenizer's "
                                    "reconstructions of their true frames, then scoring them ...")
    recon = pipeline.decode(codes[:, n_ctx:].reshape(-1, *codes.shape[2:]))  # the tokenizer's own reconstruction
    recon = recon.reshape(len(clips), horizon, *recon.shape[1:])
    gen_psnr, gen_ssim, tok_psnr, tok_ssim, copy_psnr, per_clip = [], [], [], [], [], []
    for clip, result, rec in zip(clips, results, recon):
        truth = clip.frames[n_ctx:]
        generated = result.frames[result.num_context :]
        gen_psnr.append(_capped(psnr(generated, truth)))
        gen_ssim.append(ssim(generated, truth))
        tok_psnr.append(_capped(psnr(rec, truth)))
        tok_ssim.append(ssim(rec, truth))
        copy_psnr.append(_capped(psnr(np.repeat(clip.frames[n_ctx - 1 : n_ctx], horizon, axis=0), truth)))
        per_clip.append({"seed": clip.seed, "manoeuvre": clip.manoeuvre, "speed_kmh": round(clip.speed_kmh, 2),
                         "psnr": [round(v, 3) for v in gen_psnr[-1]], "ssim": [round(v, 4) for v in gen_ssim[-1]],
                         "tokenizer_psnr": round(float(np.mean(tok_psnr[-1])), 3)})
    gen_psnr, copy_psnr = np.array(gen_psnr), np.array(copy_psnr)
    by_manoeuvre = {}
    for name in dict.fromkeys(c.manoeuvre for c in clips):
        rows = [i for i, c in enumerate(clips) if c.manoeuvre == name]
        by_manoeuvre[name] = {"clips": len(rows), "psnr": round(float(gen_psnr[rows].mean()), 4),
                              "ssim": round(float(np.mean([gen_ssim[i] for i in rows])), 4)}
    steps = min(TARGET_STEPS, horizon)
    return {"num_clips": len(clips), "horizon": horizon, "psnr": _stats(gen_psnr), "ssim": _stats(np.array(gen_ssim)),
            "tokenizer_psnr": _stats(np.array(tok_psnr)), "tokenizer_ssim": _stats(np.array(tok_ssim)),
            "copy_last_psnr": _stats(copy_psnr),
            "target_frames": steps,  # the PSNR target covers the first min(10, horizon) generated frames
            "mean_psnr_target_frames": round(float(gen_psnr[:, :steps].mean()), 4), "by_manoeuvre": by_manoeuvre,
            "clips": per_clip, "generate_s": round(generate_s, 2),
            "s_per_frame": round(generate_s / (len(clips) * horizon), 4)}


def _rollouts(pipeline: WorldModelPipeline, requests: list[RolloutRequest], sampling: SamplingConfig, progress: bool,
              say: Callable[[str], None] | None, line: str) -> tuple[list[RolloutResult], float]:
    """The rollouts of ``requests``, generated then decoded after ``say(line)``, and the seconds they took."""
    start = time.perf_counter()
    results = pipeline.generate(requests, sampling, progress=progress, decode=False)
    if say is not None:
        say(line)
    for result in results:
        result.frames = pipeline.frames(result.codes, result.request.seed)[0]
    return results, time.perf_counter() - start


def _mse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


def evaluate_adherence(pipeline: WorldModelPipeline, cases: list[AdherenceCase], n_ctx: int,
                       horizons: list[int], sampling: SamplingConfig, seed: int, progress: bool,
                       say: Callable[[str], None] | None = None) -> dict:
    """Attribute each rollout to the closest candidate manoeuvre."""
    horizon = next(iter(cases[0].clips.values())).num_frames - n_ctx
    steps = sorted({h for h in horizons if h <= horizon}) or [horizon]
    contexts = pipeline.encode(frames_to_tensor(np.concatenate([c.clips[c.pair[0]].frames[:n_ctx] for c in cases])))
    contexts = contexts.reshape(len(cases), n_ctx, *contexts.shape[1:])
    route_tokens = pipeline.backend.layout.route_tokens
    requests = [RolloutRequest(contexts[j], case.clips[name].actions, horizon, seed=seed + 2 * j + k,
                               routes=clip_routes(case.clips[name], route_tokens))
                for j, case in enumerate(cases) for k, name in enumerate(case.pair)]
    results, generate_s = _rollouts(pipeline, requests, sampling, progress, say,
                                    f"manoeuvre adherence: decoding the {len(requests)} rollouts, then matching them "
                                    "with each candidate's true frames ...")
    results = iter(results)
    idx = [n_ctx + h - 1 for h in steps]
    records: dict[str, list[dict]] = {}
    for case in cases:
        record = {"seed": case.seed, "speed_kmh": round(case.clips[case.pair[0]].speed_kmh, 2),
                  "params": {k: round(v, 3) for k, v in case.params.items()}, "rollouts": {}}
        for name in case.pair:
            generated = next(results).frames[idx]
            mse = {cand: float(np.mean([_mse(g, clip.frames[i]) for g, i in zip(generated, idx)]))
                   for cand, clip in case.clips.items()}
            chosen = min(case.pair, key=lambda c: mse[c])
            record["rollouts"][name] = {
                "matched": chosen,
                "matched_with_straight": min(mse, key=mse.get),
                "psnr_to": {cand: round(min(PSNR_CAP_DB, psnr_db(m)), 3) for cand, m in mse.items()},
                "margin_db": round(min(PSNR_CAP_DB, psnr_db(mse[name]))
                                   - min(PSNR_CAP_DB, psnr_db(mse[next(c for c in case.pair if c != name)])), 3),
            }
        rollouts = record["rollouts"]
        record["correct"] = all(r["matched"] == n for n, r in rollouts.items())
        record["correct_with_straight"] = all(r["matched_with_straight"] == n for n, r in rollouts.items())
        records.setdefault("/".join(case.pair), []).append(record)
    pairs = {key: {
        "num_cases": len(done),
        "accuracy_pct": round(100.0 * np.mean([c["correct"] for c in done]), 2),
        "rollout_accuracy_pct": {n: round(100.0 * np.mean([c["rollouts"][n]["matched"] == n for c in done]), 2)
                                 for n in key.split("/")},
        "accuracy_with_straight_pct": round(100.0 * np.mean([c["correct_with_straight"] for c in done]), 2),
        "mean_margin_db": round(float(np.mean([r["margin_db"] for c in done for r in c["rollouts"].values()])), 3),
        "cases": done,
    } for key, done in records.items()}
    return {"horizons": steps, "pairs": pairs, "generate_s": round(generate_s, 2),
            "s_per_frame": round(generate_s / (len(requests) * horizon), 4)}
