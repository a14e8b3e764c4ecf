"""The settings of a scoring run, checked once, before torch is imported."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from terra.config.backend import DTYPES, check_num_threads
from terra.config.checks import Range, check_choice, check_flag, required_path, select, shown
from terra.config.files import open_input_file
from terra.config.output_dir import claim_output_dir
from terra.core.device import check_device
from terra.core.errors import TerraInputError
from terra.scoring.report import FILES
from terra.config.actbench import MAX_SAMPLES_BYTES
from terra.scoring.samples import sample_files

APP = "terra-score"  # the app whose run folders these are
RANGES = {
    "batch_size": Range(1, 1024, 16, whole=True),
    "num_workers": Range(0, 256, 8, whole=True),
}
NEEDED = {"av": "PyAV (video decoding)", "matplotlib": "matplotlib (the confusion matrix)"}


@dataclass(frozen=True)
class ScoringSettings:
    """What :func:`terra.scoring.run.score` needs, checked."""

    videos: Path  # folder of <name>_<sample_id>.mp4
    samples: tuple[Path, ...]  # JSONL files of ACT-Bench samples
    estimator: Path | None  # folder: config.json + weights (a dry run may have none)
    output_dir: Path | None  # absolute; summary.json, results.jsonl, confusion_matrix.png (None: a dry run)
    batch_size: int = 16
    num_workers: int = 8  # DataLoader workers decoding videos (0: in this process; at most the CPUs usable)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 autocast on a GPU, fp32 on a CPU) | float32 | bfloat16
    progress: bool = True
    num_threads: int | None = None  # torch CPU threads (the app's auto, resolved); None: torch's default
    dry_run: bool = False  # check samples, videos and the estimator folder only


def _folder(cfg: Any, name: str, what: str) -> Path:
    path = required_path(cfg, name, what)
    if not path.is_dir():
        raise TerraInputError(f"{name}={shown(str(select(cfg, name)), 80)} is not a folder; pass {name}=DIR ({what})")
    return path


def scoring_settings(cfg: Any) -> ScoringSettings:
    """The checked settings of ``cfg`` (an OmegaConf config or nested mappings); one line for a bad one."""
    missing = [what for module, what in NEEDED.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise TerraInputError(f"scoring needs {' and '.join(missing)}: pip install 'terra-world-model[score]'")
    values = {key: limits.check(select(cfg, key), key) for key, limits in RANGES.items()}
    dry_run = check_flag(select(cfg, "dry_run"), "dry_run")
    videos = _folder(cfg, "videos", "the generated videos, <name>_<sample_id>.mp4")
    estimator_help = "config.json and model.safetensors: hf download turing-motors/ACT-Estimator --local-dir " \
                     "ACT-Estimator"
    if dry_run:  # the dry run reports a missing estimator instead of stopping at it
        estimator = None if select(cfg, "estimator") is None else required_path(cfg, "estimator", estimator_help)
    else:
        estimator = _folder(cfg, "estimator", estimator_help)
    files = sample_files(required_path(cfg, "samples", "ACT-Bench's act_bench.jsonl, or a folder of them", "FILE"))
    for file in files:
        open_input_file(file, "samples file", MAX_SAMPLES_BYTES).close()  # regular, readable, bounded
    output_dir = None
    if not dry_run:  # a dry run writes nothing
        output_dir = claim_output_dir(
            required_path(cfg, "output_dir", "summary.json, results.jsonl, confusion_matrix.png go there"),
            "output_dir", files=FILES, inputs=[("videos folder", videos), ("samples", select(cfg, "samples")),
                                               ("samples file", files), ("estimator folder", estimator)],
            app=APP).path
    return ScoringSettings(
        videos=videos, samples=files, estimator=estimator, output_dir=output_dir, dry_run=dry_run,
        batch_size=values["batch_size"], num_workers=values["num_workers"],
        device=check_device(select(cfg, "device")), dtype=check_choice(select(cfg, "dtype"), "dtype", DTYPES[:3]),
        progress=check_flag(select(cfg, "progress"), "progress"),
        num_threads=check_num_threads(select(cfg, "num_threads")),  # auto, as every app
    )
