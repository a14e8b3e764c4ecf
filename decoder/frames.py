"""Image codes → uint8 RGB frames, decoded in batches by a tokenizer."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from tokenizer.base import ImageTokenizer


def images_to_uint8(images: torch.Tensor) -> np.ndarray:
    """Images ``[B, 3, H, W]`` in [-1, 1] → uint8 ``[B, H, W, 3]`` (rounded, clipped)."""
    pixels = ((images.detach().float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).cpu().numpy()


def codes_to_frames(
    tokenizer: ImageTokenizer, codes: Any, batch_size: int = 8, progress: bool = False
) -> np.ndarray:
    """Codes ``[T, h, w]`` or ``[T, h * w]`` (tensor or array) → frames uint8 ``[T, H, W, 3]``.

    Decodes ``batch_size`` frames at a time on the tokenizer's device and dtype, so long rollouts fit in
    memory; codes outside the codebook raise :class:`tokenizer.errors.InputError`.
    """
    codes = tokenizer.check_codes(torch.as_tensor(np.asarray(codes) if not torch.is_tensor(codes) else codes))
    chunks = codes.split(max(1, batch_size))
    frames = [images_to_uint8(tokenizer.decode(chunk)) for chunk in tqdm(chunks, desc="decoding", disable=not progress)]
    if not frames:
        height, width = tokenizer.image_size
        return np.zeros((0, height, width, 3), dtype=np.uint8)
    return np.concatenate(frames)
