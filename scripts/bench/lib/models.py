"""The model folders the parts run on: Terra's (random weights unless ``--model``) and a plain Llama of its shape.

Only ``config.json`` is written for random weights: vLLM initialises them itself (``load_format="dummy"``) and
the Transformers model is built directly on the device (:mod:`bench.lib.backends`). :func:`dummy_weights_model` makes
such a folder for the other scripts on vLLM too (scripts/bench/benchmark_sessions.py,
scripts/bench/benchmark_memory_table.py, :mod:`bench.lib.engine_steps`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Mapping

from transformers import AutoConfig, LlamaConfig, PretrainedConfig

from terra.contract.layout import TokenLayout
from terra.core.atomic import json_text, write_text
from terra.models.configuration_llama_action import LlamaActionConfig
from terra.models.presets import TERRA, TINY, with_window

# --tiny: TINY with Terra's 25-frame window, so the default frame counts fit one window as they do for Terra.
TINY_TERRA_WINDOW = with_window(TINY, TERRA["num_temporal_embeddings"])
DUMMY_WEIGHTS = {"load_format": "dummy"}  # vLLM's engine option: random weights of its own, no checkpoint read


def dummy_weights_model(folder: str | Path, config: PretrainedConfig | Mapping[str, Any]) -> dict[str, str]:
    """Make ``folder`` a model that vLLM runs on random weights: its ``config.json`` alone, so no checkpoint is
    written or read (seconds for Terra's 2 B shape). ``config``: a transformers config, written as ``save_pretrained``
    writes it, or a dict written as it is (the plain Llama's, :func:`write_model_configs`). Returns the engine options
    that load the folder (:data:`DUMMY_WEIGHTS`)."""
    text = json_text(config, indent=2) if isinstance(config, Mapping) else config.to_json_string()
    write_text(Path(folder) / "config.json", text)
    return dict(DUMMY_WEIGHTS)


def random_world_model(folder: str | Path, preset: Mapping[str, Any]) -> Path:
    """Save a world model of ``preset``'s shape with random bf16 weights (seed 0) at ``folder``, on the CPU: for the
    apps, whose checks read real weights (the process holds no GPU memory for it)."""
    import torch

    from terra.models import LlamaActionForCausalLM

    torch.manual_seed(0)
    LlamaActionForCausalLM._from_config(LlamaActionConfig(**preset), dtype=torch.bfloat16).save_pretrained(folder)
    return Path(folder)


def random_tokenizer(folder: str | Path, config: Mapping[str, Any]) -> Path:
    """Save an LFQ tokenizer of ``config`` (tokenizer/lfq.py) with random weights (seed 1) at ``folder``."""
    import torch

    from terra.tokenizer import LFQTokenizer

    torch.manual_seed(1)
    LFQTokenizer(config).save_pretrained(folder)
    return Path(folder)


def model_dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    """Folders of the Terra model and of the plain Llama of the same shape (config.json only when random)."""
    root = args.out / "models"
    return (Path(args.model) if args.model else root / "terra"), root / "plain_llama"


def write_model_configs(args: argparse.Namespace) -> None:
    """Write Terra's config (unless ``--model``) and the plain Llama's; weights are never written (the parts' workers
    load the folders with :data:`DUMMY_WEIGHTS`: :mod:`bench.lib.backends`)."""
    terra_dir, plain_dir = model_dirs(args)
    if args.model:
        config = AutoConfig.from_pretrained(args.model)
    else:
        config = LlamaActionConfig(**(TINY_TERRA_WINDOW if args.tiny else TERRA))
        dummy_weights_model(terra_dir, config)
    terra_only = set(LlamaActionConfig().to_dict()) - set(LlamaConfig().to_dict())
    plain = {k: v for k, v in config.to_dict().items() if k not in terra_only}
    plain.update(model_type="llama", architectures=["LlamaForCausalLM"])
    dummy_weights_model(plain_dir, plain)


def read_config(args: argparse.Namespace) -> LlamaActionConfig:
    """The config of the Terra model the parts run (written by :func:`write_model_configs`, or ``--model``'s)."""
    return AutoConfig.from_pretrained(model_dirs(args)[0])


def read_layout(args: argparse.Namespace) -> TokenLayout:
    """The token layout of the Terra model the parts run."""
    return TokenLayout.from_config(read_config(args))
