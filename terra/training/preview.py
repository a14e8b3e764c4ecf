"""Validation rollouts while training: greedy continuations of a few validation clips, their PSNR (``val_psnr``) and a
GIF."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from terra.config.sampling import SamplingConfig
from terra.core.atomic import atomic_path
from terra.decoder.writers import write_grid
from terra.generation.backends import model_backend
from terra.generation.rollout import RolloutRequest
from terra.metrics import PSNR_CAP_DB, psnr
from terra.models import LlamaActionForCausalLM
from terra.pipeline import WorldModelPipeline
from terra.training.data import ClipSet

GREEDY = SamplingConfig(temperature=0.0)


def validation_rollouts(path: Path, model: LlamaActionForCausalLM, tokenizer, clips: ClipSet, ids: Sequence[int],
                        frames: int, num_context: int, device: torch.device) -> float:
    """Roll ``model`` out over the clips ``ids`` from ``num_context`` frames; return the mean PSNR (dB).

    The first clip (left) beside its rollout (right) is written to ``path`` as a GIF.
    """
    grid = tokenizer.grid_shape
    pipeline = WorldModelPipeline(tokenizer, model_backend(model, device, streams=len(ids)), str(device))
    windows = [clips.window(clip, 0, frames)[:2] for clip in ids]
    requests = [RolloutRequest(codes[:num_context].numpy().astype(np.int64), actions.numpy(), frames - num_context,
                               seed=0, routes=clips.frame_routes(clip, 0, frames))
                for clip, (codes, actions) in zip(ids, windows)]
    rollouts = [result.frames for result in pipeline.generate(requests, GREEDY, progress=False)]
    truths = [pipeline.decode(codes.numpy().astype(np.int64).reshape(frames, *grid)) for codes, _ in windows]
    scores = [min(v, PSNR_CAP_DB) for rollout, truth in zip(rollouts, truths)
              for v in psnr(rollout[num_context:], truth[num_context:])]
    with atomic_path(path) as tmp:
        write_grid(tmp, [truths[0], rollouts[0]])
    return float(np.mean(scores))
