"""``terra-evaluate``'s run: the pipeline, the two measurements on the held-out data, the targets, ``report.json``
(written atomically) and the table printed at the end."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from terra.config.checks import select
from terra.config.snapshot import checkpoint_path
from terra.core.atomic import json_text
from terra.evaluation.cases import (
    DIRECTION_PAIR,
    REPORT,
    adherence_cases,
    check_config,
    held_out_seeds,
    quality_clips,
    training_scene_seeds,
)

PROG = "terra-evaluate"  # its stage lines start with the console script's name

def run(cfg: DictConfig, pipeline=None) -> dict:
    """Evaluate as configured, write ``<out_dir>/report.json`` atomically and return the report.

    ``pipeline`` (a :class:`terra.pipeline.WorldModelPipeline`) is built from ``cfg`` when not given; a
    pipeline built here is closed at the end.
    """
    t_start = time.perf_counter()
    sampling = check_config(cfg)
    # every setting is fine: now the heavy modules
    from terra.config.spec import check_window
    from terra.core.atomic import mark, write_text
    from terra.core.device import set_threads
    from terra.evaluation.measure import evaluate_adherence, evaluate_quality
    from terra.models.checkpoint import read_world_model_config
    from terra.pipeline import WorldModelPipeline

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
    return lambda line: tqdm.write(f"{PROG}: {line}", file=sys.stderr) if shown else None


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
