"""A refinement's passes, guidance and decoder windows, and Terra's Euler EDM sampler for one pass."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from tqdm.auto import tqdm

from terra.core.progress import shows_bars
from terra.decoder.refiner.config import RefinerConfig

if TYPE_CHECKING:
    from terra.decoder.refiner.model import VideoRefiner

Predictor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sigma_schedule(config: RefinerConfig) -> torch.Tensor:
    """The pass's sigmas, bf16 ``[num_steps + 1]`` ending in 0: EDM's ramp in float32 on the CPU, then bf16."""
    ramp = torch.linspace(0, 1, config.num_steps, dtype=torch.float32)
    low, high = config.sigma_min ** (1 / config.rho), config.sigma_max ** (1 / config.rho)
    sigmas = (high + ramp * (low - high)) ** config.rho
    return torch.cat([sigmas, sigmas.new_zeros(1)]).bfloat16()


def scalings(sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``c_skip, c_out, c_in, c_noise`` of a bf16 sigma, in float32 (both arithmetics)."""
    s = sigma.float()
    variance = s**2 + 1.0
    root = variance.sqrt()
    return 1.0 / variance, -s / root, 1.0 / root, 0.25 * s.log()


def initial_latents(noise: torch.Tensor, sigma: torch.Tensor, arithmetic: str) -> torch.Tensor:
    """Unit-variance ``noise`` scaled to the first sigma (float32 result; bf16 values under ``published``)."""
    scale = (sigma.float() ** 2 + 1.0).sqrt()
    if arithmetic == "published":
        return (noise.bfloat16() * scale.bfloat16()).float()
    return noise * scale


def euler_step(x: torch.Tensor, denoised: torch.Tensor, sigma: torch.Tensor, next_sigma: torch.Tensor,
               arithmetic: str) -> torch.Tensor:
    """``x + dt * (x - denoised) / sigma`` in float32; ``dt = next_sigma - sigma`` is bf16 under ``published``."""
    dt = next_sigma - sigma if arithmetic == "published" else next_sigma.float() - sigma.float()
    return x + dt.float() * ((x - denoised) / sigma.float())


def conditioning_vector(config: RefinerConfig, batch: int, device: torch.device) -> torch.Tensor:
    """``added_time_ids`` ``[batch, 3]``: cond_aug, fps_id, motion_bucket_id (the published embedders' order)."""
    values = torch.tensor([[config.cond_aug, config.fps_id, config.motion_bucket_id]], dtype=torch.float32)
    return values.to(device).expand(batch, 3)


def unet_predictor(refiner: "VideoRefiner", cond: torch.Tensor, uncond: torch.Tensor | None) -> Predictor:
    """``(x·c_in [1, n, C, h, w], c_noise) → v``: ``cond`` alone when ``uncond`` is None, else both in one batch."""
    config, unet, dtype = refiner.config, refiner.unet, refiner.dtype
    branches = (cond[None] if uncond is None else torch.stack([uncond, cond])).to(dtype)
    batch = len(branches)
    context = torch.zeros(batch, 1, config.context_dim, device=cond.device, dtype=dtype)
    vector = conditioning_vector(config, batch, cond.device)

    def predict(x_in: torch.Tensor, c_noise: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x_in.to(dtype).expand(batch, *x_in.shape[1:]), branches], dim=2)
        return unet(x, c_noise, encoder_hidden_states=context, added_time_ids=vector, return_dict=False)[0]

    return predict


def denoise(refiner: "VideoRefiner", noise: torch.Tensor, cond: torch.Tensor, uncond: torch.Tensor | None,
            scales: torch.Tensor, progress: bool = False) -> torch.Tensor:
    """Euler sampling from unit-variance ``noise [1, n, C, h, w]`` → float32 latents; branches mixed by ``scales``."""
    config = refiner.config
    predict = unet_predictor(refiner, cond, uncond)
    scales = scales.to(cond.device).view(1, -1, 1, 1, 1)
    sigmas = sigma_schedule(config)
    x = initial_latents(noise, sigmas[0], config.arithmetic)
    for i in tqdm(range(config.num_steps), desc="refiner steps", disable=not shows_bars(progress), leave=False):
        c_skip, c_out, c_in, c_noise = scalings(sigmas[i])
        denoised = predict(x * c_in, c_noise).float() * c_out + x * c_skip
        if len(denoised) == 2:
            denoised = denoised[:1] + scales * (denoised[1:] - denoised[:1])
        x = euler_step(x, denoised, sigmas[i], sigmas[i + 1], config.arithmetic)
    return x


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
