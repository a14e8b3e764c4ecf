"""How a frame is fitted to a tokenizer's size: cover and centre-crop (``crop``) or straight (``stretch``)."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps

from terra.core.errors import TerraInputError

RESIZE_MODES = ("crop", "stretch")  # see fit_frame
MAX_UPSCALE = 8.0  # larger enlargements (a 1x1 or thumbnail image) carry no usable scene


def fit_frame(frame: Image.Image, image_size: tuple[int, int], source: str = "image",
              resize: str = "crop") -> np.ndarray:
    """Resize to ``(H, W)`` → uint8 ``[H, W, 3]``: cover and center-crop (``crop``) or straight (``stretch``)."""
    height, width = image_size
    scale = max(width / frame.width, height / frame.height)
    if scale > MAX_UPSCALE:
        raise TerraInputError(f"{source} is {frame.width}x{frame.height} pixels, too small for {width}x{height} frames "
                              f"(it would be enlarged {scale:.0f}x); pass frames of at least "
                              f"{-(-width // int(MAX_UPSCALE))}x{-(-height // int(MAX_UPSCALE))} pixels, ideally "
                              f"{width}x{height}")
    if resize == "stretch":
        return np.asarray(frame.resize((width, height), Image.Resampling.BICUBIC), dtype=np.uint8)
    return np.asarray(ImageOps.fit(frame, (width, height), method=Image.Resampling.BICUBIC), dtype=np.uint8)
