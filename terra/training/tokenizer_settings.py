"""The settings of ``terra-train-tokenizer``, checked once before torch is imported: :class:`TokenizerTrainSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from terra.config.checks import (SEED, Range, check_choice, check_flag, check_settings, plain, required_path, select,
                                 shown)
from terra.config.output_dir import OutputDir, claim_output_dir
from terra.core.device import check_device
from terra.core.errors import TerraInputError
from terra.training.settings import DTYPES, check_betas

FAMILIES = ("lfq", "vq")  # model.family
SOURCES = ("synthetic", "folder")  # data.source: render_frames, load_frames
# The run folder: what a run writes in train.output_dir (the checkpoint replaced whole), and in train.export_dir
CHECKPOINT, LOG, SUMMARY = "checkpoint", "train_log.jsonl", "summary.json"
APP = "terra-train-tokenizer"  # the app whose run folders these are
SYNTHETIC_FRAMES = "synthetic_*.npy"  # data.source=synthetic: the rendered frames, cached
EXPORT_FILES = ("config.json", "model.safetensors")

DATA_RANGES = {
    "data.num_frames": Range(1, 10**7, 20000, whole=True),
    "data.workers": Range(1, 1024, 8, whole=True),
    "data.seed": Range(0, 2**32 - 1, 0, whole=True),  # seed * 1_000_003 + step seeds torch's 64-bit generator
    "data.device_cache_gb": Range(0, 10**6, 8.0),
}
TRAIN_RANGES = {
    "train.seed": SEED,
    "train.batch_size": Range(1, 65536, 32, whole=True),
    "train.max_steps": Range(1, 10**8, 20000, whole=True),
    "train.max_minutes": Range(0, 10**7, 9, low_open=True, nullable=True),
    "train.lr": Range(0, 1, 2e-4, low_open=True),
    "train.min_lr_ratio": Range(0, 1, 0.1),
    "train.warmup_steps": Range(0, 10**7, 500, whole=True),
    "train.weight_decay": Range(0, 10, 0.0),
    "train.grad_clip": Range(0, 10**6, 1.0, low_open=True, nullable=True),
    "train.ema_decay": Range(0, 0.999999, 0.999, low_open=True, nullable=True),
    "train.log_every": Range(1, 10**8, 50, whole=True),
    "train.checkpoint_every": Range(1, 10**8, 1000, whole=True),
    "train.eval_frames": Range(1, 4096, 16, whole=True),
}
LOSS_RANGES = {f"loss.{name}": Range(0, 10**6, example) for name, example in
               (("l1", 1.0), ("l2", 0.0), ("gradient", 0.1), ("quantizer", 1.0))}
DISC_RANGES = {
    "disc.start_step": Range(0, 10**8, 5000, whole=True),
    "disc.weight": Range(0, 10**6, 0.1),
    "disc.lr": Range(0, 1, 2e-4, low_open=True),
    "disc.ch": Range(16, 4096, 64, whole=True),
    "disc.layers": Range(1, 8, 3, whole=True),
}


@dataclass(frozen=True)
class TokenizerModelSpec:
    """``model``: which tokenizer family to train, and its config (checked by the family's class when built)."""

    family: str  # lfq | vq
    config: dict[str, Any]  # plain values, interpolations resolved


@dataclass(frozen=True)
class FramesSpec:
    source: str  # synthetic | folder
    path: str | None  # source=folder: a folder, glob or video file; None with source=synthetic
    num_frames: int  # source=synthetic: frames rendered once and cached in the output folder
    workers: int
    seed: int  # the synthetic frames' and the batches'
    hflip: bool
    device_cache_gb: float


@dataclass(frozen=True)
class TrainingRun:
    """``train``: where the run writes, on which device, the optimiser and its schedule, logging and export."""

    output: OutputDir  # claimed: checkpoint/, train_log.jsonl, summary.json, the synthetic frames' cache
    export: OutputDir  # claimed: the trained tokenizer
    export_dir: str  # the setting as given, as summary.json and the last line name it
    export_dtype: str  # bfloat16 | float32
    device: str
    seed: int
    batch_size: int
    max_steps: int
    max_minutes: float | None  # None: no budget
    resume: bool
    lr: float
    min_lr_ratio: float
    warmup_steps: int
    betas: tuple[float, float]
    weight_decay: float
    grad_clip: float | None  # None: no clipping
    ema_decay: float | None  # None: no EMA
    bf16: bool
    compile: bool
    log_every: int
    checkpoint_every: int
    eval_frames: int

    @property
    def output_dir(self) -> Path:
        return self.output.path


@dataclass(frozen=True)
class LossWeights:
    """``loss``: the weights of the reconstruction terms and of the family's quantiser losses."""

    l1: float
    l2: float
    gradient: float
    quantizer: float


@dataclass(frozen=True)
class DiscriminatorSpec:
    """``disc`` when enabled: the PatchGAN discriminator and its hinge loss."""

    start_step: int
    weight: float
    lr: float
    ch: int
    layers: int


@dataclass(frozen=True)
class TokenizerTrainSpec:
    model: TokenizerModelSpec
    data: FramesSpec
    train: TrainingRun
    loss: LossWeights
    disc: DiscriminatorSpec | None  # None: disc.enabled=false
    record: dict[str, Any]  # the settings as given, kept in summary.json (Hydra writes nothing into the run folder)


def tokenizer_train_spec(cfg: DictConfig) -> TokenizerTrainSpec:
    """Check settings once and return them as a :class:`TokenizerTrainSpec` (no torch)."""
    model, data = _model(cfg), _frames(cfg)
    loss = LossWeights(**_checked(cfg, LOSS_RANGES))
    disc = _disc(cfg) if check_flag(select(cfg, "disc.enabled"), "disc.enabled") else None
    return TokenizerTrainSpec(model=model, data=data, train=_run(cfg, data), loss=loss, disc=disc, record=plain(cfg))


def _checked(cfg: DictConfig, ranges: dict[str, Range]) -> dict[str, Any]:
    return {key.partition(".")[2]: value for key, value in check_settings(cfg, ranges).items()}


def _model(cfg: DictConfig) -> TokenizerModelSpec:
    family = check_choice(select(cfg, "model.family"), "model.family", FAMILIES)
    config = select(cfg, "model.config")
    if not isinstance(config, dict):
        raise TerraInputError(f"model.config must be a mapping of the {family} tokenizer's settings (got "
                              f"{shown(config)}); pick one with train_tokenizer/model= (conf/train_tokenizer/model/)")
    return TokenizerModelSpec(family, config)


def _frames(cfg: DictConfig) -> FramesSpec:
    source = check_choice(select(cfg, "data.source"), "data.source", SOURCES)
    path = select(cfg, "data.path") if source == "folder" else None
    if source == "folder" and (path is None or path == ""):
        raise TerraInputError("data.path is required with data.source=folder; pass a folder, glob or video")
    if path is not None and not isinstance(path, str):
        raise TerraInputError(f"data.path must be a folder, glob or video file (got {shown(path)})")
    values = _checked(cfg, DATA_RANGES)
    return FramesSpec(source=source, path=path, hflip=check_flag(select(cfg, "data.hflip"), "data.hflip"), **values)


def _run(cfg: DictConfig, data: FramesSpec) -> TrainingRun:
    values = _checked(cfg, TRAIN_RANGES)
    inputs = [("data.path", data.path)]
    output = claim_output_dir(required_path(cfg, "train.output_dir", "the run folder"), "train.output_dir",
                              files=[LOG, SUMMARY, SYNTHETIC_FRAMES],
                              whole=[CHECKPOINT, f"{CHECKPOINT}.tmp", f"{CHECKPOINT}.old"], inputs=inputs, app=APP)
    export = claim_output_dir(required_path(cfg, "train.export_dir", "the trained tokenizer's folder"),
                              "train.export_dir", files=EXPORT_FILES, inputs=inputs, app=APP)
    return TrainingRun(
        output=output, export=export, export_dir=str(select(cfg, "train.export_dir")),
        export_dtype=check_choice(select(cfg, "train.export_dtype"), "train.export_dtype", DTYPES),
        device=check_device(select(cfg, "train.device")),
        resume=check_flag(select(cfg, "train.resume"), "train.resume"),
        betas=check_betas(select(cfg, "train.betas"), "train.betas"),
        bf16=check_flag(select(cfg, "train.bf16"), "train.bf16"),
        compile=check_flag(select(cfg, "train.compile"), "train.compile"),
        **values,
    )


def _disc(cfg: DictConfig) -> DiscriminatorSpec:
    """``disc.*`` checked; ``disc.ch`` a multiple of 16 (GroupNorm of 32 groups over 2·ch channels)."""
    values = _checked(cfg, DISC_RANGES)
    if values["ch"] % 16:
        raise TerraInputError(f"disc.ch must be a multiple of 16 (got {values['ch']}); e.g. disc.ch=64")
    return DiscriminatorSpec(**values)
