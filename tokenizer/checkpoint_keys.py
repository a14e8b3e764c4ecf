"""Cleaning published tokenizer state dicts before a strict load."""

from __future__ import annotations

import re
from typing import Mapping

import torch

# Wrappers that prefix every key: DistributedDataParallel and torch.compile.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")

# Keys that hold training-time statistics, not weights: dropped before a strict load.
IGNORED_KEYS = (
    re.compile(r"^quantize\.codebook_used$"),  # LlamaGen's codebook-usage ring buffer
)


def clean(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip wrapper prefixes and drop training statistics."""
    out = {}
    for key, value in state_dict.items():
        for prefix in WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
        if not any(p.match(key) for p in IGNORED_KEYS):
            out[key] = value
    return out
