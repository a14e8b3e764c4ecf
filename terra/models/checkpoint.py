"""Opening a world-model checkpoint folder safely: its config read once, its weights checked before any load."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from terra.core.errors import TerraInputError, error_reason
from terra.models import LlamaActionConfig
from terra.tokenizer.tensors import check_floats

FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of the floating-point dtypes


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
        raise TerraInputError(f"world model {path} has no .safetensors weights; copy model.safetensors next to "
                              "config.json")
    try:
        config = LlamaActionConfig.from_dict(data)
        config.validate_architecture()
    except Exception as err:  # Transformers raises its own validation error types
        message = " ".join(line.strip() for line in str(err).strip().splitlines()[:2]) or type(err).__name__
        raise TerraInputError(f"world model config {config_file} is invalid ({message}); fix config.json") from None
    check_world_model_weights(folder, config)
    return config


def check_world_model_weights(folder: str | Path, config: LlamaActionConfig) -> None:
    """Check that the checkpoint's weights fit ``config`` (names, shapes, float dtypes) and are finite."""
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
    found: dict[str, tuple[tuple[int, ...], str, Path]] = {}  # name -> (shape, dtype, file)
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as weights:
                for key in weights.keys():
                    part = weights.get_slice(key)
                    found[key] = (tuple(part.get_shape()), part.get_dtype(), file)
        except Exception as err:  # safetensors raises its own error type for truncated or foreign files
            raise TerraInputError(
                f"world model weights {file} cannot be read ({error_reason(err)}); the file is truncated or not "
                "safetensors: download or copy it again"
            ) from None
    missing = sorted(set(expected) - set(found))
    wrong = sorted(k for k in expected if k in found and found[k][0] != expected[k])
    if missing or wrong:
        detail = (f"{len(missing)} missing, e.g. {missing[:2]}" if missing else
                  f"{len(wrong)} of the wrong shape, e.g. {wrong[0]}: {list(found[wrong[0]][0])} in the weights vs "
                  f"{list(expected[wrong[0]])} from config.json")
        raise TerraInputError(
            f"world model {folder}: the weights do not match config.json ({detail}); "
            "use the config.json that was saved with these weights"
        )
    integer = sorted(k for k in expected if found[k][1] not in FLOAT_DTYPES)
    if integer:
        key = integer[0]
        raise TerraInputError(f"world model weights {found[key][2]}: tensor {key} is {found[key][1]}, not floating "
                              f"point ({len(integer)} such tensors); the file is not a world model's weights")
    for file in files:  # every weight finite, one tensor in memory at a time (a NaN weight makes every rollout garbage)
        try:
            with safe_open(str(file), framework="pt") as weights:
                for key in (key for key in expected if found[key][2] == file):
                    check_floats(weights.get_tensor(key), f"world model weights {file}: tensor {key}",
                                 "the checkpoint is damaged or its training diverged: use another checkpoint")
        except TerraInputError:
            raise
        except Exception as err:  # a file cut short after its header
            raise TerraInputError(f"world model weights {file} cannot be read ({error_reason(err)}); the file is "
                                  "truncated: download or copy it again") from None
