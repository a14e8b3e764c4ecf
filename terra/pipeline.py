"""The end-to-end pipeline: tokenizer → generation backend → frames.

``WorldModelPipeline`` owns an image tokenizer and a :class:`~terra.generation.rollout.WorldModelBackend`; it encodes
context images, runs rollouts on whichever backend it was given (it never asks which), and decodes the
codes back to frames. Video files are written by :mod:`decoder`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from decoder import codes_to_frames
from terra.errors import TerraInputError
from terra.generation.backends import create_backend, resolve_device
from terra.generation.rollout import FrameCallback, RolloutRequest, WorldModelBackend
from terra.generation.sampling import SamplingConfig
from terra.models import LlamaActionConfig
from terra.models.checkpoint import read_world_model_config
from tokenizer import ImageTokenizer, load_tokenizer

if TYPE_CHECKING:
    from decoder.refiner.model import VideoRefiner


@dataclass
class RolloutResult:
    """Codes and frames of one finished rollout, context frames first."""

    request: RolloutRequest
    codes: np.ndarray  # [n_ctx + num_frames, h, w]
    frames: np.ndarray  # uint8 [n_ctx + num_frames, H, W, 3]
    num_context: int
    timings: dict[str, float] = field(default_factory=dict)


def check_compatible(world_model_config: LlamaActionConfig, tokenizer) -> None:
    """Raise when the tokenizer's grid or codebook does not fit the world model (checked before loading it)."""
    h, w = tokenizer.grid_shape
    patches = world_model_config.num_image_patches
    codebook = world_model_config.codebook_size
    if h * w != patches:
        raise TerraInputError(
            f"tokenizer grid {h}x{w} = {h * w} tokens per frame but the world model expects {patches}; "
            "pair the world model with the tokenizer it was trained with"
        )
    if tokenizer.codebook_size != codebook:  # smaller: generated codes beyond it could not be decoded
        relation = "larger" if tokenizer.codebook_size > codebook else "smaller"
        raise TerraInputError(
            f"tokenizer codebook ({tokenizer.codebook_size} codes) is {relation} than the world model's image "
            f"codebook ({codebook}); pair the world model with the tokenizer it was trained with"
        )


class WorldModelPipeline:
    """Context images + actions → generated codes → frames, on any backend."""

    def __init__(self, tokenizer, backend: WorldModelBackend, device: str = "cpu", decode_batch_size: int = 16) -> None:
        self.tokenizer = tokenizer.to(device).eval()
        self.backend = backend
        self.device = device
        self.decode_batch_size = decode_batch_size
        # Batch writers, sessions and the server call encode/decode from several threads; one tokenizer call at a
        # time keeps its activations to one batch beside a vLLM engine that holds most of the GPU (without it, four
        # writer threads decoding 288x512 frames at once ran the H100 out of memory: BENCHMARKS.md).
        self._tokenizer_lock = threading.Lock()

    @classmethod
    def from_pretrained(
        cls,
        world_model: str | Path,
        tokenizer: str | Path | ImageTokenizer,
        backend: str = "auto",
        device: str = "auto",
        dtype: str = "auto",
        config: LlamaActionConfig | None = None,
        zero_embed_code_0: bool = False,
        **backend_options,
    ) -> "WorldModelPipeline":
        """Load a tokenizer (or take a loaded one) and a world model checkpoint, check they fit, build the backend.

        ``config`` is the world model's config when the caller has already read it
        (:func:`~terra.models.checkpoint.read_world_model_config`), so config.json is parsed once per run.
        ``zero_embed_code_0`` reproduces Terra's vLLM port, which embeds image code 0 as zeros
        (:mod:`terra.models.configuration_llama_action`); off, code 0 is an ordinary code.
        """
        config = config or read_world_model_config(world_model)
        config.zero_embed_code_0 = bool(zero_embed_code_0)
        device = resolve_device(device)
        tok = tokenizer if isinstance(tokenizer, ImageTokenizer) else load_tokenizer(str(tokenizer))
        check_compatible(config, tok)
        backend = create_backend(backend, world_model, device=device, dtype=dtype, config=config, **backend_options)
        return cls(tok, backend, device)

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
        with self._tokenizer_lock:
            codes = [
                self.tokenizer.encode(images[i : i + self.decode_batch_size].to(self.device)).cpu()
                for i in range(0, len(images), self.decode_batch_size)
            ]
        return torch.cat(codes).numpy().astype(np.int64)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Codes ``[T, h, w]`` → uint8 frames ``[T, H, W, 3]``."""
        with self._tokenizer_lock:
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

    def refine(self, results: Sequence[RolloutResult], refiner: "VideoRefiner",
               progress: bool = False) -> list[RolloutResult]:
        """Replace each result's frames by Terra's video refiner's (``decoding=refiner``: 384x640), seeded with its
        request's seed (0 when it has none); ``timings`` gain the refiner's stages (``refine_*``). See
        :mod:`decoder.refiner`."""
        for result in results:
            seed = result.request.seed or 0
            video = refiner.refine(result.codes, self.tokenizer, seed=seed, progress=progress)
            result.frames = video.frames
            result.timings.update({f"refine_{key}": value for key, value in video.timings.items()})
        return list(results)

    def close(self) -> None:
        """Release the backend (frees an engine's GPU memory)."""
        self.backend.close()
