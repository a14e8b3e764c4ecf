"""Image codes → uint8 RGB frames, decoded in batches by a tokenizer."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from terra.core.progress import shows_bars
from terra.tokenizer.base import ImageTokenizer


def images_to_uint8(images: torch.Tensor) -> np.ndarray:
    """Images ``[B, 3, H, W]`` in [-1, 1] → uint8 ``[B, H, W, 3]``, quantised as Terra's code does for every model.

    Terra's ``generate.py`` (``to_np_images``, and its refiner path alike) clamps to [-1, 1], maps to [0, 1] by
    ``(x + 1) / 2``, multiplies by 255 and casts with ``astype(np.uint8)``: a floor, not a rounding (254.9 is 254).
    The same steps run here in float32, so a frame is the byte Terra writes for the same decoded image; this is the
    one place frames are quantised (decoder/writers.py says what each output file then gets).
    """
    unit = (images.detach().float().clamp(-1.0, 1.0) + 1.0) / 2.0
    return (255 * unit.permute(0, 2, 3, 1).cpu().numpy()).astype(np.uint8)


def codes_to_frames(
    tokenizer: ImageTokenizer, codes: Any, batch_size: int = 8, progress: bool = False
) -> np.ndarray:
    """Codes ``[T, h, w]`` or ``[T, h * w]`` (tensor or array) → frames uint8 ``[T, H, W, 3]``.

    Decodes ``batch_size`` frames at a time on the tokenizer's device and dtype, so long rollouts fit in
    memory; a batch the device has no memory for is decoded in halves (:func:`_decode_fitting`); codes outside the
    codebook raise :class:`terra.core.errors.TerraInputError`.
    """
    codes = tokenizer.check_codes(torch.as_tensor(np.asarray(codes) if not torch.is_tensor(codes) else codes))
    chunks = codes.split(max(1, batch_size))
    chunks = tqdm(chunks, desc="decoding", disable=not shows_bars(progress))
    frames = [part for chunk in chunks for part in _decode_fitting(tokenizer, chunk)]
    if not frames:
        height, width = tokenizer.image_size
        return np.zeros((0, height, width, 3), dtype=np.uint8)
    return np.concatenate(frames)


def _decode_fitting(tokenizer: ImageTokenizer, codes: torch.Tensor) -> list[np.ndarray]:
    """Frames of checked ``codes`` ``[B, ...]``, decoded in one call or, when the device runs out of memory, in two
    halves (recursively, down to single frames; a single frame that does not fit raises). A batch writer decodes
    beside a vLLM engine that holds most of the GPU: a decode that does not fit must cost time, not the rollout
    (benchmarks/rollout.md, "ACT-Bench's shape")."""
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
