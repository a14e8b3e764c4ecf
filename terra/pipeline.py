"""The end-to-end pipeline: tokenizer → generation backend → frames."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import torch

from terra.config.assets import DEMO_NAME, demo_checkpoints
from terra.config.backend import DEFAULT_THREADS, DTYPES, check_backend, check_num_threads, resolve_backend
from terra.config.checks import check_choice, check_flag
from terra.config.memory import FULL_DECODE_PIXELS
from terra.config.sampling import SamplingConfig
from terra.config.spec import RunSpec
from terra.core.device import check_device
from terra.core.errors import TerraInputError
from terra.core.progress import announce
from terra.decoder import codes_to_frames
from terra.generation.backends import build_backend
from terra.generation.pass_stats import PassStats
from terra.generation.rollout import FrameCallback, RolloutRequest, WorldModelBackend
from terra.models import LlamaActionConfig
from terra.run import ResolvedRun, resolve_run
from terra.tokenizer import ImageTokenizer, load_tokenizer
from terra.vllm.plugin import check_vllm_plugin

if TYPE_CHECKING:
    from terra.decoder.refiner.model import VideoRefiner


@dataclass
class RolloutResult:
    """Codes and frames of one finished rollout, context frames first."""

    request: RolloutRequest
    codes: np.ndarray  # [n_ctx + num_frames, h, w]
    frames: np.ndarray | None  # uint8 [n_ctx + num_frames, H, W, 3]; None until decoded (generate(decode=False))
    num_context: int
    timings: dict[str, float] = field(default_factory=dict)
    sampling: SamplingConfig | None = None  # as it ran (decoding=auto resolved)
    pass_stats: PassStats | None = None  # forward passes of the generated frames

    def pass_record(self) -> dict:
        """The forward passes of the generated frames, for a sidecar."""
        return (self.pass_stats or PassStats()).as_dict(self.sampling)


def actor_spec(spec: RunSpec, gpus: Sequence[str]) -> RunSpec:
    """The run spec of a Ray actor on the GPUs Ray gave it (``gpus``; none on a CPU actor)."""
    device = "cuda" if gpus else ("cpu" if spec.device == "auto" else spec.device)
    backend = resolve_backend(spec.backend, device)
    options = dict(spec.backend_options)
    if backend == "vllm":
        check_vllm_plugin()
        if int(options.get("tensor_parallel_size", 1) or 1) > 1:
            options.setdefault("distributed_executor_backend", "mp")
    return spec.replace(device=device, backend=backend, backend_options=options)


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


def _pretrained_paths(world_model: str | Path, tokenizer: str | Path | ImageTokenizer | None,
                      ) -> tuple[str, str | Path | ImageTokenizer]:
    """``world_model`` and ``tokenizer`` as folders (or the loaded tokenizer)."""
    if str(world_model) == DEMO_NAME:
        demo_model, demo_tokenizer = demo_checkpoints()
        return str(demo_model), demo_tokenizer if tokenizer is None else tokenizer
    folder = Path(world_model).expanduser()
    if not folder.is_dir():
        name = str(world_model)
        hub = "/" in name and not name.startswith(("/", ".", "~")) and len(Path(name).parts) == 2
        hint = (f"it looks like a Hugging Face repo id: download it first, e.g. `hf download {name} --local-dir "
                f"{Path(name).name}`, and pass the world model's folder (Terra: {Path(name).name}/world_model)"
                if hub else "pass a checkpoint folder (config.json + safetensors)")
        raise TerraInputError(f"world_model={name!r} is not a folder here; from_pretrained takes {DEMO_NAME!r} (the "
                              f"shipped demo model) or a local checkpoint folder, and downloads nothing: {hint}")
    if tokenizer is None:
        raise TerraInputError(f"from_pretrained({str(world_model)!r}) needs the tokenizer the world model was trained "
                              "with: tokenizer=its folder (Terra v1: Terra/lfq_tokenizer_B_256) or a loaded tokenizer")
    return str(folder), tokenizer


class WorldModelPipeline:
    """Context images + actions → generated codes → frames, on any backend."""

    def __init__(self, tokenizer, backend: WorldModelBackend, device: str = "cpu",
                 tokenizer_batch_size: int | None = None, engine_options: Mapping[str, Any] | None = None,
                 tokenizer_pixels: int = FULL_DECODE_PIXELS) -> None:
        self.tokenizer = tokenizer.to(device).eval()
        self.backend = backend
        # the options the backend was built with: what a run records
        self.engine_options = dict(engine_options or {})
        self.device = device
        # frames per tokenizer call: as many whole frames as ``tokenizer_pixels`` hold, at least one; on the CPU one
        # (no slower, and a frame's pixels then do not depend on the frames that share its call)
        frame = int(tokenizer.image_size[0]) * int(tokenizer.image_size[1])
        self.tokenizer_batch_size = tokenizer_batch_size or (1 if str(device) == "cpu" else
                                                             max(1, tokenizer_pixels // max(1, frame)))
        # one tokenizer call at a time across threads, so its activations fit beside a vLLM engine
        self._tokenizer_lock = threading.Lock()
        self._refiner_lock = threading.Lock()

    @classmethod
    def from_run(cls, run: ResolvedRun, tokenizer: ImageTokenizer | None = None) -> "WorldModelPipeline":
        """The pipeline of a resolved run: the tokenizer (or ``tokenizer``) and the world model on the run's backend."""
        spec = run.spec
        tok = tokenizer or load_tokenizer(spec.tokenizer)
        check_compatible(run.model, tok)
        if spec.backend == "vllm":  # the slow part of a start, said before it
            how_long = "1-5 min on a CPU" if spec.device == "cpu" else "about 1-1.5 min on a GPU, CUDA graphs captured"
            announce(f"terra: starting vLLM's engine, the slow part of the start ({how_long}) ...")
        backend = build_backend(run)
        return cls(tok, backend, spec.device, engine_options=run.engine_options, tokenizer_pixels=run.tokenizer_pixels)

    @classmethod
    def from_pretrained(
        cls,
        world_model: str | Path = DEMO_NAME,
        tokenizer: str | Path | ImageTokenizer | None = None,
        backend: str = "auto",
        device: str = "auto",
        dtype: str = "auto",
        config: LlamaActionConfig | None = None,
        zero_embed_code_0: bool = False,
        decoding: str = "auto",
        draft_tokens: int | str = "auto",
        num_threads: int | str | None = DEFAULT_THREADS,
        **backend_options,
    ) -> "WorldModelPipeline":
        """Load a tokenizer (or take a loaded one) and a world-model checkpoint, check they fit, build the backend."""
        world_model, tokenizer = _pretrained_paths(world_model, tokenizer)
        backend, options = check_backend(backend, backend_options)
        spec = RunSpec(str(world_model), "" if isinstance(tokenizer, ImageTokenizer) else str(tokenizer),
                       backend=backend, backend_options=options, device=check_device(device),
                       dtype=check_choice(dtype, "dtype", DTYPES),
                       sampling=SamplingConfig(decoding=decoding, draft_tokens=draft_tokens),
                       zero_embed_code_0=check_flag(bool(zero_embed_code_0), "zero_embed_code_0"),
                       num_threads=check_num_threads(num_threads))
        return cls.from_run(resolve_run(spec, model=config),
                            tokenizer if isinstance(tokenizer, ImageTokenizer) else None)

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
                                  "load files with terra.tokenizer.images.load_images")
        if not images.is_floating_point():
            raise TerraInputError(f"images have dtype {images.dtype}; give floats in [-1, 1] (pixels / 127.5 - 1), "
                                  "as terra.tokenizer.images.load_images returns")
        if not bool(torch.isfinite(images).all()):
            raise TerraInputError("images hold NaN or inf; give finite floats in [-1, 1]")
        if images.numel() and float(images.abs().max()) > 1.01:
            raise TerraInputError(f"images hold values up to {float(images.abs().max()):g}, outside [-1, 1]; "
                                  "scale pixels as pixels / 127.5 - 1 (terra.tokenizer.images.load_images does it)")
        if tuple(images.shape[-2:]) != self.image_size:
            raise TerraInputError(
                f"images are {tuple(images.shape[-2:])} but the tokenizer expects {self.image_size}; "
                "load them with terra.tokenizer.images.load_images, which resizes and crops"
            )
        with self._tokenizer_lock:
            codes = [
                self.tokenizer.encode(images[i : i + self.tokenizer_batch_size].to(self.device)).cpu()
                for i in range(0, len(images), self.tokenizer_batch_size)
            ]
        return torch.cat(codes).numpy().astype(np.int64)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Codes ``[T, h, w]`` → uint8 frames ``[T, H, W, 3]``, frame by frame with the tokenizer."""
        with self._tokenizer_lock:
            return codes_to_frames(self.tokenizer, codes, batch_size=self.tokenizer_batch_size)

    def frames(self, codes: np.ndarray, seed: int | None = None, refiner: "VideoRefiner | None" = None,
               progress: bool = False) -> tuple[np.ndarray, dict[str, float]]:
        """A rollout's codes ``[T, h, w]`` → uint8 frames and the timings of the decoding."""
        start = time.perf_counter()
        if refiner is None:
            return self.decode(codes), {"decode_s": time.perf_counter() - start}
        with self._refiner_lock:  # one refinement at a time on the GPU
            video = refiner.refine(codes, self.tokenizer, seed=seed or 0, progress=progress)
        return video.frames, {f"refine_{key}": value for key, value in video.timings.items()}

    def generate(
        self,
        requests: Sequence[RolloutRequest],
        sampling: SamplingConfig,
        progress: bool = True,
        on_frame: FrameCallback | None = None,
        decode: bool = True,
    ) -> list[RolloutResult]:
        """Run all rollouts on the backend, then decode each to frames (``decode=False``: ``frames`` stay None)."""
        sampling = self.backend.as_run(sampling)
        start = time.perf_counter()
        states = self.backend.run_rollouts(requests, sampling, progress=progress, on_frame=on_frame)
        generate_s = time.perf_counter() - start
        grid = self.tokenizer.grid_shape
        results = []
        for request, state in zip(requests, states):
            new = state.generated()
            context = np.asarray(request.context).reshape(len(request.context), *grid)
            codes = np.concatenate([context, new.reshape(len(new), *grid)])
            frames, decoding = self.frames(codes, request.seed) if decode else (None, {})
            timings = {"generate_s": generate_s,
                       "generate_s_per_frame": generate_s / max(1, sum(r.num_frames for r in requests)), **decoding}
            results.append(RolloutResult(request, codes, frames, len(context), timings, sampling,
                                         state.pass_stats()))
        return results

    def refine(self, results: Sequence[RolloutResult], refiner: "VideoRefiner",
               progress: bool = False) -> list[RolloutResult]:
        """Give each result the video refiner's frames (384x640), seeded with its request's seed (0 when none)."""
        for result in results:
            result.frames, timings = self.frames(result.codes, result.request.seed, refiner, progress)
            result.timings.update(timings)
        return list(results)

    def close(self) -> None:
        """Release the backend (frees an engine's GPU memory)."""
        self.backend.close()
