"""A training run's settings, checked once before torch is imported: :class:`TrainSpec`."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig

from terra.config.backend import device_setting
from terra.config.checks import Range, check_file_size, required_path, shown
from terra.config.output_dir import OutputDir, claim_output_dir
from terra.config.schema import block_values, check_schema, flag, group, setting
from terra.config.snapshot import checkpoint_path
from terra.core.errors import TerraInputError

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


def check_betas(value: Any, name: str) -> tuple[float, float]:
    """AdamW's ``betas`` setting ``name``: two numbers in [0, 1)."""
    if not (isinstance(value, list) and len(value) == 2):
        raise TerraInputError(f"{name} must be two numbers (got {shown(value)}); e.g. {name}=[0.9,0.95]")
    return tuple(Range(0, 0.999999, 0.9).check(b, name) for b in value)


def _target_modules(targets: Any) -> tuple[str, ...]:
    if not (isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)):
        raise TerraInputError(f"lora.target_modules must be a list of module names (got {shown(targets)}); "
                              "e.g. lora.target_modules=[q_proj,k_proj,v_proj,o_proj]")
    return tuple(targets)


def _checkpointing(value: Any) -> bool | int:
    if not (isinstance(value, bool) or isinstance(value, int) and 1 <= value <= 256):
        raise TerraInputError(f"train.activation_checkpointing must be true, false or a number of decoder layers "
                              f"(got {shown(value)}); e.g. train.activation_checkpointing=12")
    return value


@dataclass
class LoraBlock:
    rank: int = setting(16, "the adapters' rank", Range(1, 4096, 16, whole=True))
    alpha: float = setting(32.0, "their scale", Range(0, 1e6, 32, low_open=True))
    dropout: float = setting(0.0, "their dropout", Range(0, 0.99, 0.0))
    target_modules: List[str] = setting(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                         "down_proj"], "the linear layers adapted", check=_target_modules)
    train_action_projection: Any = flag(True, "also train the action projection (else frozen)")
    train_position_embeddings: Any = flag(True, "also train the spatio-temporal position tables (else frozen)")


@dataclass
class DataBlock:
    tokens: Optional[str] = setting("data/tokens.safetensors", "a shard folder (terra-prepare-logs: its own "
                                    "train/val split) or a tokenized-clips file (terra-tokenize: codes + actions, "
                                    "and routes when its dataset had them; a route model trains with no route "
                                    "without)")
    val_clips: int = setting(32, "a tokenized-clips file: the last clips are held out (0 = none)",
                             Range(0, 10**7, 32, whole=True))
    recoveries: Optional[str] = setting(None, "a route model: a tokenized-clips file of recovery clips "
                                        "(terra-make-dataset recipe=recoveries num_frames=16, then terra-tokenize): "
                                        "first frames seen from off the car's pose, trained from the first frame "
                                        "back on it, so the model learns to draw the road where its route says; its "
                                        "last val_clips are held out too. null = none")


@dataclass
class NetBlock:
    """World-model shape; the layout keys come from the tokenized data."""

    hidden_size: int = setting(256, "", Range(8, 16384, 256, whole=True))
    intermediate_size: int = setting(768, "", Range(8, 65536, 768, whole=True))
    num_hidden_layers: int = setting(6, "", Range(1, 256, 6, whole=True))
    num_attention_heads: int = setting(4, "head_dim = hidden_size / num_attention_heads; keep it 64 for vLLM's CPU "
                                          "engine", Range(1, 256, 4, whole=True))
    num_key_value_heads: int = setting(4, "", Range(1, 256, 4, whole=True))
    num_temporal_embeddings: int = setting(16, "frames per window", Range(2, 1024, 16, whole=True))
    action_projection_type: str = setting("linear", "linear (v1, LlamaActionForCausalLM) | mlp (v2, "
                                                    "LlamaActionV2ForCausalLM)", choices=("linear", "mlp"))
    num_route_tokens: Optional[int] = setting(
        None, "route slots a frame (K points of the road ahead): null = none for a new network, the checkpoint's "
              "own with init= / model=; K > 0 with a checkpoint that has none grows K slots into it (docs/train.md, "
              "\"Routes\")", Range(0, 256, 8, whole=True, nullable=True))
    rms_norm_eps: float = setting(1.0e-6, "", Range(0, 1, 1e-6, low_open=True))
    rope_theta: float = setting(10000.0, "", Range(1, 1e9, 10000.0))


@dataclass
class TrainBlock:
    batch_size: int = setting(16, "windows per optimizer step, over all processes", Range(1, 65536, 16, whole=True))
    micro_batch_size: Optional[int] = setting(None, "windows per process per forward (gradients accumulate); null "
                                                    "= batch_size / processes",
                                              Range(1, 65536, 1, whole=True, nullable=True))
    window: Optional[int] = setting(None, "frames per training window; null = the model's num_temporal_embeddings "
                                          "(capped by clip length)", Range(2, 1024, 25, whole=True, nullable=True))
    loss_on_first_frame: Any = flag(False, "the first frame of a window is context; true also trains "
                                           "unconditional image tokens")
    input_noise: float = setting(0.0, "up to this share of a window's input codes replaced by random codes "
                                      "(targets kept): robustness to the model's own errors over long rollouts",
                                 Range(0, 0.5, 0.05))
    no_route_share: float = setting(0.15, "a route model (net.num_route_tokens > 0): this share of windows trains "
                                          "with no route in any slot (the learned \"no route\" embedding), so one "
                                          "checkpoint runs with and without", Range(0, 1, 0.15))
    recovery_share: float = setting(0.3, "with data.recoveries: this share of windows are recovery clips' (always "
                                         "with their route)", Range(0, 1, 0.3))
    lr: float = setting(1.0e-3, "peak learning rate", Range(0, 1, 1e-4, low_open=True))
    min_lr_ratio: float = setting(0.1, "cosine decays to lr * min_lr_ratio at max_steps", Range(0, 1, 0.1))
    warmup_steps: int = setting(200, "linear warm-up", Range(0, 10**7, 100, whole=True))
    max_steps: int = setting(6000, "steps in all", Range(1, 10**8, 1000, whole=True))
    weight_decay: float = setting(0.1, "AdamW's", Range(0, 10, 0.1))
    betas: List[float] = setting([0.9, 0.95], "AdamW's, two numbers in [0, 1)",
                                 check=lambda value: check_betas(value, "train.betas"))
    grad_clip: float = setting(1.0, "gradient-norm clip", Range(0, 1e6, 1.0, low_open=True))
    seed: int = setting(0, "the run's", Range(0, 2**63 - 1, 0, whole=True))
    max_minutes: Optional[float] = setting(None, "wall-clock budget of one invocation: checkpoint and stop when "
                                                 "spent (rerun resumes)", Range(0, 10**7, 60, nullable=True))
    log_every: int = setting(25, "steps between log rows", Range(1, 10**8, 25, whole=True))
    eval_every: int = setting(500, "steps between validations", Range(1, 10**8, 500, whole=True))
    ckpt_every: int = setting(500, "steps between checkpoints", Range(1, 10**8, 500, whole=True))
    compile: Any = flag(False, "torch.compile each decoder layer and the loss's softmax (Terra's shape, H100: "
                               "0.45 vs 0.67 s a step)")
    device: str = device_setting()
    precision: str = setting("auto", "auto: bf16 autocast on CUDA, fp32 on CPU", choices=PRECISIONS)
    activation_checkpointing: Any = setting(False, "recompute each decoder layer in the backward pass (Terra's "
                                                   "shape: 34 vs 65 GiB, ~10 % slower); a number N: only the first N "
                                                   "layers", check=_checkpointing)
    optimizer: str = setting("adamw", "adamw: float32 moments, fused on GPUs; adamw8bit: torchao's 8-bit moments, 2 "
                                      "instead of 8 bytes a trained weight (pip install "
                                      "'terra-world-model[train8bit]')", choices=OPTIMIZERS)
    weights_dtype: str = setting("float32", "the trained weights; bfloat16 halves the memory of weights and "
                                            "gradients and needs adamw8bit, whose stochastic rounding keeps the "
                                            "small updates. Frozen weights (LoRA's base model) are kept in the "
                                            "compute dtype: bf16 on GPUs", choices=DTYPES)
    attn_implementation: str = setting("sdpa", "sdpa: FlashAttention kernels on GPUs; flash_attention_2: the "
                                               "flash-attn package", choices=ATTENTION)
    loss_chunk: int = setting(2048, "positions whose logits exist at once (a window's whole logits never do)",
                              Range(1, 10**7, 2048, whole=True))
    tensorboard: Any = flag(True, "also log to output_dir/tensorboard")


@dataclass
class SampleBlock:
    gif: Any = flag(True, "at every evaluation, greedy rollouts of validation clips: their PSNR (val_psnr), and "
                          "output_dir/samples/stepNNNNNNN.gif: the first clip | its rollout")
    num_context: int = setting(3, "context frames of those rollouts", Range(1, 1023, 3, whole=True))
    clips: int = setting(4, "validation clips rolled out", Range(1, 10**5, 4, whole=True))


@dataclass
class ExportBlock:
    dtype: str = setting("bfloat16", "the export's weights", choices=DTYPES)
    max_shard_size: Any = setting("15MB", "weight files of the export stay below this (a larger single tensor gets "
                                          "its own)", check=lambda value: check_file_size(value,
                                                                                          "export.max_shard_size"))
    adapter: Any = flag(True, "finetune=lora: also write the unmerged PEFT adapter to output_dir/adapter")
    best: Any = flag(True, "also keep output_dir/best: the export (as model/) at the best validation score so "
                           "far, step 0 (the starting weights) included; best/best.json names its step")
    best_by: str = setting("val_loss", "val_loss (lowest) | val_psnr (highest PSNR of the validation rollouts, "
                                       "sample.gif: teacher-forced loss and rollout quality part ways once a small "
                                       "set is overfit)", choices=BEST_METRICS)


@dataclass
class TrainConfig:
    """terra-train's settings."""

    tokenizer: Dict[str, Any] = group()
    sampling: Dict[str, Any] = group()
    model: Dict[str, Any] = group()
    terra_root: Optional[str] = setting(None, "a download of turing-motors/Terra, for model=terra_v1|terra_v2")
    init: Optional[str] = setting(None, "a checkpoint folder to start from (config.json + safetensors); null: "
                                        "model=..., else a new net")
    finetune: str = setting("full", "full: every weight, FSDP2 on several processes; lora: PEFT adapters, DDP",
                            choices=FINETUNE_MODES)
    lora: LoraBlock = setting(LoraBlock(), "")
    data: DataBlock = setting(DataBlock(), "")
    net: NetBlock = setting(NetBlock(), "")
    train: TrainBlock = setting(TrainBlock(), "")
    sample: SampleBlock = setting(SampleBlock(), "")
    output_dir: Optional[str] = setting("runs/world_model", "checkpoint/, model/ (final export), best/, adapter/ "
                                                            "(LoRA), train_log.jsonl, tensorboard/, samples/")
    resume: Any = flag(True, "continue from output_dir/checkpoint when it exists")
    progress: Any = flag(True, "a bar over the steps (N/max_steps, ETA) on stderr, when it is a terminal; the "
                               "log rows and the start and end of each validation are printed either way")
    export: ExportBlock = setting(ExportBlock(), "")


@dataclass(kw_only=True)
class TrainSpec(TrainBlock):
    """A checked training run: ``train.*`` as its own fields, the other blocks' settings beside them."""

    data: str  # a tokenized-clips file (terra-tokenize) or a shard folder (terra-prepare-logs)
    val_clips: int  # held-out clips of a tokenized-clips file (a shard folder has its own split)
    recoveries: str | None  # a tokenized-clips file of recovery clips; None: none
    output: OutputDir  # claimed: apart from data and init, replacing only what the toolkit wrote
    resume: bool
    init: str | None  # checkpoint folder to start from; None: a new model of ``net``
    net: NetBlock  # the shape of a new model
    finetune: str  # full | lora
    lora: LoraBlock | None
    sample: SampleBlock  # validation rollouts at every evaluation: val_psnr, and the first as a GIF
    export: ExportBlock  # its max_shard_size in bytes; best_by val_psnr only with sample.gif
    progress: bool  # the step bar, on a terminal

    @property
    def output_dir(self) -> Path:
        return self.output.path


def train_spec(cfg: DictConfig) -> TrainSpec:
    """Check a training config once and return it as a :class:`TrainSpec` (no torch; no file read)."""
    values = check_schema(cfg, TrainConfig)
    finetune = values["finetune"]
    init = _init_folder(cfg)
    if finetune == "lora" and init is None:
        raise TerraInputError("finetune=lora adapts an existing model; add init=/path/to/checkpoint or "
                              "model=terra_v1 terra_root=/path/to/Terra")
    data = values["data.tokens"]
    if not isinstance(data, str) or not Path(data).exists():
        raise TerraInputError(f"data.tokens={shown(data)} does not exist; give a tokenized-clips file "
                              "(terra-tokenize) or a shard folder (terra-prepare-logs)")
    recoveries = values["data.recoveries"]
    if recoveries is not None and not Path(recoveries).is_file():
        raise TerraInputError(f"data.recoveries={shown(recoveries)} is not a file; give a tokenized-clips file of "
                              "recovery clips (terra-make-dataset recipe=recoveries, then terra-tokenize) or null")
    output = claim_output_dir(required_path(cfg, "output_dir", "the run folder"), "output_dir", files=[LOG_FILE],
                              folders=[SAMPLES_DIR, TENSORBOARD_DIR],
                              whole=[CHECKPOINT_DIR, EXPORT_DIR, BEST_DIR, ADAPTER_DIR],
                              inputs=[("data.tokens", data), ("data.recoveries", recoveries),
                                      ("init checkpoint", init)], app=APP)
    train = block_values(values, "train")
    _check_memory(train["optimizer"], train["weights_dtype"])
    sample, export = SampleBlock(**block_values(values, "sample")), ExportBlock(**block_values(values, "export"))
    if export.best_by == "val_psnr" and not sample.gif:
        raise TerraInputError("export.best_by=val_psnr scores the validation rollouts, which sample.gif=false turns "
                              "off; set sample.gif=true or export.best_by=val_loss")
    lora = LoraBlock(**block_values(values, "lora")) if finetune == "lora" else None
    return TrainSpec(data=data, val_clips=values["data.val_clips"], recoveries=recoveries, output=output,
                     resume=values["resume"], init=init, net=NetBlock(**block_values(values, "net")), finetune=finetune,
                     lora=lora, **train, sample=sample, export=export, progress=values["progress"])


def _check_memory(optimizer: str, weights: str) -> None:
    if optimizer == "adamw8bit" and importlib.util.find_spec("torchao") is None:
        raise TerraInputError("train.optimizer=adamw8bit needs torchao, which is not installed; "
                              "pip install 'terra-world-model[train8bit]', or set train.optimizer=adamw")
    if weights == "bfloat16" and optimizer != "adamw8bit":
        raise TerraInputError("train.weights_dtype=bfloat16 needs train.optimizer=adamw8bit (its stochastic "
                              "rounding keeps updates smaller than bf16's step); set both, or weights_dtype=float32")


def _init_folder(cfg: DictConfig) -> str | None:
    init = cfg.get("init")
    if init is not None:
        if not isinstance(init, str) or not Path(init).is_dir():
            raise TerraInputError(f"init={shown(init)} is not a folder; point it at a checkpoint (config.json + "
                                  "safetensors), or use model=terra_v1 terra_root=/path/to/Terra")
        return init
    return checkpoint_path(cfg, "model", "world_model") if cfg.get("model") else None  # None: no model= picked
