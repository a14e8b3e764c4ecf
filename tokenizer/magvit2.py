"""Open-MAGVIT2 (v1) convolutional encoder and decoder: the network of Terra's LFQ image tokenizer."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from terra.tokenizer.modules import ResnetBlock, group_norm


def depth_to_space(x: torch.Tensor, block_size: int = 2) -> torch.Tensor:
    """``[B, s*s*C, H, W]`` → ``[B, C, s*H, s*W]`` in DCR order (depth, column, row)."""
    return rearrange(x, "b (i j c) h w -> b c (h i) (w j)", i=block_size, j=block_size)


class Upsampler(nn.Module):
    """x2 upsampling: a 3x3 conv to four times the channels, then :func:`depth_to_space`."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 4 * channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return depth_to_space(self.conv1(x))


class Level(nn.Module):
    """Residual blocks (``block``) of one resolution, then its ``downsample`` or ``upsample``, where it has one."""

    def __init__(self, blocks: list[ResnetBlock], downsample: nn.Conv2d | None = None,
                 upsample: Upsampler | None = None) -> None:
        super().__init__()
        self.block = nn.ModuleList(blocks)
        self.downsample = downsample
        self.upsample = upsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.block:
            x = block(x)
        resample = self.downsample if self.downsample is not None else self.upsample
        return x if resample is None else resample(x)


class Encoder(nn.Module):
    """Images ``[B, in_channels, H, W]`` → latent ``[B, z_channels, H / 2^(L-1), W / 2^(L-1)]``, L = len(ch_mult)."""

    def __init__(self, ch: int, ch_mult: Sequence[int], num_res_blocks: int, z_channels: int,
                 in_channels: int = 3) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, ch, 3, padding=1, bias=False)
        width = ch
        levels = []
        for level, mult in enumerate(ch_mult):
            blocks = [ResnetBlock(width if i == 0 else ch * mult, ch * mult, bias=False) for i in range(num_res_blocks)]
            width = ch * mult
            last = level == len(ch_mult) - 1
            levels.append(Level(blocks, downsample=None if last else nn.Conv2d(width, width, 3, stride=2, padding=1)))
        self.down = nn.ModuleList(levels)
        self.mid_block = nn.ModuleList(ResnetBlock(width, width, bias=False) for _ in range(num_res_blocks))
        self.norm_out = group_norm(width)
        self.conv_out = nn.Conv2d(width, z_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for level in self.down:
            x = level(x)
        for block in self.mid_block:
            x = block(x)
        return self.conv_out(F.silu(self.norm_out(x)))


class Decoder(nn.Module):
    """Latent ``[B, z_channels, h, w]`` → images ``[B, out_channels, h * 2^(L-1), w * 2^(L-1)]``."""

    def __init__(self, ch: int, ch_mult: Sequence[int], num_res_blocks: int, z_channels: int,
                 out_channels: int = 3) -> None:
        super().__init__()
        width = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, width, 3, padding=1)
        self.mid_block = nn.ModuleList(ResnetBlock(width, width, bias=False) for _ in range(num_res_blocks))
        levels = []
        for level in reversed(range(len(ch_mult))):  # built coarsest first, the order they run in
            blocks = [ResnetBlock(width if i == 0 else ch * ch_mult[level], ch * ch_mult[level], bias=False)
                      for i in range(num_res_blocks)]
            width = ch * ch_mult[level]
            levels.append(Level(blocks, upsample=Upsampler(width) if level > 0 else None))
        self.up = nn.ModuleList(reversed(levels))  # stored finest first: up[i] is resolution level i
        self.norm_out = group_norm(width)
        self.conv_out = nn.Conv2d(width, out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(z)
        for block in self.mid_block:
            x = block(x)
        for level in reversed(self.up):
            x = level(x)
        return self.conv_out(F.silu(self.norm_out(x)))
