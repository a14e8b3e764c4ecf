"""Forward passes per generated frame of a world model, sequential against speculative decoding, on held-out clips."""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from terra.config.checks import SEED, Range
from terra.config.sampling import SamplingConfig
from terra.core.atomic import json_text, write_text
from terra.core.errors import TerraInputError
from terra.evaluation.measure import clip_routes, drive_scene_seed, training_scene_seeds
from terra.generation.rollout import RolloutRequest
from terra.metrics import PSNR_CAP_DB, psnr
from terra.sim.clips import Clip, random_drive
from terra.tokenizer.images import frames_to_tensor

if TYPE_CHECKING:
    from terra.pipeline import WorldModelPipeline

SEQUENTIAL = {"decoding": "sequential"}  # the sequential modes' sampling settings
COUNTS = {"rollouts": Range(1, 4096, 32, whole=True), "context": Range(1, 1000, 3, whole=True),
          "frames": Range(1, 1000, 10, whole=True), "exclude_clips": Range(0, 10**7, 0, whole=True)}


@dataclass(frozen=True)
class DecodingSettings:
    """What :func:`measure_decoding` measures, checked when made."""

    world_model: str  # world-model folder (config.json + safetensors)
    tokenizer: str  # the tokenizer folder its data was encoded with
    out: Path  # the JSON file written
    temperatures: tuple[float, ...] = (0.0, 0.9)
    speculative: tuple[str, ...] = ("decoding=speculative",)  # each: comma-separated key=value of ``sampling``
    rollouts: int = 32
    context: int = 3  # ground-truth context frames per rollout
    frames: int = 10  # frames generated per rollout
    clip_seed: int = 1  # clip i: random_drive(default_rng([clip_seed, i]))
    exclude_seed: int = 0  # terra-make-dataset seed of the training clips
    exclude_clips: int = 0  # number of training clips whose scenes are skipped
    seed: int = 0  # rollout k samples with seed + k
    device: str = "auto"
    dtype: str = "float32"
    modes: tuple[tuple[str, float, SamplingConfig], ...] = field(init=False, repr=False)  # (name, temperature,
    # sampling) of every mode: per temperature, sequential and each speculative set (named by its settings)

    def __post_init__(self) -> None:
        for name, limits in COUNTS.items():
            limits.check(getattr(self, name), name)
        for name in ("clip_seed", "exclude_seed", "seed"):
            SEED.check(getattr(self, name), name)
        named = [("sequential", SEQUENTIAL), *((text, parse_settings(text)) for text in self.speculative)]
        modes = tuple((name, t, mode_sampling(name, {"temperature": t, **settings}))
                      for t in self.temperatures for name, settings in named)
        object.__setattr__(self, "modes", modes)


def mode_sampling(name: str, settings: dict[str, Any]) -> SamplingConfig:
    """A mode's sampling settings checked (one line naming the mode for settings ``sampling`` does not take)."""
    try:
        return SamplingConfig.from_mapping(settings)
    except TerraInputError as err:
        raise TerraInputError(f"speculative settings {name!r}: {err}") from None


def parse_settings(text: str) -> dict[str, Any]:
    """``"decoding=speculative,draft_tokens=16"`` → ``{"decoding": "speculative", "draft_tokens": 16}``."""
    import yaml

    settings = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TerraInputError(f"speculative settings: {item!r} is not key=value; e.g. decoding=speculative")
        settings[key.strip()] = yaml.safe_load(value)
    return settings


def held_out_clips(count: int, frames: int, image_size: tuple[int, int], clip_seed: int, exclude_seed: int,
                   exclude_clips: int) -> list[Clip]:
    """``count`` clips of the training distribution whose scenes no training clip of ``terra-make-dataset`` used."""
    training = training_scene_seeds(exclude_seed, exclude_clips)
    unused = (i for i in itertools.count() if drive_scene_seed(clip_seed, i) not in training)
    return [random_drive(np.random.default_rng([clip_seed, i]), frames).render(frames, *image_size)
            for i in itertools.islice(unused, count)]


class PassCounter:
    """Rows of every forward pass through ``layer`` (a decoder layer: every pass of the model goes through it)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        self.rows = self.calls = 0
        self._handle = layer.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, _module, args, kwargs) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        self.rows += int(hidden.shape[0])
        self.calls += 1

    def reset(self) -> None:
        self.rows = self.calls = 0

    def close(self) -> None:
        self._handle.remove()


def run_mode(pipeline: WorldModelPipeline, clips: list[Clip], codes: np.ndarray, sampling: SamplingConfig,
             settings: DecodingSettings, counter: PassCounter) -> tuple[dict[str, Any], np.ndarray]:
    """One mode's rollouts: its record and the generated codes ``[rollouts, frames, h, w]``."""
    n_ctx = settings.context
    route_tokens = pipeline.backend.layout.route_tokens
    requests = [RolloutRequest(codes[i, :n_ctx], clip.actions, settings.frames, seed=settings.seed + i,
                               routes=clip_routes(clip, route_tokens)) for i, clip in enumerate(clips)]
    counter.reset()
    start = time.perf_counter()
    results = pipeline.generate(requests, sampling, progress=False, decode=False)
    generate_s = time.perf_counter() - start
    frames = len(clips) * settings.frames
    scores = np.array([[min(v, PSNR_CAP_DB) for v in psnr(pipeline.decode(r.codes[n_ctx:]), clip.frames[n_ctx:])]
                       for r, clip in zip(results, clips)])
    passes = counter.rows / frames
    stats = sum((r.pass_stats for r in results[1:]), results[0].pass_stats)
    record = {"rollouts": len(clips), "frames": frames, "forward_passes": counter.rows, "batched_calls": counter.calls,
              "backend_reported": stats.as_dict(results[0].sampling),
              "passes_per_frame": round(passes, 3),
              "image_tokens_per_pass": round(pipeline.backend.layout.image_tokens / passes, 3),
              "generate_s": round(generate_s, 3), "s_per_frame": round(generate_s / frames, 4),
              "psnr": {"mean": round(float(scores.mean()), 3), "per_step": scores.mean(axis=0).round(3).tolist()},
              "previous_frame_guess": previous_frame_hits(np.stack([r.codes for r in results]), n_ctx)}
    return record, np.stack([r.codes[n_ctx:] for r in results])


def previous_frame_hits(codes: np.ndarray, first: int) -> dict[str, float]:
    """Shares of codes ``[rollouts, frames, h, w]`` equal to the previous frame's at their position, or within 3 x 3."""
    earlier, later = codes[:, first - 1:-1], codes[:, first:]
    h, w = codes.shape[2:]
    padded = np.pad(earlier, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-1)
    around = np.stack([padded[:, :, 1 + dy:1 + dy + h, 1 + dx:1 + dx + w] for dy in (-1, 0, 1) for dx in (-1, 0, 1)])
    return {"same_position": round(float((earlier == later).mean()), 4),
            "any_of_3x3": round(float((around == later[None]).any(axis=0).mean()), 4)}


def measure_decoding(settings: DecodingSettings) -> dict[str, Any]:
    """Load the pair once, run every mode on the same rollouts, write the report to ``settings.out`` and return it."""
    from terra.pipeline import WorldModelPipeline

    pipeline = WorldModelPipeline.from_pretrained(settings.world_model, settings.tokenizer, backend="hf",
                                                  device=settings.device, dtype=settings.dtype,
                                                  max_batch_size=settings.rollouts)
    counter = PassCounter(pipeline.backend.model.model.layers[0])
    frames = settings.context + settings.frames
    clips = held_out_clips(settings.rollouts, frames, tuple(pipeline.image_size), settings.clip_seed,
                           settings.exclude_seed, settings.exclude_clips)
    images = frames_to_tensor(np.concatenate([c.frames for c in clips]))
    codes = pipeline.encode(images).reshape(len(clips), frames, *pipeline.tokenizer.grid_shape)
    config = pipeline.backend.model.config
    report: dict[str, Any] = {
        "world_model": str(settings.world_model), "tokenizer": str(settings.tokenizer), "backend": "transformers",
        "device": str(pipeline.device), "dtype": settings.dtype,
        "parameters": sum(p.numel() for p in pipeline.backend.model.parameters()),
        "layout": {"image_tokens": config.num_image_patches, "codebook_size": config.codebook_size,
                   "frames_per_window": config.num_temporal_embeddings},
        "clips": {"count": len(clips), "context": settings.context, "generated": settings.frames,
                  "clip_seed": settings.clip_seed, "excluded_training_clips": settings.exclude_clips,
                  "manoeuvres": sorted({c.manoeuvre for c in clips})},
        "modes": [],
    }
    generated: dict[tuple[str, float], np.ndarray] = {}
    try:
        for name, temperature, sampling in settings.modes:
            record, generated[(name, temperature)] = run_mode(pipeline, clips, codes, sampling, settings, counter)
            report["modes"].append({"mode": name, "temperature": temperature, "sampling": asdict(sampling),
                                    "available": True, **record})  # available: the files' readers ask
            print(f"{name} at temperature {temperature:g}: {record['passes_per_frame']} passes per frame, "
                  f"{record['s_per_frame']} s per frame, PSNR {record['psnr']['mean']} dB", flush=True)
    finally:
        counter.close()
        pipeline.close()
    report["comparison"] = compare(report["modes"], generated)
    write_text(settings.out, json_text(report, indent=1) + "\n")
    return report


def compare(modes: list[dict[str, Any]], generated: dict[tuple[str, float], np.ndarray]) -> list[dict[str, Any]]:
    """Each speculative mode against sequential decoding at its temperature."""
    passes = {(m["mode"], m["temperature"]): m["passes_per_frame"] for m in modes}
    rows = []
    for (name, temperature), spec_passes in passes.items():
        if name == "sequential" or ("sequential", temperature) not in passes:
            continue
        same = generated[(name, temperature)] == generated[("sequential", temperature)]
        rows.append({"mode": name, "temperature": temperature,
                     "fewer_passes": round(passes[("sequential", temperature)] / spec_passes, 3),
                     "codes_equal": bool(same.all()), "tokens_equal_fraction": round(float(same.mean()), 6)})
    return rows
