"""Terra's video refiner: codes of a whole video → a sharper, temporally consistent 384x640 video."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from terra.decoder.refiner.checkpoint import check_file
from terra.decoder.refiner.config import PRESETS, RefinerConfig, TERRA, TINY, preset
from terra.decoder.refiner.sampler import decode_windows, guidance_scales, plan_passes
from terra.core.device import auto_dtype, check_device, resolve_device
from terra.core.errors import TerraInputError

if TYPE_CHECKING:
    from terra.decoder.refiner.model import VideoRefiner

__all__ = ["PRESETS", "TERRA", "TINY", "RefinerConfig", "check_file", "check_refiner_device", "decode_windows",
           "guidance_scales", "load_refiner", "plan_passes", "preset"]


def check_refiner_device(config: RefinerConfig, device: torch.device, allow_cpu: bool = False) -> None:
    """Refuse Terra's full-size refiner off a GPU (hours per video on a CPU) unless ``allow_cpu``."""
    if device.type != "cuda" and config.unet_channels == TERRA.unet_channels and not allow_cpu:
        raise TerraInputError("the video refiner at Terra's size needs a CUDA GPU (about 5 min per video on an H100 in "
                              f"Terra's code; hours on {device.type}); run on a GPU, use decoder=tokenizer, or set "
                              "refiner.allow_cpu=true to run it here anyway")


def load_refiner(path: str | os.PathLike, config: RefinerConfig | str = "terra", device: str | None = "auto",
                 dtype: torch.dtype | str | None = "auto", allow_cpu: bool = False) -> "VideoRefiner":
    """Load a refiner file (Terra's ``refiner_model.pt`` or one in its format) on ``device``."""
    config = preset(config) if isinstance(config, str) else config
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
