"""``terra-evaluate``'s run: the pipeline, the two measurements on the held-out data, the targets, ``report.json``
(written atomically) and the table printed at the end; the pipeline is built as every app builds it (terra/pipeline.py,
``resolve_run`` + ``WorldModelPipeline.from_run``)."""

from __future__ import annotations

import dataclasses
import time

from terra.config.spec import check_window
from terra.core.atomic import json_text, write_text
from terra.core.device import set_threads
from terra.core.progress import announce
from terra.evaluation.cases import (
    DIRECTION_PAIR,
    adherence_cases,
    held_out_seeds,
    quality_clips,
    training_scene_seeds,
)
from terra.evaluation.measure import evaluate_adherence, evaluate_quality
from terra.evaluation.settings import REPORT, EvaluateSpec, Targets
from terra.pipeline import WorldModelPipeline, resolve_run

PROG = "terra-evaluate"  # its stage lines start with the console script's name


def run(spec: EvaluateSpec, pipeline: WorldModelPipeline | None = None) -> dict:
    """Evaluate as ``spec`` says (terra/evaluation/settings.py, ``evaluate_spec``), write
    ``<out_dir>/report.json`` atomically and return the report.

    ``pipeline`` is built from ``spec.run`` when not given; a pipeline built here is closed at the end.
    """
    t_start = time.perf_counter()
    n_ctx = spec.run.num_context
    exclude = training_scene_seeds(spec.exclude_training.seed, spec.exclude_training.num_clips)
    own = pipeline is None
    if own:  # threads, device, backend, a vLLM engine's decoding, the window: once (terra/pipeline.py)
        resolved = resolve_run(spec.run, spec.rollouts_in_flight)
        sampling = resolved.spec.sampling
        pipeline = WorldModelPipeline.from_run(resolved)
    else:
        set_threads(spec.run.num_threads)
        check_window(pipeline.backend.layout.max_frames, n_ctx)
        sampling = spec.run.sampling
    load_s = time.perf_counter() - t_start
    image_size = tuple(pipeline.image_size)
    report: dict = {
        "world_model": spec.run.world_model,
        "tokenizer": spec.run.tokenizer,
        "backend": type(pipeline.backend).__name__,
        "device": str(pipeline.device),
        "sampling": dataclasses.asdict(spec.run.sampling),  # as given: the keys of conf/sampling/
        "num_context": n_ctx,
        "horizon": spec.horizon,
        "image_size": list(image_size),
        "domain": spec.domain,
        "routes": pipeline.backend.layout.route_tokens > 0,  # a route model is told each clip's road (its scene)
    }
    say = _stage_lines(spec.progress)
    say(f"{report['backend']} on {report['device']} loaded in {load_s:.1f} s")
    try:
        if spec.quality.num_clips > 0:
            seeds = held_out_seeds(spec.quality.scene_seed, spec.quality.num_clips, exclude)
            say(f"frame quality: rendering {len(seeds)} held-out clips, then their rollouts ...")
            clips = quality_clips(spec, seeds, image_size)
            report["quality"] = evaluate_quality(pipeline, clips, n_ctx, sampling, spec.seed, spec.progress)
            report["quality"]["scene_seeds"] = [seeds[0], seeds[-1]]
        if spec.adherence.num_cases > 0:
            seeds = held_out_seeds(spec.adherence.scene_seed, spec.adherence.num_cases, exclude)
            say(f"manoeuvre adherence: rendering {len(seeds)} cases, then their rollouts ...")
            cases = adherence_cases(spec, seeds, image_size)
            report["adherence"] = evaluate_adherence(pipeline, cases, n_ctx, list(spec.adherence.horizons),
                                                     sampling, spec.seed, spec.progress)
            report["adherence"]["scene_seeds"] = [seeds[0], seeds[-1]]
    finally:
        if own:
            pipeline.close()
    report["targets"] = _targets(spec.targets, report)
    report["timings"] = {"load_s": round(load_s, 2), "total_s": round(time.perf_counter() - t_start, 2)}
    spec.output.record()  # the folder created, report.json listed in its marker (terra/config/output_dir.py)
    out = spec.output.path / REPORT
    write_text(out, json_text(report, indent=1) + "\n")
    report["path"] = str(out)
    return report


def _stage_lines(progress: bool):
    """A function printing a stage's line above the generation bars on a terminal, on stdout in a log
    (terra/core/progress.py, ``announce``)."""
    return lambda line: announce(f"{PROG}: {line}", progress)


def _targets(goals: Targets, report: dict) -> dict:
    """Each target's value, goal and verdict (a measurement left out has no target line)."""
    targets = {}
    quality = report.get("quality")
    if quality is not None:
        value, target = quality["mean_psnr_target_frames"], goals.mean_psnr_db
        targets["mean_psnr_db"] = {"value": value, "target": target, "frames": quality["target_frames"],
                                   "passed": bool(value >= target)}
    pair = report.get("adherence", {}).get("pairs", {}).get(DIRECTION_PAIR)
    if pair is not None:
        target = goals.direction_accuracy_pct
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
