"""A scoring run checked without the estimator's weights (``dry_run=true``): the samples file read, every video
matched, opened and its frames counted, the estimator folder looked at, and one report of what is missing."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from terra.config.actbench import video_name
from terra.core.errors import TerraInputError
from terra.core.progress import shows_bars
from terra.scoring.estimator import EstimatorConfig, weights_file
from terra.scoring.samples import read_bench_samples
from terra.scoring.settings import ScoringSettings
from terra.scoring.videos import count_frames, find_videos

DOWNLOAD = "hf download turing-motors/ACT-Estimator --local-dir ACT-Estimator"
NO_WEIGHTS = ("without the estimator's weights, terra-evaluate measures a world model against the "
              "synthetic world's ground truth (PSNR, SSIM, manoeuvre adherence)")


@dataclass
class DryRun:
    """What a dry run found: a line per input, and the problems that would stop the score."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return not self.problems

    def text(self) -> str:
        head = ("terra-score dry run: ready to score" if self.ready else
                f"terra-score dry run: not ready, {len(self.problems)} problem(s): " + "; ".join(self.problems))
        return "\n".join([head, *self.lines])


def dry_run(settings: ScoringSettings) -> DryRun:
    """Check ``settings``' samples, videos and estimator folder without loading weights or decoding frames."""
    report = DryRun()
    config = _estimator(settings.estimator, report)
    num_frames = config.input_shape[1]
    samples, left_out = read_bench_samples(settings.samples, num_frames)
    classes = len({s.cond_label for s in samples})
    report.lines.append(f"samples: {len(samples)} of {classes} classes in {', '.join(map(str, settings.samples))} "
                        f"({left_out} rows of other classes left out: they need no video)")
    videos = find_videos(settings.videos)
    missing = [s.sample_id for s in samples if s.sample_id not in videos]
    short, unreadable = [], []
    present = [videos[s.sample_id] for s in samples if s.sample_id in videos]
    for path in tqdm(present, unit="video", desc="counting frames", disable=not shows_bars(settings.progress)):
        try:
            frames = count_frames(path)
        except TerraInputError as err:
            unreadable.append(str(err))
            continue
        if frames < num_frames:
            short.append(f"{path.name} ({frames} frames)")
    report.lines.append(f"videos: {len(present)} of {len(samples)} samples' videos in {settings.videos}, "
                        f"{len(present) - len(short) - len(unreadable)} with at least {num_frames} frames; "
                        f"{len(videos) - len(present)} videos of no scored sample")
    if missing:
        first = ", ".join(map(str, missing[:5]))
        report.problems.append(f"{len(missing)} samples have no video (first: sample {first}; expected e.g. "
                               f"{video_name(missing[0])})")
    if short:
        report.problems.append(f"{len(short)} videos are shorter than the {num_frames} frames the estimator scores "
                               f"(first: {', '.join(short[:3])})")
    if unreadable:
        report.problems.append(f"{len(unreadable)} videos cannot be read (first: {unreadable[0]})")
    if not report.ready:
        report.lines.append(NO_WEIGHTS)
    return report


def _estimator(folder: Path | None, report: DryRun) -> EstimatorConfig:
    """The estimator's config (the published one when there is none to read)."""
    if folder is None or not folder.is_dir():
        where = "not given" if folder is None else f"{folder} is not a folder"
        report.problems.append(f"no estimator ({where}): {DOWNLOAD}")
        report.lines.append("estimator: none; the published ACT-Estimator's 44 frames are checked")
        return EstimatorConfig()
    config_file = folder / "config.json"
    config = EstimatorConfig.from_json(config_file) if config_file.is_file() else EstimatorConfig()
    try:
        weights = weights_file(folder)
    except TerraInputError as err:
        report.problems.append(str(err))
        report.lines.append(f"estimator: {folder} has no weights; {config.input_shape[1]} frames per video")
        return config
    report.lines.append(f"estimator: {folder} has {weights.name} (not loaded); {config.input_shape[1]} frames per "
                        "video")
    return config
