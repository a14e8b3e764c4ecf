"""The checkpoints shipped inside the package: the demo world model and tokenizer, and the learned driver's weights."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from terra.config.snapshot import snapshot_folder

ASSETS = Path(__file__).resolve().parents[1] / "assets"
DEMO_NAME = "demo"  # WorldModelPipeline.from_pretrained's name for the shipped demo model
DEMO = ASSETS / DEMO_NAME  # its folder: world_model/ and tokenizer/
LEARNED_DRIVER = ASSETS / "learned_driver" / "model.safetensors"


def demo_checkpoints() -> tuple[Path, Path]:
    """The shipped demo model's ``(world_model, tokenizer)`` folders."""
    return DEMO / "world_model", DEMO / "tokenizer"


def register_resolvers() -> None:
    """Register ``${terra_asset:NAME}`` (a path under the package's assets) and ``${terra_snapshot:FOLDER}``."""
    OmegaConf.register_new_resolver("terra_asset", lambda name: str(ASSETS / name), replace=True)
    OmegaConf.register_new_resolver("terra_snapshot", snapshot_folder, replace=True)
