"""Train Terra's world model (``LlamaActionForCausalLM``) on tokenized clips, resumably and on a time budget.

    python scripts/train_world_model.py data.tokens=data/tokens.safetensors output_dir=runs/wm train.max_minutes=9

Each step samples random windows of ``train.window`` frames from the clips and runs the model training-style
(``input_ids`` = image tokens ``[B, W*P]``, ``actions`` = ``[B, W*6, 3]``). The loss is next-token cross-entropy
on image-token targets only: the logit at position i predicts token i+1; targets that are action slots are
skipped, and so is the first frame of the window (context) unless ``train.loss_on_first_frame``.

The log's ``tokens_per_s`` counts every position of the interleaved sequence (image tokens and action slots).

``output_dir`` receives ``checkpoint/`` (full-precision weights, optimizer, scheduler, step, sampler state;
rewritten atomically every ``train.ckpt_every`` steps, when the budget ``train.max_minutes`` is spent and on
SIGTERM), ``train_log.jsonl`` (loss, image-token accuracy, learning rate, throughput, validation loss) and,
at ``train.max_steps``, ``model/``: the ``save_pretrained`` export in ``export.dtype`` with every weight file
below ``export.max_shard_size``. Running the same command again resumes from the checkpoint.
"""

from __future__ import annotations

import copy
import json
import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError
from omegaconf import DictConfig, OmegaConf
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from terra.apps.runner import CONFIG_PATH, run_app
from terra.config.checks import TerraInputError
from terra.generation.actions import NUM_ACTION_TOKENS
from terra.generation.backends import resolve_device
from terra.models import LlamaActionConfig, LlamaActionForCausalLM
from terra.sim.tokens import TokenizedClips, load_tokens
from tokenizer.atomic import atomic_dir, write_text

CHECKPOINT_DIR = "checkpoint"
EXPORT_DIR = "model"
LOG_FILE = "train_log.jsonl"
STATE_FILE = "trainer_state.pt"
EXPORT_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def build_config(net: DictConfig, clips: TokenizedClips) -> LlamaActionConfig:
    """World-model config: the shape from ``net``, the token layout from the tokenized data."""
    h, w = clips.grid_shape
    patches = h * w
    frames = int(net.num_temporal_embeddings)
    mlp = net.action_projection_type == "mlp"
    try:
        return LlamaActionConfig(
            vocab_size=clips.codebook_size + 1,
            codebook_size=clips.codebook_size,
            action_token_id=clips.codebook_size,
            hidden_size=int(net.hidden_size),
            intermediate_size=int(net.intermediate_size),
            num_hidden_layers=int(net.num_hidden_layers),
            num_attention_heads=int(net.num_attention_heads),
            num_key_value_heads=int(net.num_key_value_heads),
            rms_norm_eps=float(net.rms_norm_eps),
            rope_theta=float(net.rope_theta),
            num_image_patches=patches,
            num_action_tokens=NUM_ACTION_TOKENS,
            num_spatio_embeddings=patches + NUM_ACTION_TOKENS,
            num_temporal_embeddings=frames,
            max_position_embeddings=frames * (patches + NUM_ACTION_TOKENS),
            action_projection_type=str(net.action_projection_type),
            tie_word_embeddings=False,
            architectures=["LlamaActionV2ForCausalLM" if mlp else "LlamaActionForCausalLM"],
        )
    except (ValueError, TypeError, StrictDataclassError) as err:
        cause = err.__cause__ or err  # the strict-dataclass wrapper keeps the readable message as its cause
        raise TerraInputError(f"net: invalid world-model shape ({cause}); fix the net.* settings") from None


def target_positions(patches: int, frames: int, loss_on_first_frame: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions whose logits are trained, and where their targets sit in the flat image tokens ``[W*P]``.

    The interleaved window has ``frames * (patches + 6)`` positions; the logit at ``i`` predicts token
    ``i + 1``, which counts only when it is an image token (of a frame after the first, unless asked).
    """
    span = patches + NUM_ACTION_TOKENS
    nxt = torch.arange(1, frames * span)
    frame, slot = nxt // span, nxt % span
    keep = (slot < patches) & ((frame > 0) | loss_on_first_frame)
    return nxt[keep] - 1, (frame * patches + slot)[keep]


class WindowSampler:
    """Random windows of ``window`` consecutive frames from random clips; its generator state is checkpointed."""

    def __init__(self, codes: torch.Tensor, actions: torch.Tensor, window: int, seed: int) -> None:
        self.codes, self.actions, self.window = codes, actions, window
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Image tokens ``[B, W*P]`` (int64) and actions ``[B, W*6, 3]`` on the data's device."""
        num_clips, clip_frames = self.codes.shape[:2]
        clip = torch.randint(num_clips, (batch_size,), generator=self.generator)
        start = torch.randint(clip_frames - self.window + 1, (batch_size,), generator=self.generator)
        return windows(self.codes, self.actions, clip, start, self.window)


def windows(codes: torch.Tensor, actions: torch.Tensor, clip: torch.Tensor, start: torch.Tensor,
            window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather windows ``[start, start + window)`` of the given clips, flattened for the training-style forward."""
    frames = (start[:, None] + torch.arange(window)[None, :]).to(codes.device)
    clip = clip.to(codes.device)[:, None]
    ids = codes[clip, frames].flatten(1).long()  # [B, W*P]
    acts = actions[clip, frames].flatten(1, 2)  # [B, W*6, 3]
    return ids, acts


@dataclass(frozen=True)
class Objective:
    """Next-token cross-entropy on image-token targets (see :func:`target_positions`), with bf16 autocast or not."""

    keep: torch.Tensor  # positions whose logits are trained
    target_idx: torch.Tensor  # where their targets sit in the flat image tokens
    codebook_size: int
    autocast_dtype: torch.dtype | None

    def __call__(self, model: torch.nn.Module, ids: torch.Tensor, acts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss and image-token accuracy (greedy over the codebook) of one batch of windows."""
        enabled = self.autocast_dtype is not None
        with torch.autocast(ids.device.type, dtype=self.autocast_dtype, enabled=enabled):
            logits = model(input_ids=ids, actions=acts, logits_to_keep=self.keep).logits
        logits = logits.float()
        targets = ids[:, self.target_idx]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        with torch.no_grad():
            acc = (logits[..., : self.codebook_size].argmax(-1) == targets).float().mean()
        return loss, acc

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, codes: torch.Tensor, actions: torch.Tensor, window: int,
                 batch_size: int) -> tuple[float, float]:
        """Mean loss and accuracy over the first window of every clip in ``codes`` (held-out clips)."""
        model.eval()
        total_loss = total_acc = 0.0
        for lo in range(0, len(codes), batch_size):
            clip = torch.arange(lo, min(lo + batch_size, len(codes)))
            loss, acc = self(model, *windows(codes, actions, clip, torch.zeros_like(clip), window))
            total_loss += float(loss) * len(clip)
            total_acc += float(acc) * len(clip)
        model.train()
        return total_loss / len(codes), total_acc / len(codes)


def autocast_for(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA when ``auto``; fp32 (no autocast) on CPU or when asked."""
    if precision not in ("auto", "bf16", "fp32"):
        raise TerraInputError(f"train.precision must be auto, bf16 or fp32 (got {precision!r})")
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def make_optimizer(model: torch.nn.Module, cfg: DictConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms and biases)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": float(cfg.weight_decay)}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=float(cfg.lr), betas=tuple(cfg.betas), fused=device.type == "cuda")


def _truncate_log(path: Path, step: int) -> None:
    """Drop log rows written after the checkpoint a run resumes from (a killed run may have logged further)."""
    if not path.is_file():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in rows if json.loads(line)["step"] <= step]
    if len(kept) < len(rows):
        write_text(path, "".join(line + "\n" for line in kept))


@dataclass
class TrainingState:
    """What a checkpoint holds: weights (``save_pretrained`` format), optimizer, scheduler, sampler and step."""

    model: LlamaActionForCausalLM
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: WindowSampler
    step: int = 0

    def save(self, folder: Path, cfg: DictConfig) -> None:
        """Write the checkpoint atomically (a new folder swapped in), so a kill never leaves half of one."""
        with atomic_dir(folder) as tmp:
            self.model.save_pretrained(tmp, max_shard_size="10GB")
            torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                        "sampler": self.sampler.generator.get_state(), "step": self.step,
                        "config": OmegaConf.to_container(cfg, resolve=True)}, tmp / STATE_FILE)

    def restore(self, folder: Path) -> None:
        """Load a checkpoint written by :meth:`save` into this state."""
        loaded = LlamaActionForCausalLM.from_pretrained(folder, dtype=torch.float32)
        try:
            self.model.load_state_dict(loaded.state_dict())
        except RuntimeError:
            raise TerraInputError(
                f"the checkpoint in {folder} has another network shape or token layout than net.* and the data; "
                "pick a new output_dir or set resume=false"
            ) from None
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.generator.set_state(state["sampler"])
        self.step = int(state["step"])


def split_clips(clips: TokenizedClips, val_clips: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes ``[N, T, P]`` and actions on ``device``, split into (train codes, train actions, val codes, val actions)."""
    num_clips, clip_frames = clips.codes.shape[:2]
    if not 0 <= val_clips < num_clips:
        raise TerraInputError(f"data.val_clips must be in [0, {num_clips - 1}] for {num_clips} clips (got {val_clips})")
    codes = torch.from_numpy(clips.codes.reshape(num_clips, clip_frames, -1).astype(np.int32)).to(device)
    actions = torch.from_numpy(clips.actions).to(device)
    cut = num_clips - val_clips
    return codes[:cut], actions[:cut], codes[cut:], actions[cut:]


def train(cfg: DictConfig) -> dict[str, Any]:
    """Run (or resume) training as configured; return a summary of where it stopped."""
    tcfg = cfg.train
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(resolve_device(str(tcfg.device)))
    autocast_dtype = autocast_for(str(tcfg.precision), device)
    dtype = EXPORT_DTYPES.get(str(cfg.export.dtype))
    if dtype is None:
        raise TerraInputError(f"export.dtype must be bfloat16 or float32 (got {cfg.export.dtype!r})")
    torch.set_float32_matmul_precision("high")  # TF32 for what runs outside autocast on GPUs; no-op on CPU
    torch.manual_seed(int(tcfg.seed))

    clips = load_tokens(cfg.data.tokens)
    config = build_config(cfg.net, clips)
    num_clips, clip_frames = clips.codes.shape[:2]
    window = int(tcfg.window or config.num_temporal_embeddings)
    window = min(window, clip_frames)
    if not 2 <= window <= config.num_temporal_embeddings:
        raise TerraInputError(
            f"train.window {window} must be in [2, net.num_temporal_embeddings={config.num_temporal_embeddings}] "
            f"and clips have {clip_frames} frames; use clips of at least 2 frames"
        )
    val_clips = int(cfg.data.val_clips)
    train_codes, train_actions, val_codes, val_actions = split_clips(clips, val_clips, device)
    patches, span = config.num_image_patches, config.num_spatio_embeddings
    keep, target_idx = target_positions(patches, window, bool(tcfg.loss_on_first_frame))
    objective = Objective(keep.to(device), target_idx.to(device), config.codebook_size, autocast_dtype)

    model = LlamaActionForCausalLM(config).to(device)
    optimizer = make_optimizer(model, tcfg, device)
    max_steps = int(tcfg.max_steps)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, int(tcfg.warmup_steps), max_steps, min_lr_rate=float(tcfg.min_lr_ratio)
    )
    sampler = WindowSampler(train_codes, train_actions, window, int(tcfg.seed))
    state = TrainingState(model, optimizer, scheduler, sampler)
    ckpt = out / CHECKPOINT_DIR
    if bool(cfg.resume) and (ckpt / STATE_FILE).is_file():
        state.restore(ckpt)
        _truncate_log(out / LOG_FILE, state.step)
        print(f"resumed from {ckpt} at step {state.step}")
    model.train()
    if bool(tcfg.compile):
        model.model.compile()

    stop = {"signal": False}
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stop.update(signal=True))
    params = sum(p.numel() for p in model.parameters())
    print(f"world model: {params / 1e6:.2f} M parameters, {len(train_codes)} training clips, window {window} "
          f"frames x {patches + NUM_ACTION_TOKENS} positions, {len(keep)} targets per window, device {device}")
    log = (out / LOG_FILE).open("a")
    start_time = time.perf_counter()
    budget_s = math.inf if tcfg.max_minutes is None else float(tcfg.max_minutes) * 60.0
    batch_size = int(tcfg.batch_size)
    sum_loss = sum_acc = 0.0
    interval_steps, interval_start = 0, time.perf_counter()
    last: dict[str, Any] = {}
    reason = "max_steps"
    try:
        while state.step < max_steps:
            ids, acts = sampler.sample(batch_size)
            loss, acc = objective(model, ids, acts)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(tcfg.grad_clip))
            optimizer.step()
            scheduler.step()
            state.step += 1
            step = state.step
            sum_loss = sum_loss + loss.detach()  # summed on the device: no sync per step
            sum_acc = sum_acc + acc
            interval_steps += 1
            stopping = stop["signal"] or time.perf_counter() - start_time >= budget_s
            do_eval = val_clips > 0 and (step % int(tcfg.eval_every) == 0 or step == max_steps)
            if step % int(tcfg.log_every) == 0 or step == max_steps or do_eval or stopping:
                elapsed = time.perf_counter() - interval_start
                last = {"step": step, "loss": float(sum_loss) / interval_steps, "acc": float(sum_acc) / interval_steps,
                        "lr": scheduler.get_last_lr()[0], "grad_norm": float(grad_norm),
                        "tokens_per_s": interval_steps * batch_size * ids.shape[1] * span / patches / elapsed,
                        "time_s": time.perf_counter() - start_time}
                if do_eval:
                    last["val_loss"], last["val_acc"] = objective.evaluate(
                        model, val_codes, val_actions, window, batch_size)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in last.items()),
                      flush=True)
                log.write(json.dumps(last) + "\n")
                log.flush()
                sum_loss = sum_acc = 0.0
                interval_steps, interval_start = 0, time.perf_counter()
            if stopping:
                reason = "SIGTERM" if stop["signal"] else "max_minutes"
                break
            if step % int(tcfg.ckpt_every) == 0 and step < max_steps:
                state.save(ckpt, cfg)
        state.save(ckpt, cfg)
    finally:
        log.close()
        signal.signal(signal.SIGTERM, previous_handler)
    step = state.step
    summary = {"step": step, "max_steps": max_steps, "stopped": reason}
    summary.update({k: v for k, v in last.items() if k != "step"})
    if step >= max_steps:
        export = out / EXPORT_DIR
        exported = copy.deepcopy(model).to(dtype)
        shard = str(cfg.export.max_shard_size)
        with atomic_dir(export) as folder:
            exported.save_pretrained(folder, max_shard_size=shard)
        summary["export"] = str(export)
        print(f"training finished at step {step}; exported {export}")
    else:
        print(f"stopped at step {step}/{max_steps} ({reason}); run the same command again to resume")
    return summary


@hydra.main(config_path=CONFIG_PATH, config_name="train_world_model", version_base=None)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: train, printing bad settings as one line (exit code 2)."""
    try:
        train(cfg)
    except TerraInputError as err:
        print(f"train_world_model: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run_app(main, "train_world_model", "python scripts/train_world_model.py")
