"""ACT-Bench's ACT-Estimator (``VideoActionEstimator``, Inception-I3D backbone) in plain torch, loaded from published
weights."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Mapping, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from terra.config.checks import Range, shown
from terra.config.files import load_json, open_input_file
from terra.core.errors import TerraInputError, error_reason
from terra.scoring.i3d import FEATURES, InceptionI3d
from terra.tokenizer.tensors import check_like


MAX_WEIGHTS_BYTES = 2 << 30  # the published estimator is about 0.1 GB in fp32
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.bin", "model.pt")  # looked for in this order
OPTIONAL = ("positional_encoding.pe", ".num_batches_tracked")  # name endings a weights file may leave out
ANCHOR = "squeeze_linear.weight"  # a name only the estimator has: where the wrapper prefix is read from


def weights_file(folder: Path) -> Path:
    """The first of :data:`WEIGHT_FILES` in ``folder``, checked to be a regular file of a sane size."""
    for name in WEIGHT_FILES:
        if os.path.lexists(folder / name):
            open_input_file(folder / name, "estimator weights", MAX_WEIGHTS_BYTES).close()
            return folder / name
    raise TerraInputError(f"estimator folder {folder} has none of {', '.join(WEIGHT_FILES)}; download ACT-Bench's "
                          f"estimator into it: hf download turing-motors/ACT-Estimator --local-dir {folder}")


def read_weights(path: Path) -> dict[str, Tensor]:
    """The tensors of a safetensors file, or of a torch file (a state dict, or ``{"state_dict": ...}``)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            data = load_file(str(path), device="cpu")
        else:
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, corrupt or foreign files: each reader raises its own types
        raise TerraInputError(f"estimator weights {path} cannot be read ({error_reason(err)}); the file is "
                              "truncated, corrupt or not a checkpoint: download it again") from None
    if isinstance(data, dict) and isinstance(data.get("state_dict"), dict):
        data = data["state_dict"]
    if not isinstance(data, dict) or not data or not all(isinstance(v, Tensor) for v in data.values()):
        raise TerraInputError(f"estimator weights {path} hold no state dict of tensors")
    return data


def match_weights(tensors: Mapping[str, Tensor], shapes: Mapping[str, tuple[int, ...]],
                  source: str) -> dict[str, Tensor]:
    """``tensors`` under the estimator's names (``shapes``): the names as published or all under one prefix."""
    anchors = [k for k in tensors if k == ANCHOR or k.endswith("." + ANCHOR)]
    prefix = anchors[0][: -len(ANCHOR)] if len(anchors) == 1 else ""
    unmatched = sorted(k for k in tensors if not k.startswith(prefix) or k[len(prefix):] not in shapes)
    named = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    missing = sorted(k for k in shapes if k not in named and not k.endswith(OPTIONAL))
    if unmatched or missing:
        raise TerraInputError(
            f"{source} is not ACT-Bench's VideoActionEstimator"
            f"{f' (prefix {prefix!r})' if prefix else ''}: {len(unmatched)} unmatched tensors (first: "
            f"{', '.join(unmatched[:3]) or '-'}), {len(missing)} missing (first: {', '.join(missing[:3]) or '-'}); "
            "check that config.json matches the weights")
    for name, shape in shapes.items():  # in the model's order: the first mismatch is the earliest layer's
        if name in named and tuple(named[name].shape) != shape:
            raise TerraInputError(f"{source}: {prefix}{name} has shape {list(named[name].shape)}, the architecture "
                                  f"of config.json needs {list(shape)}; check config.json")
    return named


CONFIG_RANGES = {
    "num_classes": Range(1, 1000, 9, whole=True),
    "max_seq_len": Range(1, 1000, 44, whole=True),
    "timestamp_dim": Range(0, 1, 1, whole=True),  # ACT-Bench feeds one timestamp per waypoint, or none
    "d_model": Range(2, 8192, 512, whole=True),
    "num_heads": Range(1, 256, 8, whole=True),
    "feature_map_size": Range(1, 64, 4, whole=True),
    "dropout": Range(0, 1, 0.1),
}


@dataclass(frozen=True)
class EstimatorConfig:
    """``VideoActionEstimator``'s constructor arguments; the defaults are the published ACT-Estimator's."""

    input_shape: tuple[int, int, int, int] = (3, 44, 224, 224)  # channels, frames, height, width
    num_classes: int = 9
    max_seq_len: int = 44
    timestamp_dim: int = 1
    d_model: int = 512
    num_heads: int = 8
    feature_map_size: int = 4
    dropout: float = 0.1

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> EstimatorConfig:
        """A ``config.json``: known keys checked, missing ones published, others (Transformers' own) ignored."""
        data = load_json(path, "estimator config", 1 << 20)
        if not isinstance(data, dict):
            raise TerraInputError(f"estimator config {path} must be a JSON object of VideoActionEstimator's arguments")
        values = {f.name: CONFIG_RANGES[f.name].check(data[f.name], f.name, f"{path}: ") if f.name in CONFIG_RANGES
                  else data[f.name] for f in fields(cls) if f.name in data}
        if "input_shape" in values:
            shape = values["input_shape"]
            if not (isinstance(shape, list) and len(shape) == 4):
                raise TerraInputError(f"{path}: input_shape must be [3, frames, height, width] (got {shown(shape)})")
            values["input_shape"] = tuple(Range(1, 4096, 224, whole=True).check(n, "input_shape", f"{path}: ")
                                          for n in shape)
        config = cls(**values)
        channels, frames = config.input_shape[:2]
        if channels != 3 or frames != config.max_seq_len:
            raise TerraInputError(f"{path}: input_shape {list(config.input_shape)} must be [3, max_seq_len "
                                  f"({config.max_seq_len}), height, width]")
        if config.d_model % config.num_heads or config.d_model % 2:
            raise TerraInputError(f"{path}: d_model ({config.d_model}) must be even and a multiple of num_heads "
                                  f"({config.num_heads})")
        return config

    @property
    def memory_len(self) -> int:
        """Tokens the encoder sees: the backbone's output frames x ``feature_map_size``²."""
        # Conv3d_1a_7x7 and MaxPool3d_4a_3x3 each halve time, rounded up (same padding): a quarter, rounded up
        return math.ceil(self.input_shape[1] / 4) * self.feature_map_size**2


class Estimate(NamedTuple):
    """The estimator's output: ``command`` logits ``[B, num_classes]``, ``waypoints`` ``[B, frames, 2]``."""

    command: Tensor
    waypoints: Tensor


class PositionalEncoding(nn.Module):
    """The sinusoidal table of "Attention is all you need" added to ``[B, L, d]`` (sin on even, cos on odd)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        position = torch.arange(max_len, dtype=torch.float).unsqueeze(1)
        frequency = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency)
        self.register_buffer("pe", table.unsqueeze(0))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.pe[:, : x.size(1)]


class CrossAttention(nn.Module):
    """Multi-head attention with separate query/key/value projections (no dropout); returns the output only."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.query_proj, self.key_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.value_proj, self.out_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        def heads(x: Tensor) -> Tensor:
            return x.view(x.size(0), x.size(1), self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.query_proj(query)), heads(self.key_proj(key)), heads(self.value_proj(value))
        weights = (torch.matmul(q, k.transpose(-2, -1)) * self.head_dim**-0.5).softmax(dim=-1)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(v.size(0), -1, self.num_heads * self.head_dim)
        return self.out_proj(out)


class FeedForward(nn.Module):
    """Linear-GELU-Dropout-Linear."""

    def __init__(self, d_model: int, hidden: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model)
        self.gelu, self.dropout = nn.GELU(), nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.gelu(self.linear1(x))))


class PreGRULayer(nn.Module):
    """The GRU's input at each step: the hidden state attends to the memory."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.pre_norm0 = nn.LayerNorm(d_model)
        self.self_attention = nn.MultiheadAttention(d_model, num_heads, dropout=dropout, batch_first=True)
        self.dropout0 = nn.Dropout(dropout)
        self.pre_norm1 = nn.LayerNorm(d_model)
        self.cross_attention = CrossAttention(d_model, num_heads)
        self.dropout1 = nn.Dropout(dropout)
        self.pre_norm2 = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_model // 2)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, q: Tensor, x: Tensor) -> Tensor:
        memory = self.pre_norm1(x)
        x = self.dropout1(self.cross_attention(q, memory, memory)) + x
        normed = self.pre_norm0(x)
        x = self.dropout0(self.self_attention(normed, normed, normed)[0]) + x
        return self.dropout2(self.ffn(self.pre_norm2(x))) + x


class WaypointPredictor(nn.Module):
    """``num_waypoints`` (x, y) points from the origin."""

    def __init__(self, d_model: int, memory_len: int, timestamp_dim: int, num_heads: int) -> None:
        super().__init__()
        self.hidden_state = nn.Parameter(torch.randn(1, d_model))
        self.pos_embedding = nn.Parameter(torch.randn(1, memory_len, d_model))
        self.pre_gru_layer = PreGRULayer(d_model, num_heads)
        self.gru = nn.GRUCell(2 + d_model + timestamp_dim, d_model)
        self.head = nn.Sequential(nn.Linear(d_model, d_model // 2), nn.Dropout(0.1), nn.ReLU(),
                                  nn.Linear(d_model // 2, 2))

    def forward(self, memory: Tensor, num_waypoints: int, timestamps: Tensor | None = None) -> Tensor:
        batch, dtype = memory.shape[0], memory.dtype
        point = memory.new_zeros((batch, 2))
        h = self.hidden_state.repeat(batch, 1).to(dtype)
        memory = memory + self.pos_embedding.repeat(batch, 1, 1).to(dtype)
        points = [memory.new_zeros((batch, 2))]  # the first waypoint is the origin
        for t in range(num_waypoints - 1):
            inputs = torch.cat([point, self.pre_gru_layer(h.unsqueeze(1), memory).mean(1)], dim=1)
            if timestamps is not None:
                inputs = torch.cat([inputs, timestamps[:, t].reshape(batch, -1)], dim=1)
            h = self.gru(inputs, h)
            point = point + self.head(h)
            points.append(point)
        return torch.stack(points, dim=1)


class VideoActionEstimator(nn.Module):
    """Frames ``[B, 3, T, H, W]`` in [0, 1] (and timestamps ``[B, T, 1]``) → :class:`Estimate`."""

    def __init__(self, config: EstimatorConfig = EstimatorConfig()) -> None:
        super().__init__()
        self.config = config
        d_model, size = config.d_model, config.feature_map_size
        self.backbone = InceptionI3d()
        self.avg_pool = nn.AdaptiveAvgPool3d((None, size, size))
        self.squeeze_linear = nn.Linear(FEATURES, d_model)
        self.positional_encoding = PositionalEncoding(d_model, config.memory_len)
        layer = nn.TransformerEncoderLayer(d_model, config.num_heads, dim_feedforward=512, batch_first=True,
                                           activation=F.gelu)
        self.self_attn = nn.TransformerEncoder(layer, num_layers=2)
        self.classifier = nn.Sequential(nn.Linear(d_model, d_model), nn.Dropout(config.dropout), nn.GELU(),
                                        nn.Linear(d_model, config.num_classes))
        self.visual_odmetry = WaypointPredictor(d_model, config.memory_len, config.timestamp_dim, config.num_heads)

    def forward(self, frames: Tensor, timestamps: Tensor | None = None) -> Estimate:
        x = self.avg_pool(self.backbone(frames))  # [B, 1024, T', size, size]
        b, c, t, h, w = x.shape
        # The published layout: the [B, C, T', h, w] memory read as [B, T'·h·w, C] (a view, not a permute).
        x = self.positional_encoding(self.squeeze_linear(x.contiguous().view(b, t * h * w, c)))
        x = self.self_attn(x)
        return Estimate(self.classifier(x.mean(1)), self.visual_odmetry(x, frames.size(2), timestamps))

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> VideoActionEstimator:
        """The estimator of ``folder``, on the CPU in fp32, in eval mode."""
        folder = Path(folder).expanduser()
        if not (folder / "config.json").exists():
            raise TerraInputError(f"estimator folder {folder} has no config.json (VideoActionEstimator's arguments, "
                                  f"e.g. {json.dumps(asdict(EstimatorConfig()))})")
        model = cls(EstimatorConfig.from_json(folder / "config.json"))
        path = weights_file(folder)
        state = model.state_dict()
        named = match_weights(read_weights(path), {k: tuple(v.shape) for k, v in state.items()}, str(path))
        for name, tensor in named.items():  # load_state_dict would cast integers and keep NaNs
            check_like(tensor, state[name], f"estimator weights {path}: tensor {name}", "download them again")
        state.update(named)
        model.load_state_dict(state)
        return model.eval()
