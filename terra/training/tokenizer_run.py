"""Train an image tokenizer (LFQ or VQ-16) on a folder of images or on the synthetic world."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from terra.core.atomic import atomic_path, json_text, mark, write_text
from terra.core.device import resolve_device
from terra.core.errors import TerraInputError
from terra.metrics import psnr_db
from terra.sim import render_frames
from terra.tokenizer import ImageTokenizer, LFQTokenizer, VQTokenizer
from terra.tokenizer.base import TrainOutput, WEIGHTS_NAME
from terra.tokenizer.images import load_frames
from terra.training.checkpoint import discard, newest_checkpoint, swap_in
from terra.training.tokenizer_settings import CHECKPOINT, LOG, SUMMARY, DataBlock, DiscBlock, TokenizerTrainSpec


class PatchDiscriminator(nn.Module):
    """PatchGAN discriminator (pix2pix / VQGAN): one real/fake logit per receptive-field patch."""

    def __init__(self, in_channels: int = 3, ch: int = 64, num_layers: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_channels, ch, 4, stride=2, padding=1), nn.LeakyReLU(0.2)]
        mult = 1
        for n in range(1, num_layers + 1):
            prev, mult = mult, min(2**n, 8)
            layers += [
                nn.Conv2d(ch * prev, ch * mult, 4, stride=2 if n < num_layers else 1, padding=1, bias=False),
                nn.GroupNorm(min(32, ch * mult), ch * mult),
                nn.LeakyReLU(0.2),
            ]
        layers.append(nn.Conv2d(ch * mult, 1, 4, stride=1, padding=1))
        self.main = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


def patch_grid_side(side: int, num_layers: int) -> int:
    """Logits per side of a :class:`PatchDiscriminator` of ``num_layers`` on ``side`` pixels."""
    return side // 2**num_layers - 2


def gradient_l1(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """L1 between horizontal and vertical finite differences: a download-free sharpness term."""
    return sum((torch.diff(x, dim=dim) - torch.diff(y, dim=dim)).abs().mean() for dim in (-1, -2))


def psnr(reconstruction: torch.Tensor, target: torch.Tensor) -> float:
    """PSNR in dB of images in [-1, 1]."""
    mse = ((reconstruction.detach().float().clamp(-1, 1) - target.float()) / 2).pow(2).mean().item()
    return psnr_db(max(mse, 1e-10), peak=1.0)


def lr_factor(step: int, warmup_steps: int, max_steps: int, min_ratio: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to ``min_ratio`` of the peak at ``max_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def sample_batch(frames: torch.Tensor, batch_size: int, step: int, seed: int, hflip: bool) -> torch.Tensor:
    """Batch for ``step`` from uint8 frames ``[N, H, W, 3]`` → float ``[B, 3, H, W]`` in [-1, 1] on their device."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    index = torch.randint(len(frames), (batch_size,), generator=generator)
    batch = frames[index.to(frames.device)].permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
    if hflip:
        flip = (torch.rand(batch_size, generator=generator) < 0.5).to(frames.device)
        batch = torch.where(flip[:, None, None, None], batch.flip(-1), batch)
    return batch


def perplexity(counts: torch.Tensor) -> float:
    """exp(entropy) of a code histogram: the effective number of codes in use."""
    p = counts[counts > 0].float() / counts.sum()
    return math.exp(-(p * p.log()).sum().item())


TOKENIZERS: dict[str, type[ImageTokenizer]] = {"lfq": LFQTokenizer, "vq": VQTokenizer}  # by model.family
STATE = "training_state.pt"  # in a checkpoint, written last


def training_frames(data: DataBlock, image_size: tuple[int, int], output_dir: Path) -> np.ndarray:
    """All training frames, uint8 ``[N, H, W, 3]`` at the tokenizer's size."""
    if data.source == "folder":
        return load_frames(data.path, image_size)
    height, width = image_size
    cache = output_dir / f"synthetic_{data.num_frames}x{height}x{width}_seed{data.seed}.npy"
    if cache.is_file():
        return np.load(cache)
    start = time.monotonic()
    mark(output_dir, [cache.name])
    frames = render_frames(data.num_frames, image_size, data.seed, data.workers)
    with atomic_path(cache) as tmp:
        np.save(tmp, frames)
    print(f"rendered {len(frames)} synthetic frames in {time.monotonic() - start:.1f} s (cached in {cache})",
          flush=True)
    return frames


@torch.no_grad()
def evaluate(model: ImageTokenizer, images: torch.Tensor) -> dict[str, float]:
    """Reconstruction L1 and PSNR of fixed frames through encode → decode (eval mode)."""
    was_training = model.training
    model.eval()
    recon = model.decode(model.encode(images)).float()
    model.train(was_training)
    return {"l1": (recon - images).abs().mean().item(), "psnr": psnr(recon, images)}


@dataclass
class Trainees:
    model: ImageTokenizer
    optimizer: torch.optim.Optimizer
    ema: torch.optim.swa_utils.AveragedModel | None
    disc: PatchDiscriminator | None
    disc_optimizer: torch.optim.Optimizer | None

    @classmethod
    def build(cls, spec: TokenizerTrainSpec, device: torch.device, memory_format: torch.memory_format) -> "Trainees":
        """The tokenizer, its optimiser and EMA, and the discriminator when ``disc.enabled``, all on ``device``."""
        run = spec.train
        model = TOKENIZERS[spec.model.family].from_config(spec.model.config, "model.config", "fix the model.config "
                                                          "settings (conf/train_tokenizer/model/)")
        model = model.to(device=device, memory_format=memory_format).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr, betas=run.betas, weight_decay=run.weight_decay)
        ema = None if run.ema_decay is None else AveragedModel(
            model, multi_avg_fn=get_ema_multi_avg_fn(run.ema_decay), use_buffers=True)
        disc = disc_optimizer = None
        if spec.disc is not None:
            _check_disc_depth(spec.disc, model.image_size)
            disc = PatchDiscriminator(ch=spec.disc.ch, num_layers=spec.disc.layers)
            disc = disc.to(device=device, memory_format=memory_format)
            disc_optimizer = torch.optim.AdamW(disc.parameters(), lr=spec.disc.lr, betas=run.betas)
        return cls(model, optimizer, ema, disc, disc_optimizer)

    def save(self, output_dir: Path, state: dict[str, Any]) -> None:
        """Write ``checkpoint/`` as a whole: build ``checkpoint.tmp/`` then swap it in."""
        tmp, final, old = (output_dir / name for name in (f"{CHECKPOINT}.tmp", CHECKPOINT, f"{CHECKPOINT}.old"))
        discard(tmp, STATE)
        self.model.save_pretrained(tmp / "model")
        state = {**state, "optimizer": self.optimizer.state_dict()}
        if self.ema is not None:
            self.ema.module.save_pretrained(tmp / "ema")
            state["ema_n_averaged"] = int(self.ema.n_averaged)
        if self.disc is not None:
            state.update(disc=self.disc.state_dict(), disc_optimizer=self.disc_optimizer.state_dict())
        swap_in(tmp, final, old, state, STATE)  # the state file last: a folder holding it is complete

    def load(self, checkpoint: Path, device: torch.device) -> dict[str, Any]:
        """Restore from ``checkpoint``; returns the saved progress (step, timings, initial eval)."""
        saved = torch.load(checkpoint / STATE, map_location=device, weights_only=True)
        self.model.load_weights(load_file(checkpoint / "model" / WEIGHTS_NAME), source=str(checkpoint / "model"))
        self.optimizer.load_state_dict(saved.pop("optimizer"))
        if self.ema is not None and (checkpoint / "ema").is_dir():
            self.ema.module.load_weights(load_file(checkpoint / "ema" / WEIGHTS_NAME), source=str(checkpoint / "ema"))
            self.ema.n_averaged.fill_(saved.get("ema_n_averaged", 0))
        disc, disc_optimizer = saved.pop("disc", None), saved.pop("disc_optimizer", None)
        if self.disc is not None and disc is not None:
            self.disc.load_state_dict(disc)
            self.disc_optimizer.load_state_dict(disc_optimizer)
        return saved


def _check_disc_depth(disc: DiscBlock, image_size: tuple[int, int]) -> None:
    """Check ``disc.layers`` leaves the discriminator patches to judge."""
    side = min(image_size)
    if patch_grid_side(side, disc.layers) < 1:
        fits = [n for n in range(1, disc.layers) if patch_grid_side(side, n) >= 1]
        fix = f"use disc.layers={fits[-1]} or fewer" if fits else "use disc.enabled=false or larger frames"
        raise TerraInputError(f"disc.layers={disc.layers} is too deep for the model's {image_size[0]}x{image_size[1]} "
                              f"frames (the discriminator would have no patch left to judge); {fix}")


def train_step(
    t: Trainees, forward, batch: torch.Tensor, step: int, spec: TokenizerTrainSpec, autocast
) -> tuple[dict[str, torch.Tensor], TrainOutput]:
    """One optimisation step (tokenizer, then discriminator once it is active); returns logged values."""
    weights = spec.loss
    with autocast:
        out = forward(batch)
    recon = out.reconstruction.float()
    l1 = (recon - batch).abs().mean()
    loss = weights.l1 * l1 + weights.quantizer * out.quantizer_loss.float()
    if weights.l2:
        loss = loss + weights.l2 * (recon - batch).pow(2).mean()
    if weights.gradient:
        loss = loss + weights.gradient * gradient_l1(recon, batch)
    gan = t.disc is not None and step >= spec.disc.start_step
    if gan:
        with autocast:
            g_loss = -t.disc(recon).float().mean()  # the hinge loss's generator side
        loss = loss + spec.disc.weight * g_loss
    t.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if spec.train.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(t.model.parameters(), spec.train.grad_clip)
    t.optimizer.step()
    record = {"loss": loss.detach(), "l1": l1.detach(), **out.stats}
    if gan:
        t.disc_optimizer.zero_grad(set_to_none=True)
        with autocast:  # the hinge loss's discriminator side
            d_loss = 0.5 * (F.relu(1.0 - t.disc(batch).float()).mean()
                            + F.relu(1.0 + t.disc(recon.detach()).float()).mean())
        d_loss.backward()
        t.disc_optimizer.step()
        record.update(g_loss=g_loss.detach(), d_loss=d_loss.detach())
    if t.ema is not None:
        t.ema.update_parameters(t.model)
    return record, out


def train(spec: TokenizerTrainSpec) -> dict[str, Any]:
    """Run (or resume) the training ``spec`` describes; return the summary also written to ``summary.json``."""
    with spec.train.output.hold(LOG):
        return _train(spec)


def _train(spec: TokenizerTrainSpec) -> dict[str, Any]:
    t0 = time.monotonic()
    run, output_dir = spec.train, spec.train.output.path
    device = torch.device(resolve_device(run.device))
    torch.manual_seed(run.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    memory_format = torch.channels_last if device.type == "cuda" else torch.contiguous_format

    t = Trainees.build(spec, device, memory_format)
    model = t.model
    frames_np = training_frames(spec.data, model.image_size, output_dir)
    frames = torch.from_numpy(frames_np)
    if device.type == "cuda" and frames.numel() <= spec.data.device_cache_gb * 2**30:
        frames = frames.to(device)
    eval_index = np.linspace(0, len(frames_np) - 1, min(run.eval_frames, len(frames_np))).astype(int)
    eval_images = torch.from_numpy(frames_np[eval_index]).to(device).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)

    folders = [output_dir / name for name in (CHECKPOINT, f"{CHECKPOINT}.tmp", f"{CHECKPOINT}.old")]  # after a kill
    checkpoint = newest_checkpoint(folders, STATE, "restore it or set train.resume=false") if run.resume else None
    if checkpoint is not None:
        state = t.load(checkpoint, device)
        print(f"resumed from {checkpoint} at step {state['step']}", flush=True)
    else:
        state = {"step": 0, "train_seconds": 0.0, "eval_initial": evaluate(model, eval_images)}
        _log(output_dir, {"event": "eval", "step": 0, **state["eval_initial"]})

    forward = torch.compile(model) if run.compile else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and run.bf16 else nullcontext()
    usage = torch.zeros(model.codebook_size, dtype=torch.int64, device=device)  # each code's uses since the last row
    budget_s = math.inf if run.max_minutes is None else run.max_minutes * 60
    step_time, save_time, window = 0.0, 1.0, []
    start_step = step = int(state["step"])
    max_steps = run.max_steps
    run_start, trained_before = time.monotonic(), float(state["train_seconds"])

    def save() -> float:
        begin = time.monotonic()
        state.update(step=step, train_seconds=trained_before + begin - run_start)
        t.save(output_dir, state)
        return time.monotonic() - begin

    window_t0 = time.monotonic()
    while step < max_steps:
        if step > start_step and time.monotonic() - t0 + 3 * step_time + 2 * save_time > budget_s:
            break
        tick = time.monotonic()
        factor = lr_factor(step, run.warmup_steps, max_steps, run.min_lr_ratio)
        for group in t.optimizer.param_groups:
            group["lr"] = run.lr * factor
        batch = sample_batch(frames, run.batch_size, step, spec.data.seed, spec.data.hflip)
        batch = batch.to(device, non_blocking=True).contiguous(memory_format=memory_format)
        record, out = train_step(t, forward, batch, step, spec, autocast)
        usage += torch.bincount(out.codes.reshape(-1), minlength=model.codebook_size)
        step += 1
        window.append(record)
        if step % run.log_every == 0 or step == max_steps:
            stats = {k: torch.stack([r[k] for r in window if k in r]).float().mean().item() for k in window[-1]}
            _log(output_dir, {"event": "train", "step": step, **stats, "psnr": psnr(out.reconstruction, batch),
                              "lr": run.lr * factor, "code_usage": (usage > 0).float().mean().item(),
                              "code_perplexity": perplexity(usage),
                              "steps_per_s": len(window) / max(1e-9, time.monotonic() - window_t0)})
            window, window_t0, usage = [], time.monotonic(), torch.zeros_like(usage)
        if device.type == "cuda":
            torch.cuda.synchronize()
        took = time.monotonic() - tick
        step_time = took if step - start_step == 1 else 0.9 * step_time + 0.1 * took
        if step % run.checkpoint_every == 0 and step < max_steps:
            save_time = save()

    finished = step >= max_steps
    save()
    summary: dict[str, Any] = {"step": step, "max_steps": max_steps, "finished": finished,
                               "train_seconds": state["train_seconds"], "eval_initial": state.get("eval_initial"),
                               "eval": evaluate(model, eval_images), "config": spec.record}
    if finished:
        export = t.ema.module if t.ema is not None else model
        summary["eval_export"] = evaluate(export, eval_images)
        run.export.record()
        export.to(getattr(torch, run.export_dtype)).save_pretrained(run.export.path)  # after the fp32 checkpoint
        summary["export_dir"] = run.export_dir
    _log(output_dir, {"event": "eval", "step": step, **summary["eval"]})
    write_text(output_dir / SUMMARY, json_text(summary, indent=2) + "\n")
    print(f"{'finished' if finished else 'stopped (budget)'} at step {step}/{max_steps}; "
          + (f"exported to {run.export_dir}" if finished else "run the same command again to resume"), flush=True)
    return summary


def _log(output_dir: Path, entry: dict[str, Any]) -> None:
    entry = {k: (float(f"{v:.5g}") if isinstance(v, float) else v) for k, v in entry.items()}
    with open(output_dir / LOG, "a", encoding="utf-8") as fh:
        fh.write(json_text(entry) + "\n")
    print(" ".join(f"{k}={v}" for k, v in entry.items()), flush=True)
