"""The two measurements of ``terra-evaluate``: a world model + tokenizer on clips of the synthetic world."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from terra.config.sampling import SamplingConfig
from terra.evaluation.cases import AdherenceCase, clip_routes
from terra.generation.rollout import RolloutRequest
from terra.metrics import PSNR_CAP_DB, psnr, psnr_db, ssim
from terra.sim import Clip
from terra.tokenizer.images import frames_to_tensor

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
    t0 = time.perf_counter()
    results = _decoded(pipeline.generate(requests, sampling, progress=progress, decode=False), pipeline, say,
                       f"frame quality: decoding the {len(requests)} rollouts and the tokenizer's reconstructions of "
                       "their true frames, then scoring them ...")
    generate_s = time.perf_counter() - t0
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
    return {
        "num_clips": len(clips),
        "horizon": horizon,
        "psnr": _stats(gen_psnr),
        "ssim": _stats(np.array(gen_ssim)),
        "tokenizer_psnr": _stats(np.array(tok_psnr)),
        "tokenizer_ssim": _stats(np.array(tok_ssim)),
        "copy_last_psnr": _stats(copy_psnr),
        "target_frames": steps,  # the PSNR target covers the first min(10, horizon) generated frames
        "mean_psnr_target_frames": round(float(gen_psnr[:, :steps].mean()), 4),
        "by_manoeuvre": by_manoeuvre,
        "clips": per_clip,
        "generate_s": round(generate_s, 2),
        "s_per_frame": round(generate_s / (len(clips) * horizon), 4),
    }


def _decoded(results: list[RolloutResult], pipeline: WorldModelPipeline, say: Callable[[str], None] | None,
             line: str) -> list[RolloutResult]:
    """``results`` of ``generate(..., decode=False)`` given their decoded frames, after ``say(line)``."""
    if say is not None:
        say(line)
    for result in results:
        result.frames = pipeline.frames(result.codes, result.request.seed)[0]
    return results


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
    t0 = time.perf_counter()
    results = iter(_decoded(pipeline.generate(requests, sampling, progress=progress, decode=False), pipeline, say,
                            f"manoeuvre adherence: decoding the {len(requests)} rollouts, then matching them with "
                            "each candidate's true frames ..."))
    generate_s = time.perf_counter() - t0
    idx = [n_ctx + h - 1 for h in steps]
    pairs: dict[str, dict] = {}
    for case in cases:
        key = "/".join(case.pair)
        entry = pairs.setdefault(key, {"cases": []})
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
        entry["cases"].append(record)
    for key, entry in pairs.items():
        cases_ = entry["cases"]
        names = key.split("/")
        entry.update({
            "num_cases": len(cases_),
            "accuracy_pct": round(100.0 * np.mean([c["correct"] for c in cases_]), 2),
            "rollout_accuracy_pct": {n: round(100.0 * np.mean([c["rollouts"][n]["matched"] == n for c in cases_]), 2)
                                     for n in names},
            "accuracy_with_straight_pct": round(100.0 * np.mean([c["correct_with_straight"] for c in cases_]), 2),
            "mean_margin_db": round(float(np.mean([r["margin_db"] for c in cases_
                                                   for r in c["rollouts"].values()])), 3),
        })
        pairs[key] = {k: entry[k] for k in (*[k for k in entry if k != "cases"], "cases")}  # cases last
    return {"horizons": steps, "pairs": pairs, "generate_s": round(generate_s, 2),
            "s_per_frame": round(generate_s / (len(requests) * horizon), 4)}

