"""Building blocks for training a tokenizer: PatchGAN discriminator, losses, EMA, metrics, data."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from terra.metrics import psnr_db


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


def hinge_d_loss(logits_real: torch.Tensor, logits_fake: torch.Tensor) -> torch.Tensor:
    return 0.5 * (F.relu(1.0 - logits_real).mean() + F.relu(1.0 + logits_fake).mean())


def hinge_g_loss(logits_fake: torch.Tensor) -> torch.Tensor:
    return -logits_fake.mean()


def gradient_l1(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """L1 between horizontal and vertical finite differences: a download-free sharpness term."""
    dx = lambda t: t[..., :, 1:] - t[..., :, :-1]  # noqa: E731
    dy = lambda t: t[..., 1:, :] - t[..., :-1, :]  # noqa: E731
    return (dx(x) - dx(y)).abs().mean() + (dy(x) - dy(y)).abs().mean()


def psnr(reconstruction: torch.Tensor, target: torch.Tensor) -> float:
    """PSNR in dB of images in [-1, 1]."""
    mse = ((reconstruction.detach().float().clamp(-1, 1) - target.float()) / 2).pow(2).mean().item()
    return psnr_db(max(mse, 1e-10), peak=1.0)


def make_ema(model: nn.Module, decay: float) -> AveragedModel:
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


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


class CodeUsage:
    def __init__(self, codebook_size: int) -> None:
        self.counts: torch.Tensor | None = None
        self.codebook_size = codebook_size

    def update(self, codes: torch.Tensor) -> None:
        counts = torch.bincount(codes.reshape(-1), minlength=self.codebook_size)
        self.counts = counts if self.counts is None else self.counts + counts

    def fraction_used(self) -> float:
        return 0.0 if self.counts is None else (self.counts > 0).float().mean().item()

    def perplexity(self) -> float:
        """exp(entropy) of the code histogram: the effective number of codes in use."""
        if self.counts is None:
            return 0.0
        p = self.counts.float() / self.counts.sum()
        return math.exp(-(p[p > 0] * p[p > 0].log()).sum().item())

    def reset(self) -> None:
        self.counts = None
