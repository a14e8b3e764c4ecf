"""``terra-evaluate``'s run: the phases, the targets, ``report.json`` (written atomically) and the printed table."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable

from terra.config.sampling import SamplingConfig
from terra.contract.layout import check_window
from terra.core.atomic import json_text, write_text
from terra.core.device import set_threads
from terra.core.progress import announce, duration
from terra.evaluation.measure import (DIRECTION_PAIR, adherence_cases, evaluate_adherence, evaluate_quality,
                                      held_out_seeds, quality_clips, training_scene_seeds)
from terra.evaluation.phases import Phase, keep, plan_phases
from terra.evaluation.settings import PHASE_TITLES, REPORT, EvaluateSpec, TargetsBlock
from terra.generation.backends import backend_kind
from terra.pipeline import WorldModelPipeline
from terra.run import resolve_run

PROG = "terra-evaluate"  # its stage lines start with the console script's name


def run(spec: EvaluateSpec, pipeline: WorldModelPipeline | None = None, resume_command: str | None = None) -> dict:
    """Evaluate as ``spec`` says, keeping each phase's results in ``out_dir`` and reusing those with the same inputs."""
    t_start = time.perf_counter()
    phases: list[Phase] = []  # planned, then each marked done as it is kept: what an interrupted run tells
    with spec.output.hold(REPORT):
        try:
            report, load_s = _evaluate(spec, pipeline, phases)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM as the app runner's Interrupted
            _tell(_interrupted_line(spec, phases, resume_command))
            raise
        report["targets"] = _targets(spec.targets, report)
        report["reused"] = [phase.key for phase in phases if phase.kept is not None]  # from an earlier run's files
        report["timings"] = {"load_s": round(load_s, 2), "total_s": round(time.perf_counter() - t_start, 2)}
        out = spec.output.path / REPORT
        write_text(out, json_text(report, indent=1) + "\n")
    report["path"] = str(out)
    return report


def _evaluate(spec: EvaluateSpec, pipeline: WorldModelPipeline | None, phases: list[Phase]) -> tuple[dict, float]:
    """Plan the phases into ``phases``, build the pipeline if needed, and measure them."""
    t_start = time.perf_counter()
    own = pipeline is None
    if own:  # threads, device, backend, a vLLM engine's decoding, the window: once
        resolved = resolve_run(spec.run, spec.rollouts_in_flight)
        engine = {"backend": resolved.spec.backend, "device": resolved.spec.device}
        sampling = resolved.spec.sampling
    else:
        set_threads(spec.run.num_threads)
        check_window(pipeline.backend.layout.max_frames, spec.run.num_context)
        engine = {"backend": backend_kind(pipeline.backend), "device": str(pipeline.device)}
        sampling = spec.run.sampling
    phases.extend(plan_phases(spec, engine))
    for phase in phases:  # a kept phase whose fields this version cannot read is measured again
        if phase.kept is not None and (why := _unreadable(spec, phase)) is not None:
            phase.kept, phase.why = None, why
    for number, phase in enumerate(phases, 1):
        if phase.why is not None:
            _tell(f"{phase.title}: measuring it again: {phase.why}")
        elif phase.kept is not None:
            _tell(f"phase {number} of {len(phases)}, {phase.title}: kept from an earlier run into this folder "
                  f"({phase.file}), not measured again")

    def say(line: str) -> None:  # above the generation bars on a terminal, on stdout in a log
        announce(f"{PROG}: {line}", spec.progress)

    load_s = 0.0
    try:
        if own and any(phase.kept is None for phase in phases):
            pipeline = WorldModelPipeline.from_run(resolved)
            load_s = time.perf_counter() - t_start
            say(f"{type(pipeline.backend).__name__} on {pipeline.device} loaded in {load_s:.1f} s")
        return _measured(spec, phases, pipeline, sampling, say), load_s
    finally:
        if own and pipeline is not None:
            pipeline.close()


def _measured(spec: EvaluateSpec, phases: list[Phase], pipeline: WorldModelPipeline | None,
              sampling: SamplingConfig, say: Callable[[str], None]) -> dict:
    """The report's header and every phase's results."""
    if pipeline is not None:
        made_by = {"backend": type(pipeline.backend).__name__, "device": str(pipeline.device),
                   "image_size": list(pipeline.image_size),
                   "routes": pipeline.backend.layout.route_model}  # a route model is told each clip's road
    else:  # every phase kept: the pipeline they were measured with (the same engine and checkpoints: their inputs)
        made_by = phases[0].kept["pipeline"]
    report = _header(spec, made_by)
    exclude = training_scene_seeds(spec.exclude_training.seed, spec.exclude_training.num_clips)
    for number, phase in enumerate(phases, 1):
        if phase.kept is not None:
            report[phase.key] = phase.kept["result"]
            continue
        started = time.perf_counter()
        result = MEASURES[phase.key](spec, pipeline, sampling, exclude, say, f"phase {number} of {len(phases)}")
        report[phase.key] = keep(spec.output.path, phase, made_by, result, time.perf_counter() - started)
        phase.done = True
        say(f"{phase.title}: done in {duration(time.perf_counter() - started)}, kept in "
            f"{spec.output.path / phase.file}")
    return report


def _header(spec: EvaluateSpec, made_by: dict) -> dict:
    """The report's header: the run's checkpoints and settings, and ``made_by``, the pipeline the phases ran on."""
    return {"world_model": spec.run.world_model, "tokenizer": spec.run.tokenizer, "backend": made_by["backend"],
            "device": made_by["device"], "sampling": dataclasses.asdict(spec.run.sampling),  # as conf/sampling/ has it
            "num_context": spec.run.num_context, "horizon": spec.horizon, "image_size": made_by["image_size"],
            "domain": spec.domain, "routes": made_by["routes"]}


def _unreadable(spec: EvaluateSpec, phase: Phase) -> str | None:
    """Why a kept phase's record lacks what the report reads of it (None: the report reads it whole)."""
    try:
        report = {**_header(spec, phase.kept["pipeline"]), phase.key: phase.kept["result"], "reused": [],
                  "timings": {"total_s": 0.0}, "path": ""}
        report["targets"] = _targets(spec.targets, report)
        format_table(report)
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as err:
        return f"{phase.file} lacks what this version reads of it ({type(err).__name__}: {str(err)[:80]})"
    return None


def _quality(spec: EvaluateSpec, pipeline: WorldModelPipeline, sampling: SamplingConfig, exclude: set[int],
             say: Callable[[str], None], where: str) -> dict:
    """The frame-quality phase: its held-out clips rendered, rolled out and scored."""
    seeds = held_out_seeds(spec.quality.scene_seed, spec.quality.num_clips, exclude)
    say(f"{where}, frame quality: rendering {len(seeds)} held-out clips, then their rollouts ...")
    clips = quality_clips(spec, seeds, tuple(pipeline.image_size))
    result = evaluate_quality(pipeline, clips, spec.run.num_context, sampling, spec.seed, spec.progress, say)
    return {**result, "scene_seeds": [seeds[0], seeds[-1]]}


def _adherence(spec: EvaluateSpec, pipeline: WorldModelPipeline, sampling: SamplingConfig, exclude: set[int],
               say: Callable[[str], None], where: str) -> dict:
    """The manoeuvre-adherence phase: its cases rendered, rolled out under both commands and matched."""
    seeds = held_out_seeds(spec.adherence.scene_seed, spec.adherence.num_cases, exclude)
    say(f"{where}, manoeuvre adherence: rendering {len(seeds)} cases, then their rollouts ...")
    cases = adherence_cases(spec, seeds, tuple(pipeline.image_size))
    result = evaluate_adherence(pipeline, cases, spec.run.num_context, list(spec.adherence.horizons), sampling,
                                spec.seed, spec.progress, say)
    return {**result, "scene_seeds": [seeds[0], seeds[-1]]}


MEASURES = {"quality": _quality, "adherence": _adherence}  # a phase's key → how it is measured


def _interrupted_line(spec: EvaluateSpec, phases: list[Phase], resume_command: str | None) -> str:
    """What an interrupted run kept and how to resume it, in one line."""
    kept = [phase for phase in phases if phase.kept is not None or phase.done]
    left = [phase for phase in phases if phase not in kept]
    folder = spec.output.path
    what = (f"kept {' and '.join(f'{p.title} ({p.file})' for p in kept)} in {folder}" if kept
            else "nothing kept (no phase had finished)")
    how = f"resume with: {resume_command}" if resume_command else f"a run with the same settings into {folder} resumes"
    return f"interrupted{f' during {left[0].title}' if left else ''}; {what}; {how}"


def _tell(line: str) -> None:
    """A line on stderr, above any bar: what the run decided (a phase kept or measured again), or kept."""
    from tqdm.auto import tqdm

    tqdm.write(f"{PROG}: {line}", file=sys.stderr)


def _targets(goals: TargetsBlock, report: dict) -> dict:
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
    kept = "".join(f"; {PHASE_TITLES[key]} kept from an earlier run" for key in report["reused"])
    lines.append(f"report: {report['path']} ({report['timings']['total_s']:.0f} s{kept})")
    return "\n".join(lines)
