"""Image tokenizers: images ``[B, 3, H, W]`` in [-1, 1] ↔ integer codes ``[B, h, w]``.

Two families share one interface (:class:`ImageTokenizer`): :class:`LFQTokenizer` (lookup-free, Terra's)
and :class:`VQTokenizer` (LlamaGen's VQ-16 layout). :func:`load_tokenizer` opens any saved one.

The names load on first use, so ``tokenizer.resize`` and ``terra.tokenizer.images`` are importable without torch: the
entry points check their settings before the heavy imports (terra/config/). The tokenizer stands alone: of the
toolkit it imports only the ground floor (terra/core/: the error type, atomic writes).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ImageTokenizer", "LFQTokenizer", "VQTokenizer", "load_tokenizer"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'terra.tokenizer' has no attribute {name!r}")
    from terra.tokenizer import base, lfq, vq  # every family registers itself with load_tokenizer when imported

    return getattr(lfq if name == "LFQTokenizer" else vq if name == "VQTokenizer" else base, name)
