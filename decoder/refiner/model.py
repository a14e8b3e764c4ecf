"""Terra's video refiner built from diffusers modules: :class:`VideoRefiner` (networks, loading, saving, refine)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, AutoencoderKLTemporalDecoder, UNetSpatioTemporalConditionModel
from diffusers.models.embeddings import TimestepEmbedding
from diffusers.models.unets.unet_3d_blocks import MidBlockTemporalDecoder
from torch import nn

from terra.core.atomic import atomic_path
from terra.decoder.frames import images_to_uint8
from terra.decoder.refiner.checkpoint import WRAPPER_PREFIX, key_table, match_tensors, read_state_dict
from terra.decoder.refiner.config import DECODER_MID_RES_BLOCKS, UNET_RES_BLOCK_EPS, RefinerConfig
from terra.decoder.refiner.sampler import decode_windows, denoise, guidance_scales, plan_passes
from terra.tokenizer.base import ImageTokenizer


@dataclass
class RefinedVideo:
    """Frames of a refined video (uint8 ``[T, height, width, 3]``) and seconds per stage."""

    frames: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)


class VideoRefiner(nn.Module):
    """The refiner's networks (their published names: :mod:`terra.decoder.refiner.checkpoint`) and its sampling."""

    def __init__(self, config: RefinerConfig) -> None:
        super().__init__()
        self.config = config
        self.unet = UNetSpatioTemporalConditionModel(**config.unet_kwargs())
        for block in (*self.unet.down_blocks, self.unet.mid_block, *self.unet.up_blocks):
            for resnet in block.resnets:
                for part in (resnet.spatial_res_block, resnet.temporal_res_block):
                    part.norm1.eps = part.norm2.eps = UNET_RES_BLOCK_EPS
        width = config.unet_channels[0]
        self.cond_time_stack_embed = TimestepEmbedding(width, 4 * width)  # published, unused at inference
        self.cond_encoder = AutoencoderKL(**config.encoder_kwargs())
        self.temporal_vae = AutoencoderKLTemporalDecoder(**config.temporal_vae_kwargs())
        self.temporal_vae.quant_conv = nn.Identity()  # the published first stage has no quant_conv
        if config.vae_layers_per_block != DECODER_MID_RES_BLOCKS:  # diffusers sizes it by layers_per_block
            channels = config.vae_channels[-1]
            self.temporal_vae.decoder.mid_block = MidBlockTemporalDecoder(
                channels, channels, attention_head_dim=channels, num_layers=DECODER_MID_RES_BLOCKS)

    # ------------------------------------------------------------------------------------ loading
    @classmethod
    def from_published(cls, path: str | os.PathLike, config: RefinerConfig, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float32) -> "VideoRefiner":
        """Load Terra's ``refiner_model.pt`` (or a file in its format) built as ``config`` describes."""
        state = read_state_dict(path)
        with torch.device("meta"):
            refiner = cls(config)
        shapes = {k: v.shape for k, v in refiner.state_dict().items()}
        tensors = match_tensors(state, key_table(shapes, config), str(path))
        refiner.load_state_dict({k: v.reshape(shapes[k]) for k, v in tensors.items()}, strict=True, assign=True)
        return refiner.prepare(device, dtype)

    def save_published(self, path: str | os.PathLike) -> None:
        """Write the tensors under their published names as Terra's file holds them, atomically."""
        own = self.state_dict()
        table = key_table({k: v.shape for k, v in own.items()}, self.config)
        module = {WRAPPER_PREFIX + published: own[name].detach().reshape(shape).contiguous().cpu()
                  for published, (name, shape) in table.items()}
        with atomic_path(path) as tmp:
            torch.save({"module": module}, tmp)

    def prepare(self, device: str | torch.device, dtype: torch.dtype) -> "VideoRefiner":
        """Move to ``device``: UNet and encoder in ``dtype``, temporal decoder in float32."""
        self.eval().requires_grad_(False)
        self.to(device=device, dtype=dtype)
        self.temporal_vae.float()
        if self.config.channels_last:
            self.unet.to(memory_format=torch.channels_last)
            self.cond_encoder.to(memory_format=torch.channels_last)
        if self.config.compile:
            self.unet = torch.compile(self.unet, fullgraph=False, dynamic=False)
        return self

    @property
    def device(self) -> torch.device:
        return self.cond_encoder.device

    @property
    def dtype(self) -> torch.dtype:
        return self.cond_encoder.dtype

    # ------------------------------------------------------------------------------------ refining
    @torch.inference_mode()
    def refine(self, codes: torch.Tensor | np.ndarray, tokenizer: ImageTokenizer, seed: int = 0,
               progress: bool = False) -> RefinedVideo:
        """Codes ``[T, h, w]`` of a whole video (context frames included) → refined frames ``[T, H, W, 3]``."""
        config = self.config
        codes = tokenizer.check_codes(torch.as_tensor(np.asarray(codes) if not torch.is_tensor(codes) else codes))
        timings: dict[str, float] = {}
        with self._timed(timings, "token_decode_s"):
            images = self.decode_tokens(tokenizer, codes)
        with self._timed(timings, "cond_encode_s"):
            cond = self.encode_frames(images)
        generator = torch.Generator().manual_seed(int(seed))
        latents = []
        with self._timed(timings, "unet_s"):
            for start, end, drop in plan_passes(len(codes), config.num_frames, config.min_overlap):
                scales = guidance_scales(end - start, config.num_frames, config.min_guidance, config.max_guidance)
                window = cond[start:end]
                noise = torch.randn((1, *window.shape), generator=generator, dtype=torch.float32).to(window.device)
                uncond = None if config.guidance == "published" else torch.zeros_like(window)
                latents.append(denoise(self, noise, window, uncond, scales, progress)[0, drop:])
        with self._timed(timings, "temporal_decode_s"):
            frames = (self.decode_latents(torch.cat(latents)) if latents
                      else torch.zeros(0, 3, config.height, config.width))
        timings["total_s"] = sum(timings.values())
        return RefinedVideo(images_to_uint8(frames), timings)

    def decode_tokens(self, tokenizer: ImageTokenizer, codes: torch.Tensor) -> torch.Tensor:
        """Codes → tokenizer images, resized (bilinear) to the refiner's size and clamped, on the refiner's device."""
        size = (self.config.height, self.config.width)
        on_gpu = tokenizer.device.type == "cuda" and self.dtype != torch.float32
        out = []
        for chunk in codes.split(self.config.decode_batch):
            with torch.autocast("cuda", dtype=self.dtype, enabled=on_gpu):
                images = tokenizer.decode(chunk).float()
            images = F.interpolate(images, size=size, mode="bilinear", align_corners=False)
            out.append(images.clamp(-1, 1).to(self.device))
        return torch.cat(out) if out else torch.zeros(0, 3, *size, device=self.device)

    def encode_frames(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``[T, 3, H, W]`` → conditioning latents ``[T, C, h, w]`` (the encoder's distribution mode)."""
        layout = torch.channels_last if self.config.channels_last else torch.contiguous_format
        out = [self.cond_encoder.encode(chunk.to(self.dtype).contiguous(memory_format=layout)).latent_dist.mode()
               for chunk in images.split(self.config.decode_batch)]
        return torch.cat(out) if out else images.new_zeros(0, self.config.latent_channels, *self.config.latent_size)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Diffusion latents ``[T, C, h, w]`` → frames ``[T, 3, H, W]`` in [-1, 1] by the temporal decoder."""
        config = self.config
        z = latents.float() / config.scale_factor
        if config.decode_frames == 1:  # independent single-frame calls: batch them
            frames = [self.temporal_vae.decode(chunk, num_frames=1).sample for chunk in z.split(config.decode_batch)]
            return torch.cat(frames).clamp(-1, 1)
        frames: list[torch.Tensor] = []
        for start, end, blend in decode_windows(len(z), config.decode_frames, config.decode_overlap):
            out = list(self.temporal_vae.decode(z[start:end], num_frames=end - start).sample)
            for k in range(blend):
                frames[len(frames) - blend + k] = (frames[len(frames) - blend + k] + out[k]) / 2
            frames += out[blend:]
        return torch.stack(frames).clamp(-1, 1)

    @contextmanager
    def _timed(self, timings: dict[str, float], key: str) -> Iterator[None]:
        """Add the seconds of the block to ``timings[key]`` (waiting for the GPU first, so stages do not blur)."""
        device = self.device
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        yield
        sync()
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - start
