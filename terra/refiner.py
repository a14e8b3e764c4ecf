"""``decoder=refiner``: the ``refiner`` settings of a run checked before any model loads, and loaded once generation
is done (the world model's memory is free by then)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from terra.config.snapshot import DOWNLOAD_HINT
from terra.config.spec import RunSpec
from terra.core.device import check_device, resolve_device
from terra.core.errors import TerraInputError
from terra.decoder.refiner import RefinerConfig, check_file, check_refiner_device, load_refiner, preset

if TYPE_CHECKING:
    from terra.decoder.refiner.model import VideoRefiner

SETTINGS = ("num_steps", "guidance", "arithmetic", "decode_batch", "channels_last",
            "compile")  # the RefinerConfig fields a run sets


@dataclass(frozen=True)
class RefinerSettings:
    """A checked refiner request: which file, built how, on which device."""

    path: Path
    config: RefinerConfig
    device: torch.device
    dtype: str
    allow_cpu: bool

    def load(self) -> "VideoRefiner":
        """Load the refiner (imports diffusers)."""
        return load_refiner(self.path, self.config, self.device, self.dtype, self.allow_cpu)


def check_decoder(spec: RunSpec) -> RefinerSettings | None:
    """The refiner's settings for a caller without a resolved run, its device checked and resolved."""
    if spec.decoder == "tokenizer":
        return None
    return refiner_settings(spec, resolve_device(check_device(spec.refiner.get("device") or spec.device)))


def refiner_settings(spec: RunSpec, device: str | None) -> RefinerSettings | None:
    """None for ``decoder=tokenizer``."""
    if spec.decoder == "tokenizer":
        return None
    node = spec.refiner
    path, name = node.get("path"), str(node.get("preset", "terra"))
    config = preset(name).replace(**{k: node[k] for k in SETTINGS if k in node})
    if path is None and name != "terra":  # a toy size: no download of Terra's
        raise TerraInputError(f"decoder=refiner with refiner.preset={name} needs a refiner file of that "
                              "size: refiner.path=/path/to/refiner_model.pt (random weights for a test: "
                              "terra.decoder.refiner.model's VideoRefiner(TINY).save_published(path))")
    if path is None:
        where = "" if spec.terra_root is None else f" (terra_root={spec.terra_root} gives none)"
        raise TerraInputError(f"decoder=refiner needs Terra's refiner weights{where}: add terra_root=/path/to/Terra "
                              f"({DOWNLOAD_HINT}) or refiner.path=/path/to/refiner_model.pt")
    on, allow_cpu = torch.device(device), bool(node.get("allow_cpu", False))
    check_refiner_device(config, on, allow_cpu)
    return RefinerSettings(check_file(path), config, on, str(node.get("dtype", "auto")), allow_cpu)
