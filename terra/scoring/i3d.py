"""Inception-v1 I3D (Carreira & Zisserman, 2017) up to ``Mixed_5c``, in plain torch, named as the published weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FEATURES = 1024  # channels of Mixed_5c
# Inception blocks: name → (input channels, (1x1, 3x3 reduce, 3x3, 3x3 reduce, 3x3, pool projection)), and the
# max-pools that come before a block: block → (name, kernel, stride).
MIXED = {
    "Mixed_3b": (192, (64, 96, 128, 16, 32, 32)),
    "Mixed_3c": (256, (128, 128, 192, 32, 96, 64)),
    "Mixed_4b": (480, (192, 96, 208, 16, 48, 64)),
    "Mixed_4c": (512, (160, 112, 224, 24, 64, 64)),
    "Mixed_4d": (512, (128, 128, 256, 24, 64, 64)),
    "Mixed_4e": (512, (112, 144, 288, 32, 64, 64)),
    "Mixed_4f": (528, (256, 160, 320, 32, 128, 128)),
    "Mixed_5b": (832, (256, 160, 320, 32, 128, 128)),
    "Mixed_5c": (832, (384, 192, 384, 48, 128, 128)),
}
POOLS_BEFORE = {"Mixed_4b": ("MaxPool3d_4a_3x3", (3, 3, 3), (2, 2, 2)),
                "Mixed_5b": ("MaxPool3d_5a_2x2", (1, 2, 2), (1, 2, 2))}


def same_padding(x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...]) -> Tensor:
    """Zero-pad ``[B, C, T, H, W]`` as TensorFlow's SAME does (the extra cell after), as I3D's port computes it."""
    pads = []
    for size, k, s in zip(reversed(x.shape[2:]), reversed(kernel), reversed(stride)):
        total = max(k - (s if size % s == 0 else size % s), 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


class MaxPool3dSamePadding(nn.MaxPool3d):
    """Max-pooling after :func:`same_padding`."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(same_padding(x, self.kernel_size, self.stride))


class Unit3D(nn.Module):
    """Convolution without bias (SAME padding), BatchNorm (eps 1e-3), ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel: tuple[int, int, int] = (1, 1, 1),
                 stride: tuple[int, int, int] = (1, 1, 1)) -> None:
        super().__init__()
        self.kernel, self.stride = kernel, stride
        self.conv3d = nn.Conv3d(in_channels, out_channels, kernel, stride, padding=0, bias=False)
        self.bn = nn.BatchNorm3d(out_channels, eps=0.001, momentum=0.01)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.bn(self.conv3d(same_padding(x, self.kernel, self.stride))))


class InceptionModule(nn.Module):
    """Four branches concatenated: 1x1; 1x1 → 3x3x3; 1x1 → 3x3x3; 3x3x3 max-pool → 1x1."""

    def __init__(self, in_channels: int, out: tuple[int, int, int, int, int, int]) -> None:
        super().__init__()
        self.b0 = Unit3D(in_channels, out[0])
        self.b1a = Unit3D(in_channels, out[1])
        self.b1b = Unit3D(out[1], out[2], (3, 3, 3))
        self.b2a = Unit3D(in_channels, out[3])
        self.b2b = Unit3D(out[3], out[4], (3, 3, 3))
        self.b3a = MaxPool3dSamePadding(kernel_size=(3, 3, 3), stride=(1, 1, 1), padding=0)
        self.b3b = Unit3D(in_channels, out[5])

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b0(x), self.b1b(self.b1a(x)), self.b2b(self.b2a(x)), self.b3b(self.b3a(x))], dim=1)


class InceptionI3d(nn.Module):
    """Inception-v1 I3D from RGB to ``Mixed_5c``: ``[B, 1024, ceil(T / 4), ceil(H / 32), ceil(W / 32)]``."""

    def __init__(self) -> None:
        super().__init__()
        self.add_module("Conv3d_1a_7x7", Unit3D(3, 64, (7, 7, 7), (2, 2, 2)))
        self.add_module("MaxPool3d_2a_3x3", MaxPool3dSamePadding(kernel_size=(1, 3, 3), stride=(1, 2, 2), padding=0))
        self.add_module("Conv3d_2b_1x1", Unit3D(64, 64))
        self.add_module("Conv3d_2c_3x3", Unit3D(64, 192, (3, 3, 3)))
        self.add_module("MaxPool3d_3a_3x3", MaxPool3dSamePadding(kernel_size=(1, 3, 3), stride=(1, 2, 2), padding=0))
        for block, (in_channels, out) in MIXED.items():
            if block in POOLS_BEFORE:
                name, kernel, stride = POOLS_BEFORE[block]
                self.add_module(name, MaxPool3dSamePadding(kernel_size=kernel, stride=stride, padding=0))
            self.add_module(block, InceptionModule(in_channels, out))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.children():
            x = layer(x)
        return x
