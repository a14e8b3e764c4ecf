"""One scoring run: samples and videos matched, the estimator loaded, every video estimated, the metrics and the
report written (:func:`score`)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from terra.core.atomic import json_text
from terra.core.device import resolve_device, set_threads, usable_cores
from terra.core.progress import Progress, announce
from terra.core.errors import TerraInputError
from terra.scoring.estimator import VideoActionEstimator
from terra.scoring.labels import LABELS
from terra.scoring.metrics import Metrics, compute_metrics, displacement_errors
from terra.scoring.report import result_line, text_summary, write_report
from terra.scoring.samples import BenchSample, read_bench_samples
from terra.scoring.settings import ScoringSettings
from terra.scoring.videos import VideoClips, collate, find_videos, match_videos

FRAME_INTERVAL_S = 0.1  # ACT-Bench's videos are at 10 Hz: timestamps 0 .. 4.3 s for 44 frames


@dataclass(frozen=True)
class ScoreResult:
    """A finished run: its metrics, the files written, the screen summary and where the time went."""

    metrics: Metrics
    paths: list[Path]
    text: str
    timings: dict[str, float]  # load_s, estimate_s (decode included), total_s


def timestamps(num_frames: int) -> torch.Tensor:
    """The estimator's timestamps ``[num_frames, 1]``."""
    return torch.linspace(0, (num_frames - 1) * FRAME_INTERVAL_S, num_frames).view(num_frames, 1)


def estimate(estimator: VideoActionEstimator, paths: list[Path], settings: ScoringSettings,
             device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Estimated class ids ``[N]`` and waypoints ``[N, T, 2]`` (float32) of the videos ``paths``."""
    config = estimator.config
    num_frames = config.input_shape[1]
    clips = VideoClips(paths, num_frames, tuple(config.input_shape[2:]))
    workers = min(settings.num_workers, usable_cores(), len(paths))  # no more than CPUs or videos
    loader = DataLoader(clips, batch_size=settings.batch_size, num_workers=workers, collate_fn=collate,
                        pin_memory=device.type == "cuda")
    times = timestamps(num_frames).to(device)
    bf16 = settings.dtype == "bfloat16" or (settings.dtype == "auto" and device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    classes, waypoints = np.zeros(len(paths), np.int64), np.zeros((len(paths), num_frames, 2), np.float32)
    progress = Progress(len(paths), "videos scored", "video", enabled=settings.progress)
    with torch.inference_mode(), progress:
        for indices, frames, errors in loader:
            if errors:
                raise TerraInputError(errors[0])
            frames = frames.to(device, non_blocking=True).float().div_(255)
            batch_times = times.expand(len(indices), -1, -1) if config.timestamp_dim else None
            with autocast:
                out = estimator(frames, batch_times)
            classes[indices] = torch.softmax(out.command.float().cpu(), dim=1).numpy().argmax(axis=1)  # as ACT-Bench
            waypoints[indices] = out.waypoints.float().cpu().numpy()
            progress.update(len(indices))
    return classes, waypoints


def results_lines(samples: list[BenchSample], paths: list[Path], classes: np.ndarray, waypoints: np.ndarray,
                  ade: np.ndarray, fde: np.ndarray):
    """``results.jsonl``'s lines, one per sample."""
    for i, sample in enumerate(samples):
        label = LABELS[classes[i]]
        yield result_line({
            **sample.passed_on, "sample_id": str(sample.sample_id), "cond_label": json_text(sample.cond_label),
            "cond_class": str(sample.cond_class), "reference_traj_transformed": json_text(sample.reference.tolist()),
            "video_path": json_text(str(paths[i].resolve())), "estimated_class": str(int(classes[i])),
            "estimated_label": json_text(label), "estimated_traj": json_text(waypoints[i].tolist()),
            "ade": json_text(float(ade[i])), "fde": json_text(float(fde[i])),
        })


def score(settings: ScoringSettings) -> ScoreResult:
    """Score the videos of ``settings`` and write the report."""
    start = time.perf_counter()
    def say(line: str) -> None:  # the stages' lines: above the bar on a terminal, on stdout in a log
        announce(f"terra-score: {line}", settings.progress)

    set_threads(settings.num_threads)
    device = torch.device(resolve_device(settings.device))
    say(f"loading the estimator from {settings.estimator} ...")
    estimator = VideoActionEstimator.from_pretrained(settings.estimator)
    if estimator.config.num_classes != len(LABELS):
        raise TerraInputError(f"the estimator in {settings.estimator} has {estimator.config.num_classes} classes; "
                              f"ACT-Bench's scoring needs {len(LABELS)} ({', '.join(LABELS)})")
    samples, left_out = read_bench_samples(settings.samples, estimator.config.input_shape[1])
    videos = find_videos(settings.videos)
    paths = match_videos(samples, videos, settings.videos)
    estimator.to(device)
    loaded = time.perf_counter()
    say(f"estimator loaded in {loaded - start:.1f} s; scoring {len(paths)} videos on {device} "
        f"({settings.num_workers} decoding workers)")
    classes, waypoints = estimate(estimator, paths, settings, device)
    estimated = time.perf_counter()
    ade, fde = displacement_errors(waypoints, np.stack([s.reference for s in samples]))
    metrics = compute_metrics([s.cond_label for s in samples], [LABELS[c] for c in classes], ade, fde)
    written = write_report(settings.output_dir, metrics, results_lines(samples, paths, classes, waypoints, ade, fde))
    total = time.perf_counter() - start
    timings = {"load_s": loaded - start, "estimate_s": estimated - loaded, "total_s": total}
    text = text_summary(metrics, left_out, len(videos) - len(samples), written, total)
    return ScoreResult(metrics, written, text, timings)
