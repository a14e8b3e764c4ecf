"""Image codes → uint8 RGB frames, decoded in batches by a tokenizer."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from terra.core.progress import shows_bars
from terra.tokenizer.base import ImageTokenizer


def images_to_uint8(images: torch.Tensor) -> np.ndarray:
    """Images ``[B, 3, H, W]`` in [-1, 1] → uint8 ``[B, H, W, 3]``, quantised as Terra's code does for every model."""
    unit = (images.detach().float().clamp(-1.0, 1.0) + 1.0) / 2.0
    return (255 * unit.permute(0, 2, 3, 1).cpu().numpy()).astype(np.uint8)


def codes_to_frames(tokenizer: ImageTokenizer, codes: Any, batch_size: int = 8, progress: bool = False) -> np.ndarray:
    """Codes ``[T, h, w]`` or ``[T, h * w]`` (tensor or array) → frames uint8 ``[T, H, W, 3]``."""
    codes = tokenizer.check_codes(torch.as_tensor(np.asarray(codes) if not torch.is_tensor(codes) else codes))
    chunks = tqdm(codes.split(max(1, batch_size)), desc="decoding", disable=not shows_bars(progress))
    frames = [part for chunk in chunks for part in _decode_fitting(tokenizer, chunk)]
    return np.concatenate(frames) if frames else np.zeros((0, *tokenizer.image_size, 3), dtype=np.uint8)


def _decode_fitting(tokenizer: ImageTokenizer, codes: torch.Tensor) -> list[np.ndarray]:
    """Frames of checked ``codes [B, ...]``, decoded at once or, out of memory, in halves down to single frames."""
    try:
        return [images_to_uint8(tokenizer.decode(codes))]
    except torch.OutOfMemoryError:
        if len(codes) == 1:
            raise
    # outside the handler: the failed call's tensors (held by the exception's traceback) are free again
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    half = (len(codes) + 1) // 2
    return _decode_fitting(tokenizer, codes[:half]) + _decode_fitting(tokenizer, codes[half:])
