"""One refinement pass: diffusers' EDM Euler scheduler over the spatio-temporal UNet, with Terra's conditioning.

Terra's sampler (Vista's ``EulerEDMSampler`` + ``Denoiser`` with ``VScalingWithEDMcNoise``) is diffusers'
:class:`~diffusers.EDMEulerScheduler` with ``sigma_data=1``: c_in = 1/sqrt(s²+1), c_skip = 1/(s²+1),
c_out = -s/sqrt(s²+1) (v-prediction), c_noise = log(s)/4, Karras/EDM sigmas, a final sigma of 0, no churn.
Terra casts its sigmas to bf16 (``prepare_sampling_loop``); the schedule here is rounded the same way, on any
device, so CPU and GPU runs share it. The UNet gets the noisy latent (scaled by c_in) with the conditioning
latents concatenated on channels, a zero cross-attention context ``[B, 1, context_dim]``, and the vector of
three sinusoidal embeddings in the published conditioner's order: cond_aug, fps_id, motion_bucket_id.

Guidance (``config.guidance``):

* ``published``: Terra's ``generate.py`` builds the unconditional inputs with ``force_uc_zero_embeddings=[]``,
  so they equal the conditional ones; LinearPredictionGuider's ``x_u + scale * (x_c - x_u)`` is then ``x_c``
  whatever the scale. One UNet branch gives that exactly, at half the cost of two.
* ``zero_frames``: classifier-free guidance as SVD trains for it, the unconditional branch with zeroed
  conditioning latents; both branches go through one batched UNet call, and the per-frame scale applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from diffusers import EDMEulerScheduler
from tqdm.auto import tqdm

from decoder.refiner.config import RefinerConfig

if TYPE_CHECKING:
    from decoder.refiner.model import VideoRefiner


def make_scheduler(config: RefinerConfig) -> EDMEulerScheduler:
    """The pass's scheduler, timesteps set, sigmas and noise conditioning rounded to bf16 as Terra's sampler."""
    scheduler = EDMEulerScheduler(sigma_min=config.sigma_min, sigma_max=config.sigma_max, sigma_data=1.0,
                                  sigma_schedule="karras", rho=config.rho, prediction_type="v_prediction",
                                  final_sigmas_type="zero")
    scheduler.set_timesteps(config.num_steps)
    scheduler.sigmas = scheduler.sigmas.to(torch.bfloat16).float()
    scheduler.timesteps = scheduler.precondition_noise(scheduler.sigmas[:-1]).to(torch.bfloat16).float()
    scheduler.set_begin_index(0)
    return scheduler


def conditioning_vector(config: RefinerConfig, batch: int, device: torch.device) -> torch.Tensor:
    """``added_time_ids`` ``[batch, 3]``: cond_aug, fps_id, motion_bucket_id (the published embedders' order)."""
    values = torch.tensor([[config.cond_aug, config.fps_id, config.motion_bucket_id]], dtype=torch.float32)
    return values.to(device).expand(batch, 3)


def sample_pass(refiner: "VideoRefiner", cond: torch.Tensor, scales: torch.Tensor, generator: torch.Generator,
                progress: bool = False) -> torch.Tensor:
    """Conditioning latents ``[n, C, h, w]`` of one pass → its sampled latents (float32, same shape).

    The initial noise is drawn in float32 on the CPU from ``generator`` (reproducible on any device).
    """
    noise = torch.randn((1, *cond.shape), generator=generator, dtype=torch.float32).to(cond.device)
    uncond = None if refiner.config.guidance == "published" else torch.zeros_like(cond)
    return denoise(refiner, noise, cond, uncond, scales, progress)[0]


def denoise(refiner: "VideoRefiner", noise: torch.Tensor, cond: torch.Tensor, uncond: torch.Tensor | None,
            scales: torch.Tensor, progress: bool = False) -> torch.Tensor:
    """Euler sampling from ``noise`` ``[1, n, C, h, w]`` (unit variance); ``uncond`` None runs one branch,
    otherwise both branches in one UNet batch, combined per frame as ``v_u + scales * (v_c - v_u)``."""
    config, unet, dtype = refiner.config, refiner.unet, refiner.dtype
    scheduler = make_scheduler(config)
    latents = noise * scheduler.init_noise_sigma
    branches = cond[None] if uncond is None else torch.stack([uncond, cond])
    batch = len(branches)
    branches = branches.to(dtype)
    context = torch.zeros(batch, 1, config.context_dim, device=cond.device, dtype=dtype)
    vector = conditioning_vector(config, batch, cond.device)
    scales = scales.to(cond.device).view(1, -1, 1, 1, 1)
    for t in tqdm(scheduler.timesteps, desc="refiner steps", disable=not progress, leave=False):
        x = scheduler.scale_model_input(latents, t).to(dtype)
        x = torch.cat([x.expand(batch, *x.shape[1:]), branches], dim=2)
        v = unet(x, t, encoder_hidden_states=context, added_time_ids=vector, return_dict=False)[0].float()
        if batch == 2:
            v_uncond, v_cond = v.chunk(2)
            v = v_uncond + scales * (v_cond - v_uncond)
        latents = scheduler.step(v, t, latents).prev_sample
    return latents
