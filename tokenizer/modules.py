"""Convolutional encoder and decoder of LlamaGen's VQ-16 (VQGAN layout)."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm(32) with eps 1e-6, as in VQGAN, LlamaGen and Open-MAGVIT2."""
    return nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """Pre-activation residual block; a 1x1 ``nin_shortcut`` when the channel count changes."""

    def __init__(self, in_channels: int, out_channels: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.norm1 = group_norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=bias)
        self.norm2 = group_norm(out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=bias)
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1, bias=bias) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all positions of a feature map (1x1 conv projections)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = group_norm(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        q, k, v = (rearrange(proj(h), "b c h w -> b 1 (h w) c") for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)
        out = rearrange(out, "b 1 (h w) c -> b c h w", h=x.shape[2], w=x.shape[3])
        return x + self.proj_out(out)


class Downsample(nn.Module):
    """Stride-2 3x3 conv after padding right/bottom by one (VQGAN's asymmetric padding)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest-neighbour x2 then a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Level(nn.Module):
    """One resolution level: ``res`` blocks, optional ``attn`` after each, then an optional resampler."""

    def __init__(self, res: list[nn.Module], attn: list[nn.Module]) -> None:
        super().__init__()
        self.res = nn.ModuleList(res)
        self.attn = nn.ModuleList(attn)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.res):
            h = block(h)
            if len(self.attn):
                h = self.attn[i](h)
        if hasattr(self, "downsample"):
            h = self.downsample(h)
        if hasattr(self, "upsample"):
            h = self.upsample(h)
        return h


def _mid(channels: int, dropout: float) -> nn.ModuleList:
    """LlamaGen's ``mid``: residual block, attention, residual block."""
    return nn.ModuleList(
        [ResnetBlock(channels, channels, dropout), AttnBlock(channels), ResnetBlock(channels, channels, dropout)]
    )


class Encoder(nn.Module):
    """Image ``[B, in_channels, H, W]`` → latent ``[B, z_channels, H / 2^(L-1), W / 2^(L-1)]``."""

    def __init__(self, ch: int, ch_mult: Sequence[int], num_res_blocks: int, z_channels: int, dropout: float,
                 in_channels: int = 3) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        block_in = ch
        for level, mult in enumerate(ch_mult):
            res, attn = [], []
            for _ in range(num_res_blocks):
                res.append(ResnetBlock(block_in, ch * mult, dropout))
                block_in = ch * mult
                if level == len(ch_mult) - 1:
                    attn.append(AttnBlock(block_in))
            block = _Level(res, attn)
            if level != len(ch_mult) - 1:
                block.downsample = Downsample(block_in)
            self.conv_blocks.append(block)
        self.mid = _mid(block_in, dropout)
        self.norm_out = group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for block in self.conv_blocks:
            h = block(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    """Latent ``[B, z_channels, h, w]`` → image ``[B, out_channels, h * 2^(L-1), w * 2^(L-1)]``."""

    def __init__(self, ch: int, ch_mult: Sequence[int], num_res_blocks: int, z_channels: int, dropout: float,
                 out_channels: int = 3) -> None:
        super().__init__()
        block_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, padding=1)
        self.mid = _mid(block_in, dropout)
        self.conv_blocks = nn.ModuleList()
        for level in reversed(range(len(ch_mult))):
            res, attn = [], []
            for _ in range(num_res_blocks + 1):
                res.append(ResnetBlock(block_in, ch * ch_mult[level], dropout))
                block_in = ch * ch_mult[level]
                if level == len(ch_mult) - 1:
                    attn.append(AttnBlock(block_in))
            block = _Level(res, attn)
            if level != 0:
                block.upsample = Upsample(block_in)
            self.conv_blocks.append(block)
        self.norm_out = group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for block in self.conv_blocks:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))

