"""The end-to-end pipeline: tokenizer → generation backend → frames.

``WorldModelPipeline`` owns an image tokenizer and a :class:`~terra.generation.rollout.WorldModelBackend`; it encodes
context images, runs rollouts on whichever backend it was given (it never asks which), and decodes the
codes back to frames. Video files are written by :mod:`decoder`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from terra.generation.backends import create_backend, resolve_device
from terra.errors import TerraInputError
from terra.generation.rollout import FrameCallback, RolloutRequest, WorldModelBackend
from terra.generation.sampling import SamplingConfig


@dataclass
class RolloutResult:
    """Codes and frames of one finished rollout, context frames first."""

    request: RolloutRequest
    codes: np.ndarray  # [n_ctx + num_frames, h, w]
    frames: np.ndarray  # uint8 [n_ctx + num_frames, H, W, 3]
    num_context: int
    timings: dict[str, float] = field(default_factory=dict)


def read_world_model_config(path: str | Path) -> dict:
    """The world model's ``config.json`` as a dict; one clear error when the folder is not a checkpoint."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise TerraInputError(f"world model {path} has no config.json; point model.world_model at a checkpoint folder")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise TerraInputError(f"world model config {config_file} cannot be read ({err}); restore the file") from None
    missing = [k for k in ("num_image_patches", "vocab_size") if k not in config]
    if config.get("model_type") != "llama_action" or missing:
        raise TerraInputError(
            f"{config_file} is not a Terra world model config (model_type {config.get('model_type')!r}, "
            f"missing {missing}); use a llama_action checkpoint"
        )
    weights = list(Path(path).glob("*.safetensors"))
    if not weights:
        raise TerraInputError(f"world model {path} has no .safetensors weights; copy model.safetensors next to config.json")
    check_world_model_weights(path)
    return config


def check_world_model_weights(path: str | Path) -> None:
    """Check, without loading any tensor, that the checkpoint's weights are readable and fit its config.json.

    Reads only the safetensors headers and builds the model on the meta device, so truncated or foreign
    weight files and a config that does not describe the weights (missing layers, another hidden size) fail
    here with one line, before any backend loads the model (Transformers would re-initialise such weights).
    """
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    import terra.models  # noqa: F401  (registers llama_action with the Auto classes)

    folder = Path(path)
    try:
        config = AutoConfig.from_pretrained(str(folder))
    except Exception as err:  # transformers / huggingface_hub raise their own validation error types
        message = " ".join(line.strip() for line in str(err).strip().splitlines()[:2]) or type(err).__name__
        raise TerraInputError(
            f"world model config {folder / 'config.json'} is invalid ({message}); fix config.json"
        ) from None
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


def check_compatible(world_model_config: dict, tokenizer) -> None:
    """Raise when the tokenizer's grid or codebook does not fit the world model (checked before loading it)."""
    h, w = tokenizer.grid_shape
    patches = world_model_config["num_image_patches"]
    codebook = world_model_config.get("codebook_size") or world_model_config["vocab_size"] - 1
    if h * w != patches:
        raise TerraInputError(
            f"tokenizer grid {h}x{w} = {h * w} tokens per frame but the world model expects {patches}; "
            "pair the world model with the tokenizer it was trained with"
        )
    if tokenizer.codebook_size > codebook:
        raise TerraInputError(
            f"tokenizer codebook ({tokenizer.codebook_size} codes) is larger than the world model's image "
            f"codebook ({codebook}); pair the world model with the tokenizer it was trained with"
        )


class WorldModelPipeline:
    """Context images + actions → generated codes → frames, on any backend."""

    def __init__(self, tokenizer, backend: WorldModelBackend, device: str = "cpu", decode_batch_size: int = 16) -> None:
        self.tokenizer = tokenizer.to(device).eval()
        self.backend = backend
        self.device = device
        self.decode_batch_size = decode_batch_size

    @classmethod
    def from_pretrained(
        cls,
        world_model: str | Path,
        tokenizer: str | Path,
        backend: str = "auto",
        device: str = "auto",
        dtype: str = "auto",
        **backend_options,
    ) -> "WorldModelPipeline":
        """Load a tokenizer and a world model checkpoint, check they fit together, build the backend."""
        from tokenizer import load_tokenizer

        config = read_world_model_config(world_model)
        device = resolve_device(device)
        tok = load_tokenizer(str(tokenizer))
        check_compatible(config, tok)
        return cls(tok, create_backend(backend, world_model, device=device, dtype=dtype, **backend_options), device)

    @property
    def image_size(self) -> tuple[int, int]:
        return tuple(self.tokenizer.image_size)

    @torch.inference_mode()
    def encode(self, images: torch.Tensor) -> np.ndarray:
        """Images ``[N, 3, H, W]`` in [-1, 1] → codes ``[N, h, w]`` (int64)."""
        if isinstance(images, np.ndarray):
            images = torch.from_numpy(images)
        if not torch.is_tensor(images) or images.ndim != 4 or images.shape[1] != 3:
            shape = list(images.shape) if torch.is_tensor(images) else type(images).__name__
            raise TerraInputError(f"images must be a tensor [N, 3, H, W] in [-1, 1], got {shape}; "
                                  "load files with tokenizer.images.load_images")
        if not images.is_floating_point():
            raise TerraInputError(f"images have dtype {images.dtype}; give floats in [-1, 1] (pixels / 127.5 - 1), "
                                  "as tokenizer.images.load_images returns")
        if not bool(torch.isfinite(images).all()):
            raise TerraInputError("images hold NaN or inf; give finite floats in [-1, 1]")
        if images.numel() and float(images.abs().max()) > 1.01:
            raise TerraInputError(f"images hold values up to {float(images.abs().max()):g}, outside [-1, 1]; "
                                  "scale pixels as pixels / 127.5 - 1 (tokenizer.images.load_images does it)")
        if tuple(images.shape[-2:]) != self.image_size:
            raise TerraInputError(
                f"images are {tuple(images.shape[-2:])} but the tokenizer expects {self.image_size}; "
                "load them with tokenizer.images.load_images, which resizes and crops"
            )
        codes = [
            self.tokenizer.encode(images[i : i + self.decode_batch_size].to(self.device)).cpu()
            for i in range(0, len(images), self.decode_batch_size)
        ]
        return torch.cat(codes).numpy().astype(np.int64)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Codes ``[T, h, w]`` → uint8 frames ``[T, H, W, 3]``."""
        from decoder import codes_to_frames

        return codes_to_frames(self.tokenizer, codes, batch_size=self.decode_batch_size)

    def generate(
        self,
        requests: Sequence[RolloutRequest],
        sampling: SamplingConfig,
        progress: bool = True,
        on_frame: FrameCallback | None = None,
    ) -> list[RolloutResult]:
        """Run all rollouts together on the backend, then decode each to frames."""
        start = time.perf_counter()
        generated = self.backend.generate(requests, sampling, progress=progress, on_frame=on_frame)
        generate_s = time.perf_counter() - start
        grid = self.tokenizer.grid_shape
        results = []
        for request, new in zip(requests, generated):
            context = np.asarray(request.context).reshape(len(request.context), *grid)
            codes = np.concatenate([context, new.reshape(len(new), *grid)])
            t0 = time.perf_counter()
            frames = self.decode(codes)
            timings = {
                "generate_s": generate_s,
                "generate_s_per_frame": generate_s / max(1, sum(r.num_frames for r in requests)),
                "decode_s": time.perf_counter() - t0,
            }
            results.append(RolloutResult(request, codes, frames, len(context), timings))
        return results

    def close(self) -> None:
        """Release the backend (frees an engine's GPU memory)."""
        self.backend.close()
