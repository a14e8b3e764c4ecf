"""A training run's validation: held-out clips' loss and accuracy, rollouts' PSNR and GIF, and the best so far."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from tqdm import tqdm

from terra.config.sampling import SamplingConfig
from terra.core.atomic import atomic_path
from terra.core.errors import TerraInputError
from terra.decoder.writers import write_grid
from terra.generation.backends import model_backend
from terra.generation.rollout import RolloutRequest
from terra.metrics import PSNR_CAP_DB, psnr
from terra.models import LlamaActionForCausalLM
from terra.pipeline import WorldModelPipeline
from terra.training.data import ClipSet, TrainingData, stack_windows, validation_windows
from terra.training.distributed import Processes, all_sum
from terra.training.runlog import RunLog
from terra.training.settings import SAMPLES_DIR, TrainSpec
from terra.training.model import Trainee, trained_model


@dataclass
class Validation:
    """What a run validates on: the held-out clips, whether samples are drawn, and the tokenizer (main process only)."""

    clips: list[int]
    preview: bool
    tokenizer: Any = None


def plan_validation(spec: TrainSpec, data: TrainingData, frames: int, processes: Processes) -> Validation:
    val = validation_windows(data.val, frames)
    preview = spec.sample.gif and bool(val) and bool(data.tokenizer) and Path(data.tokenizer).is_dir()
    tokenizer = None
    if preview and processes.main:
        from terra.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(data.tokenizer, device=processes.device)
    if spec.sample.gif and val and not preview:
        missing = f"the data's tokenizer {data.tokenizer or '(not recorded)'} is not a folder here"
        if spec.export.best and spec.export.best_by == "val_psnr":
            raise TerraInputError(f"export.best_by=val_psnr scores validation rollouts, and {missing}; "
                                  "use export.best_by=val_loss")
        if processes.main:
            print(f"no sample rollouts: {missing}")
    return Validation(val, preview, tokenizer)


def validation_scores(spec: TrainSpec, trainee: Trainee, data: TrainingData, validation: Validation,
                      processes: Processes, step: int, log: RunLog | None) -> dict[str, float]:
    """The validation at ``step``, the same on every process; the sample GIF written to ``samples/step{step}.gif``."""
    began = time.perf_counter()
    val = validation.clips
    if log is not None:
        rollouts = f" and greedy rollouts of {min(len(val), spec.sample.clips)}" if validation.preview else ""
        tqdm.write(f"validation at step {step}/{spec.max_steps}: loss on {len(val)} clips{rollouts} ...")
    scores = _losses(trainee, data, val, processes)
    if validation.preview:
        scores["val_psnr"] = _rollout_psnr(spec, trainee, validation.tokenizer, data, val[:spec.sample.clips],
                                           processes, spec.output_dir / SAMPLES_DIR / f"step{step:07d}.gif")
    if log is not None:
        tqdm.write(f"validation at step {step}/{spec.max_steps} done in {time.perf_counter() - began:.1f} s: "
                   + " ".join(f"{k}={v:.4g}" for k, v in scores.items()))
    return scores


def improves(scores: dict[str, float], best: dict[str, float], metric: str) -> bool:
    """Whether ``scores`` beat ``best`` on ``metric``: a lower ``val_loss``, a higher ``val_psnr``."""
    return scores[metric] < best[metric] if metric == "val_loss" else scores[metric] > best[metric]


@torch.no_grad()
def _losses(trainee: Trainee, data: TrainingData, val: list[int], processes: Processes) -> dict[str, float]:
    """Mean loss and accuracy over the first window of every validation clip (with routes and recoveries, those too)."""
    trainee.module.eval()
    scores = _scores(trainee, data.val, val, processes, "val")
    if data.val_recoveries is not None:
        held = validation_windows(data.val_recoveries, trainee.frames)
        scores |= {key: value for key, value in _scores(trainee, data.val_recoveries, held, processes,
                                                        "val_recovery").items() if "_acc" not in key}
    trainee.module.train()
    return scores


def _scores(trainee: Trainee, clips: ClipSet, chosen: list[int], processes: Processes, name: str
            ) -> dict[str, float]:
    """``{name}_loss``, ``{name}_acc`` (and ``{name}_loss_no_route``) over the first windows of the chosen clips."""
    totals: dict[str, float] = defaultdict(float)
    for lo in range(0, len(chosen), trainee.micro_batch):
        part = chosen[lo:lo + trainee.micro_batch]
        windows = stack_windows(clips, part, [0] * len(part), trainee.frames).to(processes.device)
        loss, acc = trainee.module(*windows)
        totals[f"{name}_loss"] += float(loss) * len(part)
        totals[f"{name}_acc"] += float(acc) * len(part)
        if windows.routes is not None:
            blind, _ = trainee.module(*windows._replace(routes=None))
            totals[f"{name}_loss_no_route"] += float(blind) * len(part)
    return {key: total / max(len(chosen), 1) for key, total in totals.items()}


def _rollout_psnr(spec: TrainSpec, trainee: Trainee, tokenizer, data: TrainingData, clips: list[int],
                  processes: Processes, path: Path) -> float:
    """The validation rollouts' PSNR, shared with every process; the first clip's GIF written to ``path``."""
    model = trained_model(trainee, processes, torch.bfloat16 if processes.device.type == "cuda" else torch.float32)
    # float64: every process gets the score exactly as computed (float32 would round it)
    score = torch.zeros(1, dtype=torch.float64, device=processes.device)
    if model is not None:
        context = min(spec.sample.num_context, trainee.frames - 1)
        score += validation_rollouts(path, model, tokenizer, data.val, clips, trainee.frames, context, processes.device)
    return float(all_sum(score, processes).item())


GREEDY = SamplingConfig(temperature=0.0)


def validation_rollouts(path: Path, model: LlamaActionForCausalLM, tokenizer, clips: ClipSet, ids: Sequence[int],
                        frames: int, num_context: int, device: torch.device) -> float:
    """Mean PSNR (dB) of ``model``'s rollouts of ``ids`` after ``num_context`` frames; the first's GIF at ``path``."""
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
