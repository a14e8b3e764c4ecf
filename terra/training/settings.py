"""A training run's settings, checked once before torch is imported: :class:`TrainSpec`."""

from __future__ import annotations

import importlib.util

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from terra.core.device import check_device
from terra.config.checks import (
    Range, check_choice, check_file_size, check_flag, check_settings, required_path, select, shown,
)
from terra.core.errors import TerraInputError
from terra.config.output_dir import OutputDir, claim_output_dir
from terra.config.snapshot import checkpoint_path

# The run folder: what a run writes in output_dir
CHECKPOINT_DIR, EXPORT_DIR, BEST_DIR, ADAPTER_DIR = "checkpoint", "model", "best", "adapter"  # each replaced whole
SAMPLES_DIR, TENSORBOARD_DIR, LOG_FILE = "samples", "tensorboard", "train_log.jsonl"
APP = "terra-train"  # the app whose run folders these are
FINETUNE_MODES = ("full", "lora")
BEST_METRICS = ("val_loss", "val_psnr")  # what best/ keeps the best of: the lowest val_loss, the highest val_psnr
PRECISIONS = ("auto", "bf16", "fp32")
DTYPES = ("bfloat16", "float32")  # export.dtype, train.weights_dtype (and the tokenizer's export_dtype)
ATTENTION = ("sdpa", "eager", "flash_attention_2")
OPTIMIZERS = ("adamw", "adamw8bit")  # float32 moments (torch) | 8-bit block-quantized moments (torchao)

NET_RANGES = {
    "net.hidden_size": Range(8, 16384, 256, whole=True),
    "net.intermediate_size": Range(8, 65536, 768, whole=True),
    "net.num_hidden_layers": Range(1, 256, 6, whole=True),
    "net.num_attention_heads": Range(1, 256, 4, whole=True),
    "net.num_key_value_heads": Range(1, 256, 4, whole=True),
    "net.num_temporal_embeddings": Range(2, 1024, 16, whole=True),
    "net.rms_norm_eps": Range(0, 1, 1e-6, low_open=True),
    "net.rope_theta": Range(1, 1e9, 10000.0),
    "net.num_route_tokens": Range(0, 256, 8, whole=True, nullable=True),  # null: 0 new, init's own (model.py)
}
TRAIN_RANGES = {
    "train.batch_size": Range(1, 65536, 16, whole=True),
    "train.micro_batch_size": Range(1, 65536, 1, whole=True, nullable=True),
    "train.window": Range(2, 1024, 25, whole=True, nullable=True),
    "train.lr": Range(0, 1, 1e-4, low_open=True),
    "train.min_lr_ratio": Range(0, 1, 0.1),
    "train.warmup_steps": Range(0, 10**7, 100, whole=True),
    "train.max_steps": Range(1, 10**8, 1000, whole=True),
    "train.weight_decay": Range(0, 10, 0.1),
    "train.grad_clip": Range(0, 1e6, 1.0, low_open=True),
    "train.seed": Range(0, 2**63 - 1, 0, whole=True),
    "train.max_minutes": Range(0, 10**7, 60, nullable=True),
    "train.log_every": Range(1, 10**8, 25, whole=True),
    "train.eval_every": Range(1, 10**8, 500, whole=True),
    "train.ckpt_every": Range(1, 10**8, 500, whole=True),
    "train.loss_chunk": Range(1, 10**7, 2048, whole=True),
    "train.input_noise": Range(0, 0.5, 0.05),
    "train.no_route_share": Range(0, 1, 0.15),
    "train.recovery_share": Range(0, 1, 0.3),
    "data.val_clips": Range(0, 10**7, 32, whole=True),
    "sample.num_context": Range(1, 1023, 3, whole=True),
    "sample.clips": Range(1, 10**5, 4, whole=True),
}
LORA_RANGES = {
    "lora.rank": Range(1, 4096, 16, whole=True),
    "lora.alpha": Range(0, 1e6, 32, low_open=True),
    "lora.dropout": Range(0, 0.99, 0.0),
}


@dataclass(frozen=True)
class LoraSpec:
    """PEFT LoRA settings (``finetune=lora``)."""

    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]
    train_action_projection: bool
    train_position_embeddings: bool


@dataclass(frozen=True)
class TrainSpec:
    data: str  # a tokenized-clips file (terra-tokenize) or a shard folder (terra-prepare-logs)
    val_clips: int  # held-out clips of a tokenized-clips file (a shard folder has its own split)
    recoveries: str | None  # a tokenized-clips file of recovery clips; None: none
    output: OutputDir  # claimed: apart from data and init, replacing only what the toolkit wrote
    resume: bool
    init: str | None  # checkpoint folder to start from; None: a new model of ``net``
    net: dict[str, Any]  # checked shape of a new model
    finetune: str  # full | lora
    lora: LoraSpec | None
    batch_size: int  # windows per optimizer step, over all processes
    micro_batch_size: int | None  # windows per process per forward; None: batch_size / processes
    window: int | None  # frames per window; None: the model's num_temporal_embeddings
    loss_on_first_frame: bool
    input_noise: float  # most share of a window's input codes replaced by random ones
    no_route_share: float  # a route model's share of windows trained without a route
    recovery_share: float  # with recoveries: the share of windows that are recovery clips'
    loss_chunk: int  # positions whose logits are computed at once
    lr: float
    min_lr_ratio: float
    warmup_steps: int
    max_steps: int
    weight_decay: float
    betas: tuple[float, float]
    grad_clip: float
    seed: int
    max_minutes: float | None
    log_every: int
    eval_every: int
    ckpt_every: int
    device: str
    precision: str  # auto | bf16 | fp32
    optimizer: str  # adamw | adamw8bit
    weights_dtype: str  # the trained weights' dtype: float32 | bfloat16 (needs adamw8bit's stochastic rounding)
    activation_checkpointing: bool | int  # every decoder layer (True), none (False) or the first N
    attn_implementation: str
    compile: bool
    tensorboard: bool
    sample_gif: bool  # validation rollouts at every evaluation: val_psnr, and the first as a GIF
    sample_context: int
    sample_clips: int  # validation clips rolled out
    export_dtype: str
    export_max_shard_size: int  # bytes
    export_adapter: bool  # finetune=lora: also write the unmerged adapter (adapter/)
    export_best: bool  # also keep best/: the export at the best validation score so far
    best_by: str  # that score: val_loss (lowest) | val_psnr (highest; needs sample_gif)
    progress: bool  # the step bar, on a terminal

    @property
    def output_dir(self) -> Path:
        return self.output.path


def train_spec(cfg: DictConfig) -> TrainSpec:
    """Check a training config once and return it as a :class:`TrainSpec` (no torch; no file read)."""
    values = check_settings(cfg, TRAIN_RANGES)
    finetune = check_choice(select(cfg, "finetune"), "finetune", FINETUNE_MODES)
    init = _init_folder(cfg)
    if finetune == "lora" and init is None:
        raise TerraInputError("finetune=lora adapts an existing model; add init=/path/to/checkpoint or "
                              "model=terra_v1 terra_root=/path/to/Terra")
    data = select(cfg, "data.tokens")
    if not isinstance(data, str) or not Path(data).exists():
        raise TerraInputError(f"data.tokens={shown(data)} does not exist; give a tokenized-clips file "
                              "(terra-tokenize) or a shard folder (terra-prepare-logs)")
    recoveries = select(cfg, "data.recoveries")
    if recoveries is not None and (not isinstance(recoveries, str) or not Path(recoveries).is_file()):
        raise TerraInputError(f"data.recoveries={shown(recoveries)} is not a file; give a tokenized-clips file of "
                              "recovery clips (terra-make-dataset recipe=recoveries, then terra-tokenize) or null")
    sample_gif = check_flag(select(cfg, "sample.gif"), "sample.gif")
    output = claim_output_dir(required_path(cfg, "output_dir", "the run folder"), "output_dir", files=[LOG_FILE],
                              folders=[SAMPLES_DIR, TENSORBOARD_DIR],
                              whole=[CHECKPOINT_DIR, EXPORT_DIR, BEST_DIR, ADAPTER_DIR],
                              inputs=[("data.tokens", data), ("data.recoveries", recoveries),
                                      ("init checkpoint", init)], app=APP)
    return TrainSpec(
        data=data, val_clips=values["data.val_clips"], recoveries=recoveries, output=output,
        resume=check_flag(select(cfg, "resume"), "resume"), init=init,
        net=check_settings(cfg, NET_RANGES) | {
            "action_projection_type": check_choice(select(cfg, "net.action_projection_type"),
                                                   "net.action_projection_type", ("linear", "mlp"))},
        finetune=finetune, lora=_lora(cfg) if finetune == "lora" else None,
        batch_size=values["train.batch_size"], micro_batch_size=values["train.micro_batch_size"],
        window=values["train.window"],
        loss_on_first_frame=check_flag(select(cfg, "train.loss_on_first_frame"), "train.loss_on_first_frame"),
        input_noise=values["train.input_noise"], no_route_share=values["train.no_route_share"],
        recovery_share=values["train.recovery_share"],
        loss_chunk=values["train.loss_chunk"], lr=values["train.lr"],
        min_lr_ratio=values["train.min_lr_ratio"],
        warmup_steps=values["train.warmup_steps"], max_steps=values["train.max_steps"],
        weight_decay=values["train.weight_decay"], betas=check_betas(select(cfg, "train.betas"), "train.betas"),
        grad_clip=values["train.grad_clip"],
        seed=values["train.seed"], max_minutes=values["train.max_minutes"], log_every=values["train.log_every"],
        eval_every=values["train.eval_every"], ckpt_every=values["train.ckpt_every"],
        device=check_device(select(cfg, "train.device")),
        precision=check_choice(select(cfg, "train.precision"), "train.precision", PRECISIONS),
        **_memory(cfg),
        attn_implementation=check_choice(select(cfg, "train.attn_implementation"), "train.attn_implementation",
                                         ATTENTION),
        compile=check_flag(select(cfg, "train.compile"), "train.compile"),
        tensorboard=check_flag(select(cfg, "train.tensorboard"), "train.tensorboard"),
        sample_gif=sample_gif,
        sample_context=values["sample.num_context"], sample_clips=values["sample.clips"],
        export_dtype=check_choice(select(cfg, "export.dtype"), "export.dtype", DTYPES),
        export_max_shard_size=check_file_size(select(cfg, "export.max_shard_size"), "export.max_shard_size"),
        export_adapter=check_flag(select(cfg, "export.adapter"), "export.adapter"),
        export_best=check_flag(select(cfg, "export.best"), "export.best"),
        best_by=_best_by(cfg, sample_gif),
        progress=check_flag(select(cfg, "progress"), "progress"),
    )


def check_betas(value: Any, name: str) -> tuple[float, float]:
    """AdamW's ``betas`` setting ``name``: two numbers in [0, 1)."""
    if not (isinstance(value, list) and len(value) == 2):
        raise TerraInputError(f"{name} must be two numbers (got {shown(value)}); e.g. {name}=[0.9,0.95]")
    return tuple(Range(0, 0.999999, 0.9).check(b, name) for b in value)


def _memory(cfg: DictConfig) -> dict[str, Any]:
    optimizer = check_choice(select(cfg, "train.optimizer"), "train.optimizer", OPTIMIZERS)
    if optimizer == "adamw8bit" and importlib.util.find_spec("torchao") is None:
        raise TerraInputError("train.optimizer=adamw8bit needs torchao, which is not installed; "
                              "pip install 'terra-world-model[train8bit]', or set train.optimizer=adamw")
    weights = check_choice(select(cfg, "train.weights_dtype"), "train.weights_dtype", DTYPES)
    if weights == "bfloat16" and optimizer != "adamw8bit":
        raise TerraInputError("train.weights_dtype=bfloat16 needs train.optimizer=adamw8bit (its stochastic "
                              "rounding keeps updates smaller than bf16's step); set both, or weights_dtype=float32")
    checkpointing = select(cfg, "train.activation_checkpointing")
    if not (isinstance(checkpointing, bool) or isinstance(checkpointing, int) and 1 <= checkpointing <= 256):
        raise TerraInputError(f"train.activation_checkpointing must be true, false or a number of decoder layers "
                              f"(got {shown(checkpointing)}); e.g. train.activation_checkpointing=12")
    return {"optimizer": optimizer, "weights_dtype": weights, "activation_checkpointing": checkpointing}


def _best_by(cfg: DictConfig, sample_gif: bool) -> str:
    """``export.best_by``; ``val_psnr`` needs the validation rollouts (``sample.gif``)."""
    metric = check_choice(select(cfg, "export.best_by"), "export.best_by", BEST_METRICS)
    if metric == "val_psnr" and not sample_gif:
        raise TerraInputError("export.best_by=val_psnr scores the validation rollouts, which sample.gif=false turns "
                              "off; set sample.gif=true or export.best_by=val_loss")
    return metric


def _init_folder(cfg: DictConfig) -> str | None:
    init = cfg.get("init")
    if init is not None:
        if not isinstance(init, str) or not Path(init).is_dir():
            raise TerraInputError(f"init={shown(init)} is not a folder; point it at a checkpoint (config.json + "
                                  "safetensors), or use model=terra_v1 terra_root=/path/to/Terra")
        return init
    if cfg.get("model") is None:
        return None
    return checkpoint_path(cfg, "model", "world_model")


def _lora(cfg: DictConfig) -> LoraSpec:
    values = check_settings(cfg, LORA_RANGES)
    targets = select(cfg, "lora.target_modules")
    if not (isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)):
        raise TerraInputError(f"lora.target_modules must be a list of module names (got {shown(targets)}); "
                              "e.g. lora.target_modules=[q_proj,k_proj,v_proj,o_proj]")
    return LoraSpec(
        rank=values["lora.rank"], alpha=values["lora.alpha"], dropout=values["lora.dropout"],
        target_modules=tuple(targets),
        train_action_projection=check_flag(select(cfg, "lora.train_action_projection"),
                                           "lora.train_action_projection"),
        train_position_embeddings=check_flag(select(cfg, "lora.train_position_embeddings"),
                                             "lora.train_position_embeddings"),
    )
