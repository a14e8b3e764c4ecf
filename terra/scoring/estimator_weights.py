"""The ACT-Estimator's published weights: found in a folder, read without running code, matched to the estimator's
names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import torch
from torch import Tensor

from terra.config.files import open_input_file
from terra.core.errors import TerraInputError, error_reason

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
