"""``decoding=refiner``: the ``refiner`` settings of a run (``conf/refiner/terra.yaml``) checked before any model
loads, and loaded once generation is done (the world model's memory is free by then).

``decoding=framewise`` (the default) decodes each frame with the tokenizer, at its size (Terra: 288x512);
``decoding=refiner`` refines the whole video with Terra's video refiner (:mod:`decoder.refiner`) at 384x640.
diffusers is imported only when a refiner is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch
from omegaconf import DictConfig, OmegaConf

from decoder.refiner import RefinerConfig, check_device, check_file, load_refiner, preset, resolve_device
from terra.errors import TerraInputError
from terra.snapshot import DOWNLOAD_HINT

if TYPE_CHECKING:
    from decoder.refiner.model import VideoRefiner

DECODINGS = ("framewise", "refiner")
SETTINGS = ("num_steps", "guidance", "arithmetic", "decode_batch", "channels_last", "compile")  # RefinerConfig fields a run sets


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


def check_decoding(decoding: Any, refiner: Mapping | DictConfig | None, device: str | torch.device,
                   terra_root: str | None = None) -> RefinerSettings | None:
    """None for ``framewise``; for ``refiner`` the checked :class:`RefinerSettings` (file present, device able).

    ``refiner`` holds the keys of ``conf/refiner/terra.yaml``; ``device`` is the run's device, used when
    ``refiner.device`` is null. Every problem raises one line (:class:`TerraInputError`).
    """
    if decoding not in DECODINGS:
        raise TerraInputError(f"decoding={decoding!r} is unknown; use decoding=framewise (the tokenizer's frames) "
                              "or decoding=refiner (Terra's video refiner, GPU)")
    if decoding == "framewise":
        return None
    node = OmegaConf.to_container(refiner, resolve=True) if OmegaConf.is_config(refiner) else dict(refiner or {})
    path = node.get("path")
    if path is None:
        where = "" if terra_root is None else f" (terra_root={terra_root} gives none)"
        raise TerraInputError(f"decoding=refiner needs Terra's refiner weights{where}: add terra_root=/path/to/Terra "
                              f"({DOWNLOAD_HINT}) or refiner.path=/path/to/refiner_model.pt")
    config = preset(str(node.get("preset", "terra"))).replace(**{k: node[k] for k in SETTINGS if k in node})
    device = resolve_device(node.get("device") or device)
    allow_cpu = bool(node.get("allow_cpu", False))
    check_device(config, device, allow_cpu)
    return RefinerSettings(check_file(path), config, device, str(node.get("dtype", "auto")), allow_cpu)


def check_run_decoding(cfg: DictConfig, device: str | torch.device) -> RefinerSettings | None:
    """:func:`check_decoding` of a Hydra run config (``decoding``, ``refiner``, ``terra_root``)."""
    return check_decoding(cfg.get("decoding", "framewise"), cfg.get("refiner"), device, cfg.get("terra_root"))
