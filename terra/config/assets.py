"""The checkpoints shipped inside the package (``terra/assets/``): the demo world model and the tokenizer it was
trained with (MODEL_CARD.md). Found from here, so code and configs reach them from any working folder."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "assets"
DEMO = "demo"  # WorldModelPipeline.from_pretrained's name for the shipped demo model


def demo_checkpoints() -> tuple[Path, Path]:
    """The shipped demo model's ``(world_model, tokenizer)`` folders."""
    return ASSETS / DEMO / "world_model", ASSETS / DEMO / "tokenizer"
