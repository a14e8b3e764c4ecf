"""Image tokenizers: images ``[B, 3, H, W]`` in [-1, 1] ↔ integer codes ``[B, h, w]``.

Two families share one interface (:class:`ImageTokenizer`): :class:`LFQTokenizer` (lookup-free, Terra's)
and :class:`VQTokenizer` (LlamaGen's VQ-16 layout). :func:`load_tokenizer` opens any saved one.
"""

from tokenizer.base import ImageTokenizer, load_tokenizer
from tokenizer.lfq import LFQTokenizer
from tokenizer.vq import VQTokenizer

__all__ = ["ImageTokenizer", "LFQTokenizer", "VQTokenizer", "load_tokenizer"]
