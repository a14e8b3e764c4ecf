"""Image-quality metrics for generated frames against ground truth (uint8 ``[..., H, W, 3]``)."""

from __future__ import annotations

import numpy as np

PSNR_CAP_DB = 100.0  # identical frames have infinite PSNR; averages use this instead


def psnr_db(mse: float, peak: float = 255.0) -> float:
    """PSNR in dB of a mean squared error ``mse`` for pixel values up to ``peak`` (infinite at 0)."""
    return float(10 * np.log10(peak**2 / mse)) if mse > 0 else float("inf")


def psnr(frames: np.ndarray, reference: np.ndarray) -> list[float]:
    """Per-frame PSNR in dB of uint8 ``frames [T, H, W, 3]`` against ``reference`` of the same shape."""
    frames = np.asarray(frames, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if frames.shape != reference.shape:
        raise ValueError(f"frames {frames.shape} and reference {reference.shape} differ in shape")
    mse = ((frames - reference) ** 2).reshape(len(frames), -1).mean(axis=1)
    return [psnr_db(m) for m in mse]


def ssim(frames: np.ndarray, reference: np.ndarray) -> list[float]:
    """Per-frame SSIM (scikit-image, colour channels averaged) of uint8 frames against ``reference``."""
    from skimage.metrics import structural_similarity

    return [
        float(structural_similarity(f, r, channel_axis=-1, data_range=255))
        for f, r in zip(np.asarray(frames), np.asarray(reference))
    ]
