"""Image tokenizers: images ``[B, 3, H, W]`` in [-1, 1] ↔ integer codes ``[B, h, w]``."""

from __future__ import annotations

from typing import Any

__all__ = ["ImageTokenizer", "LFQTokenizer", "VQTokenizer", "load_tokenizer"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'terra.tokenizer' has no attribute {name!r}")
    from terra.tokenizer import base, lfq, vq  # every family registers itself with load_tokenizer when imported

    return getattr(lfq if name == "LFQTokenizer" else vq if name == "VQTokenizer" else base, name)
