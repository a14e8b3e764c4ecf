"""The checkpoints shipped inside the package (``terra/assets/``): the demo world model and the tokenizer it was
trained with (MODEL_CARD.md), and the learned driver's weights (terra/closedloop/policies/learned.py). Found from here,
so code and configs reach them from any working folder; the configs through the resolvers :func:`register_resolvers`
registers (``conf/model/demo.yaml``, ``conf/tokenizer/demo.yaml``)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from terra.config.snapshot import snapshot_folder

ASSETS = Path(__file__).resolve().parents[1] / "assets"
DEMO_NAME = "demo"  # WorldModelPipeline.from_pretrained's name for the shipped demo model
DEMO = ASSETS / DEMO_NAME  # its folder: world_model/ and tokenizer/
LEARNED_DRIVER = ASSETS / "learned_driver" / "model.safetensors"  # scripts/experiments/train_learned_policy.py


def demo_checkpoints() -> tuple[Path, Path]:
    """The shipped demo model's ``(world_model, tokenizer)`` folders."""
    return DEMO / "world_model", DEMO / "tokenizer"


def register_resolvers() -> None:
    """Register the resolvers conf/ uses: ``${terra_asset:NAME}``, a path under ``terra/assets/``, and
    ``${terra_snapshot:FOLDER}``, a folder of the downloaded Terra snapshot ``terra_root``
    (:mod:`terra.config.snapshot`). Registering again replaces them with the same functions."""
    OmegaConf.register_new_resolver("terra_asset", lambda name: str(ASSETS / name), replace=True)
    OmegaConf.register_new_resolver("terra_snapshot", snapshot_folder, replace=True)
