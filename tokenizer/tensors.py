"""Checks of tensors read from files, done once where a file is loaded: the dtype, finiteness and range."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from terra.core.errors import TerraInputError

CHUNK = 1 << 24  # elements scanned at a time


def _is_torch(value: Any) -> bool:
    return hasattr(value, "is_floating_point") and hasattr(value, "detach")


def is_floating(value: Any) -> bool:
    """Whether ``value`` (a torch tensor or numpy array) holds floating-point numbers."""
    return value.is_floating_point() if _is_torch(value) else np.issubdtype(value.dtype, np.floating)


def count_non_finite(value: Any) -> int:
    """How many elements of a floating-point ``value`` are NaN or infinite."""
    lib = importlib.import_module("torch") if _is_torch(value) else np  # torch is loaded when value is a tensor
    flat = value.detach().reshape(-1) if _is_torch(value) else np.asarray(value).reshape(-1)
    parts = (flat[start:start + CHUNK] for start in range(0, flat.shape[0], CHUNK))
    return sum(int((~lib.isfinite(part)).sum()) for part in parts
               if not bool(lib.isfinite(part.sum(dtype=lib.float64))))


def check_floats(value: Any, where: str, fix: str) -> None:
    """Raise unless ``value`` is floating point and finite; ``where`` names the tensor, ``fix`` ends the line."""
    if not is_floating(value):
        raise TerraInputError(f"{where} holds {value.dtype} numbers where floating point is needed; {fix}")
    bad = count_non_finite(value)
    if bad:
        raise TerraInputError(f"{where} holds {bad} NaN or infinite value(s) of {_numel(value)}; {fix}")


def check_like(value: Any, model: Any, where: str, fix: str) -> None:
    """Raise unless weight ``value`` may load into ``model``'s tensor: finite floats, or whole numbers for counts."""
    if is_floating(model):
        check_floats(value, where, fix)
    elif is_floating(value):
        raise TerraInputError(f"{where} holds {value.dtype} numbers where the model keeps {model.dtype} counts; {fix}")


def check_codes(value: Any, where: str, codebook_size: int, fix: str) -> None:
    """Raise unless ``value`` holds whole numbers in ``[0, codebook_size)``."""
    if is_floating(value) or str(value.dtype) in ("bool", "torch.bool") or "complex" in str(value.dtype):
        raise TerraInputError(f"{where} holds {value.dtype} values where image codes (whole numbers) are needed; {fix}")
    if _numel(value):
        low, high = int(value.min()), int(value.max())
        if low < 0 or high >= codebook_size:
            raise TerraInputError(f"{where} holds codes from {low} to {high}, outside the codebook [0, "
                                  f"{codebook_size}); {fix}")


def _numel(value: Any) -> int:
    return int(value.numel()) if _is_torch(value) else int(np.asarray(value).size)
