"""The settings of ``terra-train-tokenizer``, checked once before torch is imported: :class:`TokenizerTrainSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig

from terra.config.backend import device_setting
from terra.config.checks import SEED, Range, plain, required_path
from terra.config.output_dir import OutputDir, claim_output_dir
from terra.config.schema import block_values, check_schema, flag, setting
from terra.core.errors import TerraInputError
from terra.training.settings import DTYPES, check_betas

FAMILIES = ("lfq", "vq")  # model.family
SOURCES = ("synthetic", "folder")  # data.source: render_frames, load_frames
# The run folder: what a run writes in train.output_dir (the checkpoint replaced whole), and in train.export_dir
CHECKPOINT, LOG, SUMMARY = "checkpoint", "train_log.jsonl", "summary.json"
APP = "terra-train-tokenizer"  # the app whose run folders these are
SYNTHETIC_FRAMES = "synthetic_*.npy"  # data.source=synthetic: the rendered frames, cached
EXPORT_FILES = ("config.json", "model.safetensors")


@dataclass
class ModelBlock:
    family: str = setting("lfq", "the tokenizer family (train_tokenizer/model= picks one with its config)",
                          choices=FAMILIES)
    config: Dict[str, Any] = setting({}, "the family's network settings (conf/train_tokenizer/model/)")


@dataclass
class DataBlock:
    source: str = setting("synthetic", "synthetic: terra.sim's frames; folder: images, folders, globs, videos",
                          choices=SOURCES)
    path: Optional[str] = setting(None, "source=folder: a folder, glob or video file")
    num_frames: int = setting(20000, "source=synthetic: frames rendered once and cached in the output folder",
                              Range(1, 10**7, 20000, whole=True))
    workers: int = setting(8, "processes rendering synthetic frames", Range(1, 1024, 8, whole=True))
    # seed * 1_000_003 + step seeds torch's 64-bit generator
    seed: int = setting(0, "the synthetic frames' and the batches'", Range(0, 2**32 - 1, 0, whole=True))
    hflip: Any = flag(True, "random horizontal flips")
    device_cache_gb: float = setting(8.0, "keep the uint8 frames on the GPU when they fit in this many GiB",
                                     Range(0, 10**6, 8.0))


@dataclass
class TrainBlock:
    output_dir: Optional[str] = setting("outputs/tokenizer", "checkpoint/, train_log.jsonl, summary.json")
    export_dir: Optional[str] = setting("${train.output_dir}/final", "the trained tokenizer (EMA weights when "
                                                                     "ema_decay is set)")
    export_dtype: str = setting("float32", "bfloat16 halves the file; it loads back as float32", choices=DTYPES)
    device: str = device_setting()
    seed: int = setting(0, "the run's", SEED)
    batch_size: int = setting(32, "frames per step", Range(1, 65536, 32, whole=True))
    max_steps: int = setting(20000, "steps in all", Range(1, 10**8, 20000, whole=True))
    max_minutes: Optional[float] = setting(None, "wall-clock budget of this invocation (null: none); the next one "
                                                 "resumes", Range(0, 10**7, 9, low_open=True, nullable=True))
    resume: Any = flag(True, "continue from the checkpoint in output_dir")
    lr: float = setting(2.0e-4, "peak learning rate", Range(0, 1, 2e-4, low_open=True))
    min_lr_ratio: float = setting(0.1, "the cosine schedule's floor, as a share of lr", Range(0, 1, 0.1))
    warmup_steps: int = setting(500, "linear warm-up", Range(0, 10**7, 500, whole=True))
    betas: List[float] = setting([0.5, 0.9], "AdamW's, two numbers in [0, 1)",
                                 check=lambda value: check_betas(value, "train.betas"))
    weight_decay: float = setting(0.0, "AdamW's", Range(0, 10, 0.0))
    grad_clip: Optional[float] = setting(1.0, "gradient-norm clip (null: none)",
                                         Range(0, 10**6, 1.0, low_open=True, nullable=True))
    ema_decay: Optional[float] = setting(0.999, "null: no EMA", Range(0, 0.999999, 0.999, low_open=True,
                                                                      nullable=True))
    bf16: Any = flag(True, "autocast on CUDA only")
    compile: Any = flag(False, "torch.compile the tokenizer (pays off only for long runs)")
    log_every: int = setting(50, "steps between log lines", Range(1, 10**8, 50, whole=True))
    checkpoint_every: int = setting(1000, "steps between checkpoints", Range(1, 10**8, 1000, whole=True))
    eval_frames: int = setting(16, "fixed frames whose reconstruction L1/PSNR is logged at start and end",
                               Range(1, 4096, 16, whole=True))


@dataclass
class LossBlock:
    l1: float = setting(1.0, "weight of the L1 reconstruction loss", Range(0, 10**6, 1.0))
    l2: float = setting(0.0, "weight of the L2 reconstruction loss", Range(0, 10**6, 0.0))
    gradient: float = setting(0.1, "L1 of image gradients (a download-free sharpness term; no LPIPS)",
                              Range(0, 10**6, 0.1))
    quantizer: float = setting(1.0, "weight of the family's codebook/commitment/entropy losses", Range(0, 10**6, 1.0))


@dataclass
class DiscBlock:
    enabled: Any = flag(False, "a PatchGAN discriminator with a hinge loss")
    start_step: int = setting(5000, "the step it starts at", Range(0, 10**8, 5000, whole=True))
    weight: float = setting(0.1, "its loss's weight", Range(0, 10**6, 0.1))
    lr: float = setting(2.0e-4, "its learning rate", Range(0, 1, 2e-4, low_open=True))
    ch: int = setting(64, "a multiple of 16", Range(16, 4096, 64, whole=True))
    layers: int = setting(3, "stride-2 layers, so frames of at least 3·2^layers pixels a side",
                          Range(1, 8, 3, whole=True))


@dataclass
class TrainTokenizerConfig:
    """terra-train-tokenizer's settings."""

    model: ModelBlock = setting(ModelBlock(), "")
    data: DataBlock = setting(DataBlock(), "")
    train: TrainBlock = setting(TrainBlock(), "")
    loss: LossBlock = setting(LossBlock(), "")
    disc: DiscBlock = setting(DiscBlock(), "")


@dataclass
class TrainingRun(TrainBlock):
    """``train`` checked, with its run folder and export folder claimed."""

    output: Optional[OutputDir] = None  # checkpoint/, train_log.jsonl, summary.json, the synthetic frames' cache
    export: Optional[OutputDir] = None  # the trained tokenizer


@dataclass(frozen=True)
class TokenizerTrainSpec:
    model: ModelBlock
    data: DataBlock
    train: TrainingRun
    loss: LossBlock
    disc: DiscBlock | None  # None: disc.enabled=false
    record: dict[str, Any]  # the settings as given, kept in summary.json (Hydra writes nothing into the run folder)


def tokenizer_train_spec(cfg: DictConfig) -> TokenizerTrainSpec:
    """Check settings once and return them as a :class:`TokenizerTrainSpec` (no torch)."""
    values = check_schema(cfg, TrainTokenizerConfig)
    folder = values["data.source"] == "folder"
    if folder and not values["data.path"]:
        raise TerraInputError("data.path is required with data.source=folder; pass a folder, glob or video")
    if values["disc.enabled"] and values["disc.ch"] % 16:  # GroupNorm of 32 groups over 2·ch channels
        raise TerraInputError(f"disc.ch must be a multiple of 16 (got {values['disc.ch']}); e.g. disc.ch=64")
    data = DataBlock(**{**block_values(values, "data"), "path": values["data.path"] if folder else None})
    return TokenizerTrainSpec(model=ModelBlock(**block_values(values, "model")), data=data,
                              train=_run(cfg, block_values(values, "train"), data),
                              loss=LossBlock(**block_values(values, "loss")),
                              disc=DiscBlock(**block_values(values, "disc")) if values["disc.enabled"] else None,
                              record=plain(cfg))


def _run(cfg: DictConfig, values: dict[str, Any], data: DataBlock) -> TrainingRun:
    inputs = [("data.path", data.path)]
    output = claim_output_dir(required_path(cfg, "train.output_dir", "the run folder"), "train.output_dir",
                              files=[LOG, SUMMARY, SYNTHETIC_FRAMES],
                              whole=[CHECKPOINT, f"{CHECKPOINT}.tmp", f"{CHECKPOINT}.old"], inputs=inputs, app=APP)
    export = claim_output_dir(required_path(cfg, "train.export_dir", "the trained tokenizer's folder"),
                              "train.export_dir", files=EXPORT_FILES, inputs=inputs, app=APP)
    return TrainingRun(output=output, export=export, **{**values, "export_dir": str(values["export_dir"])})
