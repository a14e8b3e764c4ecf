"""Pure arithmetic of a refinement, as Terra's ``video_refiner_decode`` and Vista's ``decode_first_stage`` do it:
which frames each pass covers, the per-frame guidance scale, the temporal decoder's windows."""

from __future__ import annotations

import torch


def plan_passes(num_frames: int, window: int, min_overlap: int) -> list[tuple[int, int, int]]:
    """``(start, end, drop)`` per pass over a video of ``num_frames`` frames, ``window`` frames per pass."""
    if num_frames <= window:
        return [(0, num_frames, 0)]
    passes = [(0, window, 0)]
    while passes[-1][1] < num_frames:
        end = passes[-1][1]
        start = min(end - min_overlap, num_frames - window)
        passes.append((start, start + window, end - start))
    return passes


def guidance_scales(num_frames: int, window: int, min_scale: float, max_scale: float) -> torch.Tensor:
    """Per-frame guidance scale of a pass (float32 ``[num_frames]``): the head of ``linspace(min, max, window)``."""
    return torch.linspace(min_scale, max_scale, window, dtype=torch.float32)[:num_frames]


def decode_windows(num_frames: int, frames_per_call: int, overlap: int) -> list[tuple[int, int, int]]:
    """``(start, end, blend)`` per temporal-decoder call over ``num_frames`` latents."""
    if frames_per_call <= overlap:
        return [(s, min(s + frames_per_call, num_frames), 0) for s in range(0, num_frames, frames_per_call)]
    if num_frames <= overlap:
        return [(0, num_frames, 0)]
    step = frames_per_call - overlap
    return [(s - overlap, min(s + step, num_frames), overlap if s > overlap else 0)
            for s in range(overlap, num_frames, step)]
