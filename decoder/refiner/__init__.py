"""Terra's video refiner: codes of a whole video → a sharper, temporally consistent 384x640 video.

The second decoding method of Terra's published generation (``--decoding_method video_refiner``): a Stable
Video Diffusion network (via Vista) conditioned on the tokenizer's frames, 25 frames per pass, about 5 minutes
per sample on an H100 in Terra's code. Built from diffusers' modules (``UNetSpatioTemporalConditionModel``,
``AutoencoderKL``, ``AutoencoderKLTemporalDecoder``); this package adds what Terra does beyond them: the
conditioning path, the Euler sampler in Terra's dtypes, per-frame guidance, the names of ``refiner_model.pt`` and
overlapping passes.

    from terra.decoder.refiner import load_refiner
    refiner = load_refiner("Terra/video_refiner/refiner_model.pt", device="cuda")   # bf16 on a GPU
    video = refiner.refine(codes, tokenizer, seed=0)   # codes [T, 18, 32] → video.frames uint8 [T, 384, 640, 3]

Importing this package does not import diffusers; :func:`load_refiner` does. Modules: ``config`` (sizes,
recipe, presets), ``plan`` (passes, guidance ramp, decoder windows), ``keys`` and ``checkpoint`` (the published
file), ``sampler`` (one pass), ``model`` (:class:`~terra.decoder.refiner.model.VideoRefiner`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from terra.decoder.refiner.checkpoint import check_file
from terra.decoder.refiner.config import PRESETS, RefinerConfig, TERRA, TINY, preset
from terra.decoder.refiner.plan import decode_windows, guidance_scales, plan_passes
from terra.core.device import auto_dtype, check_device, resolve_device
from terra.core.errors import TerraInputError

if TYPE_CHECKING:
    from terra.decoder.refiner.model import VideoRefiner

__all__ = ["PRESETS", "TERRA", "TINY", "RefinerConfig", "check_file", "check_refiner_device", "decode_windows",
           "guidance_scales", "load_refiner", "plan_passes", "preset"]


def check_refiner_device(config: RefinerConfig, device: torch.device, allow_cpu: bool = False) -> None:
    """Refuse Terra's full-size refiner off a GPU (hours per video on a CPU) unless ``allow_cpu``; ``device`` is
    resolved (terra/core/device.py: whether it exists is checked there)."""
    if device.type != "cuda" and config.unet_channels == TERRA.unet_channels and not allow_cpu:
        raise TerraInputError("the video refiner at Terra's size needs a CUDA GPU (about 5 min per video on an H100 in "
                              f"Terra's code; hours on {device.type}); run on a GPU, use decoder=tokenizer, or set "
                              "refiner.allow_cpu=true to run it here anyway")


def load_refiner(path: str | os.PathLike, config: RefinerConfig | str = "terra", device: str | None = "auto",
                 dtype: torch.dtype | str | None = "auto", allow_cpu: bool = False) -> "VideoRefiner":
    """Load a refiner file (Terra's ``refiner_model.pt`` or one in its format) on ``device``.

    ``config``: a :class:`RefinerConfig` or a preset name; ``dtype`` auto = bf16 on a GPU, float32 on a CPU.
    The file and the device are checked before diffusers is imported or anything is read.
    """
    config = preset(config) if isinstance(config, str) else config
    config.check()
    device = torch.device(resolve_device(check_device("auto" if device is None else str(device))))
    check_refiner_device(config, device, allow_cpu)
    path = check_file(path)
    if dtype is None or isinstance(dtype, str):
        dtype = auto_dtype(device.type, dtype or "auto")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise TerraInputError(f"refiner dtype {dtype!r} is unknown; use auto, bfloat16 or float32")
        dtype = getattr(torch, dtype)
    from terra.decoder.refiner.model import VideoRefiner  # diffusers is imported only here

    return VideoRefiner.from_published(path, config, device, dtype)
