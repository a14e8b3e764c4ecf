"""The settings of a scoring run, checked once, before torch is imported."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from terra.config.backend import DTYPES, device_setting, num_threads_setting
from terra.config.checks import Range, required_path, select, shown
from terra.config.files import open_input_file
from terra.config.output_dir import claim_output_dir
from terra.config.schema import check_schema, flag, setting
from terra.core.errors import TerraInputError
from terra.scoring.report import FILES
from terra.config.actbench import MAX_SAMPLES_BYTES
from terra.scoring.samples import sample_files

APP = "terra-score"  # the app whose run folders these are
NEEDED = {"av": "PyAV (video decoding)", "matplotlib": "matplotlib (the confusion matrix)"}


@dataclass
class ScoreConfig:
    """terra-score's settings."""

    videos: Optional[str] = setting(None, "folder of <name>_<sample_id>.mp4 (output.naming=actbench of "
                                          "terra-rollout, or ACT-Bench's published generated_videos/terra/v1, "
                                          ".../v2, generated_videos/vista)")
    samples: Optional[str] = setting(None, "ACT-Bench's act_bench.jsonl (sample_id, label, reference_traj, ...), "
                                           "or a folder of *.jsonl")
    estimator: Optional[str] = setting(None, "folder with config.json and model.safetensors (or pytorch_model.bin "
                                             "/ model.bin / model.pt): a download of the Hub repo "
                                             "turing-motors/ACT-Estimator")
    output_dir: Optional[str] = setting(None, "summary.json, results.jsonl, confusion_matrix.png go here (a rerun "
                                              "replaces them; apart from the inputs)")
    batch_size: int = setting(16, "videos per estimator call", Range(1, 1024, 16, whole=True))
    num_workers: int = setting(8, "DataLoader workers decoding and preprocessing videos (0: in this process); at "
                                  "most the CPUs this process may use", Range(0, 256, 8, whole=True))
    device: str = device_setting()
    dtype: str = setting("auto", "auto: bf16 autocast on a GPU, as ACT-Bench; fp32 on a CPU", choices=DTYPES[:3])
    num_threads: Optional[Union[int, str]] = num_threads_setting()
    progress: Any = flag(True, "a bar over the videos on a terminal (in a log a line a minute) and a line per "
                               "stage")
    dry_run: Any = flag(False, "true: check samples, videos (matched, frames counted) and the estimator folder "
                               "without loading its weights, report what is missing (exit 2 if anything is); "
                               "output_dir not needed")


@dataclass(frozen=True)
class ScoringSettings:
    """What :func:`terra.scoring.run.score` needs, checked."""

    videos: Path
    samples: tuple[Path, ...]
    estimator: Path | None  # a dry run may have none
    output_dir: Path | None  # absolute (None: a dry run)
    batch_size: int = 16
    num_workers: int = 8
    device: str = "auto"
    dtype: str = "auto"
    progress: bool = True
    num_threads: int | None = None  # the app's auto, resolved
    dry_run: bool = False


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
    values = check_schema(cfg, ScoreConfig)
    dry_run = values["dry_run"]
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
    output_dir = None if dry_run else claim_output_dir(  # a dry run writes nothing
        required_path(cfg, "output_dir", "summary.json, results.jsonl, confusion_matrix.png go there"),
        "output_dir", files=FILES, inputs=[("videos folder", videos), ("samples", select(cfg, "samples")),
                                           ("samples file", files), ("estimator folder", estimator)], app=APP).path
    own = ("batch_size", "num_workers", "device", "dtype", "progress", "num_threads")
    return ScoringSettings(videos=videos, samples=files, estimator=estimator, output_dir=output_dir, dry_run=dry_run,
                           **{name: values[name] for name in own})
