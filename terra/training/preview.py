"""A sample rollout while training: the first validation clip's opening frames as context, its actions, the
model's greedy continuation beside the clip's own frames, as one GIF in the run folder (``samples/``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from decoder.writers import write_grid
from terra.config.sampling import SamplingConfig
from terra.generation.hf_backend import HFBackend
from terra.generation.rollout import RolloutRequest
from terra.models import LlamaActionForCausalLM
from terra.pipeline import WorldModelPipeline
from terra.training.data import ClipSet
from tokenizer.atomic import atomic_path

GREEDY = SamplingConfig(temperature=0.0)


def write_preview(path: Path, model: LlamaActionForCausalLM, tokenizer, clips: ClipSet, clip: int, frames: int,
                  num_context: int, device: torch.device) -> Path:
    """Roll ``model`` out over ``clips[clip]``'s first ``frames`` frames from ``num_context`` of them; write the
    clip (left) and the rollout (right) side by side to ``path``, atomically."""
    codes, actions = clips.window(clip, 0, frames)
    grid = tokenizer.grid_shape
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    pipeline = WorldModelPipeline(tokenizer, HFBackend(model, device, dtype), str(device))
    request = RolloutRequest(codes[:num_context].numpy().astype(np.int64), actions.numpy(), frames - num_context, seed=0)
    (result,) = pipeline.generate([request], GREEDY, progress=False)
    truth = pipeline.decode(codes.numpy().astype(np.int64).reshape(frames, *grid))
    with atomic_path(path) as tmp:
        write_grid(tmp, [truth, result.frames])
    return path
