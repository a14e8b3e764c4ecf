"""Opening a world-model checkpoint folder safely: its config read once, its weights checked without loading.

Every entry point calls :func:`read_world_model_config` before any backend loads the model, so a folder
that is not a Terra checkpoint, a truncated or foreign weight file, or a config.json that does not describe
the weights fails with one line (Transformers would silently re-initialise mismatched weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from terra.config.checks import TerraInputError
from terra.models import LlamaActionConfig


def read_world_model_config(path: str | Path) -> LlamaActionConfig:
    """The world model's config, parsed once from ``config.json``, after checking the weights fit it."""
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise TerraInputError(f"world model {path} has no config.json; point model.world_model at a checkpoint folder")
    try:
        data = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise TerraInputError(f"world model config {config_file} cannot be read ({err}); restore the file") from None
    if not isinstance(data, dict):
        data = {}
    missing = [k for k in ("num_image_patches", "vocab_size") if k not in data]
    if data.get("model_type") != "llama_action" or missing:
        raise TerraInputError(
            f"{config_file} is not a Terra world model config (model_type {data.get('model_type')!r}, "
            f"missing {missing}); use a llama_action checkpoint"
        )
    if not list(folder.glob("*.safetensors")):
        raise TerraInputError(f"world model {path} has no .safetensors weights; copy model.safetensors next to config.json")
    try:
        config = LlamaActionConfig.from_dict(data)
        config.validate_architecture()
    except Exception as err:  # Transformers raises its own validation error types
        message = " ".join(line.strip() for line in str(err).strip().splitlines()[:2]) or type(err).__name__
        raise TerraInputError(f"world model config {config_file} is invalid ({message}); fix config.json") from None
    check_world_model_weights(folder, config)
    return config


def check_world_model_weights(folder: str | Path, config: LlamaActionConfig) -> None:
    """Check, reading only the safetensors headers, that the checkpoint's weights fit ``config``.

    The model is built on the meta device for its expected names and shapes; no tensor is loaded.
    """
    folder = Path(folder)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        expected.pop("lm_head.weight", None)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted({folder / name for name in json.loads(index.read_text())["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise TerraInputError(
                f"{index} cannot be read ({type(err).__name__}); restore the checkpoint's index file"
            ) from None
    else:
        files = sorted(folder.glob("*.safetensors"))
    found: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as weights:
                for key in weights.keys():
                    found[key] = tuple(weights.get_slice(key).get_shape())
        except Exception as err:  # safetensors raises its own error type for truncated or foreign files
            raise TerraInputError(
                f"world model weights {file} cannot be read ({str(err).strip() or type(err).__name__}); "
                "the file is truncated or not safetensors: download or copy it again"
            ) from None
    missing = sorted(set(expected) - set(found))
    wrong = sorted(k for k in expected if k in found and found[k] != expected[k])
    if missing or wrong:
        detail = (f"{len(missing)} missing, e.g. {missing[:2]}" if missing else
                  f"{len(wrong)} of the wrong shape, e.g. {wrong[0]}: {list(found[wrong[0]])} in the weights vs "
                  f"{list(expected[wrong[0]])} from config.json")
        raise TerraInputError(
            f"world model {folder}: the weights do not match config.json ({detail}); "
            "use the config.json that was saved with these weights"
        )
