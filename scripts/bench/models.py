"""The model folders the parts run on: Terra's (random weights unless ``--model``) and a plain Llama of its shape.

Only ``config.json`` is written for random weights: vLLM initialises them itself (``load_format="dummy"``) and
the Transformers model is built directly on the device (:mod:`bench.backends`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from transformers import AutoConfig, LlamaConfig

from terra.core.atomic import json_text, write_text
from terra.generation.layout import TokenLayout
from terra.models.configuration_llama_action import LlamaActionConfig
from terra.models.presets import TERRA, TINY, with_window

# --tiny: TINY with Terra's 25-frame window, so the default frame counts fit one window as they do for Terra.
TINY_TERRA_WINDOW = with_window(TINY, TERRA["num_temporal_embeddings"])


def model_dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    """Folders of the Terra model and of the plain Llama of the same shape (config.json only when random)."""
    root = args.out / "models"
    return (Path(args.model) if args.model else root / "terra"), root / "plain_llama"


def write_model_configs(args: argparse.Namespace) -> None:
    """Write Terra's config (unless ``--model``) and the plain Llama's; weights are never written."""
    terra_dir, plain_dir = model_dirs(args)
    if args.model:
        config = AutoConfig.from_pretrained(args.model)
    else:
        config = LlamaActionConfig(**(TINY_TERRA_WINDOW if args.tiny else TERRA))
        write_text(terra_dir / "config.json", config.to_json_string())
    terra_only = set(LlamaActionConfig().to_dict()) - set(LlamaConfig().to_dict())
    plain = {k: v for k, v in config.to_dict().items() if k not in terra_only}
    plain.update(model_type="llama", architectures=["LlamaForCausalLM"])
    write_text(plain_dir / "config.json", json_text(plain, indent=2))


def read_config(args: argparse.Namespace) -> LlamaActionConfig:
    """The config of the Terra model the parts run (written by :func:`write_model_configs`, or ``--model``'s)."""
    return AutoConfig.from_pretrained(model_dirs(args)[0])


def read_layout(args: argparse.Namespace) -> TokenLayout:
    """The token layout of the Terra model the parts run."""
    return TokenLayout.from_config(read_config(args))
