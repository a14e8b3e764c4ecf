"""A training run from a checked :class:`~terra.training.settings.TrainSpec`: data → model → steps → export.

Each step draws ``batch_size`` windows (the same on every process; each takes its slice), runs them in
micro-batches of ``micro_batch_size`` with gradients accumulated, clips the gradient norm and steps AdamW on a
cosine schedule with warm-up. Every ``eval_every`` steps the held-out clips' loss is logged, and greedy rollouts of
a few of them are scored (``val_psnr``) with the first written as a GIF (terra/training/preview.py); every
``ckpt_every`` steps, when ``max_minutes`` is spent and on SIGTERM the run checkpoints
(terra/training/checkpoint.py); the same command resumes it. At ``max_steps``
``model/`` is written in Terra's layout (config.json, safetensors shards below ``export.max_shard_size``, LoRA
merged), which every backend, ``terra-generate``, batch rollouts and ``terra-serve`` load as they are. With
``export.best`` every validation that improves on ``export.best_by`` (a lower loss, or a higher rollout PSNR; the
validation before the first step included) rewrites ``best/`` the same way, so a run that overfits still leaves
the weights it was best at.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from terra.core.errors import TerraInputError
from terra.training import checkpoint as ckpt
from terra.training.data import (
    ClipSet, TrainingData, Windows, WindowSampler, load_training_data, stack_windows, validation_windows,
)
from terra.training.distributed import (
    Processes, all_sum, barrier, gradient_sync, parallelize, start_processes, stop_processes,
)
from terra.training.model import add_lora, build_model, checkpoint_layers, standalone_model, store_weights
from terra.training.objective import WindowLoss
from terra.training.optimizer import make_optimizer
from terra.training.runlog import RunLog
from terra.training.settings import (
    ADAPTER_DIR, BEST_DIR, CHECKPOINT_DIR, EXPORT_DIR, LOG_FILE, SAMPLES_DIR, TrainSpec,
)
from terra.core.atomic import atomic_dir, json_text

BEST_FILE = "best.json"  # in best/: the step and validation scores of its weights


@dataclass
class Trainee:
    """What a run trains and how: the loss module (possibly wrapped for several processes), the PEFT model
    when ``finetune=lora``, the window size and the micro-batching of this process."""

    module: torch.nn.Module
    loss: WindowLoss
    peft: torch.nn.Module | None
    frames: int
    micro_batch: int
    accumulation: int


def train(spec: TrainSpec) -> dict[str, Any]:
    """Run (or resume) training; return a summary of where it stopped."""
    processes = start_processes(spec.device)
    try:
        # one run per output folder: the main process holds its lock (the folder created, its names recorded)
        with spec.output.hold(LOG_FILE) if processes.main else contextlib.nullcontext():
            return _train(spec, processes)
    finally:
        stop_processes(processes)


def autocast_dtype(spec: TrainSpec, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA with ``precision=auto``, or when asked; float32 otherwise."""
    return torch.bfloat16 if spec.precision == "bf16" or (spec.precision == "auto" and device.type == "cuda") else None


def build_trainee(spec: TrainSpec, data: TrainingData, processes: Processes) -> Trainee:
    """The model on this process's device, LoRA added and wrapped for data parallelism as the spec says."""
    per_process, rest = divmod(spec.batch_size, processes.world_size)
    micro = spec.micro_batch_size or per_process
    if rest or per_process % micro:
        raise TerraInputError(f"train.batch_size={spec.batch_size} must split evenly into {processes.world_size} "
                              f"process(es) x micro-batches of {micro}; change train.batch_size or "
                              "train.micro_batch_size")
    model = build_model(spec, data)
    config = model.config
    longest = int(data.train.lengths.max())
    frames = spec.window or min(config.num_temporal_embeddings, longest)
    if not 2 <= frames <= config.num_temporal_embeddings:
        raise TerraInputError(f"train.window {frames} must be in [2, {config.num_temporal_embeddings}] (the model's "
                              f"window) and clips have up to {longest} frames; use clips of at least 2 frames")
    compute = autocast_dtype(spec, processes.device)
    peft = None
    if spec.lora is not None:
        peft = add_lora(model, spec.lora)
        model = peft.get_base_model()
    trained = getattr(torch, spec.weights_dtype)
    store_weights(model, trained, compute or trained)  # frozen weights need no more precision than the compute
    checkpoint_layers(model, spec.activation_checkpointing)
    model.config.use_cache = False
    loss = WindowLoss(model, frames, spec.loss_on_first_frame, spec.loss_chunk, compute,
                      compile_softmax=spec.compile, input_noise=spec.input_noise).to(processes.device)
    if spec.compile:
        for layer in model.model.layers:
            layer.compile()
    module = parallelize(loss, model.model.layers, processes, sharded=spec.lora is None, compute_dtype=compute)
    return Trainee(module, loss, peft, frames, micro, per_process // micro)


def _train(spec: TrainSpec, processes: Processes) -> dict[str, Any]:
    out = spec.output_dir  # created and locked by the main process (terra/apps/train.py)
    torch.set_float32_matmul_precision("high")  # TF32 for what runs outside autocast on GPUs; no-op on CPU
    torch.manual_seed(spec.seed)
    data = load_training_data(spec.data, spec.val_clips, spec.recoveries)
    trainee = build_trainee(spec, data, processes)
    route_slots = trainee.loss.lm.config.num_route_tokens
    if data.recoveries is not None and not route_slots:
        raise TerraInputError("data.recoveries teach a route model to draw the road where its route says, and this "
                              "model has no route slots; set net.num_route_tokens (e.g. 8) or data.recoveries=null")
    if processes.main and route_slots:
        print(route_note(route_slots, data.has_routes, spec.no_route_share))
    data = data.for_route_slots(route_slots)
    module, device = trainee.module, processes.device
    optimizer = make_optimizer(module, spec, device)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, spec.warmup_steps, spec.max_steps,
                                                            min_lr_rate=spec.min_lr_ratio)
    sampler = WindowSampler(data.train, trainee.frames, spec.seed, spec.no_route_share, data.recoveries,
                            spec.recovery_share)
    step = 0
    folder = out / CHECKPOINT_DIR
    bound = {"train.optimizer": spec.optimizer}  # the optimizer state's layout: a checkpoint resumes under its own
    if spec.resume and ckpt.find_checkpoint(folder, processes):
        state = ckpt.load_checkpoint(folder, module, optimizer, processes, bound)
        scheduler.load_state_dict(state["scheduler"])
        sampler.generator.set_state(state["sampler"])
        step = int(state["step"])
        if processes.main:
            print(f"resumed from {folder} at step {step}")
    val = validation_windows(data.val, trainee.frames)
    preview = spec.sample_gif and bool(val) and bool(data.tokenizer) and Path(data.tokenizer).is_dir()
    tokenizer = None  # the main process's, for the sample rollouts (loaded once)
    if preview and processes.main:
        from terra.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(data.tokenizer, device=processes.device)
    if spec.sample_gif and val and not preview:
        missing = f"the data's tokenizer {data.tokenizer or '(not recorded)'} is not a folder here"
        if spec.export_best and spec.best_by == "val_psnr":
            raise TerraInputError(f"export.best_by=val_psnr scores validation rollouts, and {missing}; "
                                  "use export.best_by=val_loss")
        if processes.main:
            print(f"no sample rollouts: {missing}")
    config = trainee.loss.lm.config
    positions = trainee.frames * config.num_spatio_embeddings
    trained = sum(p.numel() for p in module.parameters() if p.requires_grad)
    if processes.main:
        print(f"world model: {sum(p.numel() for p in trainee.loss.lm.parameters()) / 1e6:.2f} M parameters "
              f"({trained / 1e6:.2f} M trained, finetune={spec.finetune}), {len(data.train)} training clips, "
              f"{len(val)} validation clips, window {trainee.frames} frames x {config.num_spatio_embeddings} "
              f"positions, {processes.world_size} process(es) on {device.type}")

    def save() -> None:
        state = {"step": step, "scheduler": scheduler.state_dict(), "sampler": sampler.generator.get_state(),
                 "settings": bound}
        ckpt.save_checkpoint(folder, module, optimizer, state, processes)

    stop = {"signal": False}
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.update(signal=True))
    log = RunLog(out, step, spec.max_steps, spec.tensorboard, spec.progress) if processes.main else None
    start = time.perf_counter()
    budget_s = math.inf if spec.max_minutes is None else spec.max_minutes * 60.0
    sums = torch.zeros(3, device=device)  # loss, accuracy, steps since the last log row (summed over processes)
    interval_start, reason, last = time.perf_counter(), "max_steps", {}
    best = _saved_best(out) if spec.export_best and step > 0 else None  # best/'s step and scores so far

    def validate() -> dict[str, float]:
        nonlocal best
        began = time.perf_counter()
        if log is not None:
            rollouts = f" and greedy rollouts of {min(len(val), spec.sample_clips)}" if preview else ""
            log.say(f"validation at step {step}/{spec.max_steps}: loss on {len(val)} clips{rollouts} ...")
        scores = _validate(trainee, data, val, processes)
        if preview:
            scores["val_psnr"] = _rollouts(spec, trainee, tokenizer, data, val[:spec.sample_clips], processes,
                                           out / SAMPLES_DIR / f"step{step:07d}.gif")
        if log is not None:
            log.say(f"validation at step {step}/{spec.max_steps} done in {time.perf_counter() - began:.1f} s: "
                    + " ".join(f"{k}={v:.4g}" for k, v in scores.items()))
        # every process has the same scores: all agree on an improvement
        if spec.export_best and (best is None or _improves(scores, best, spec.best_by)):
            best = {"step": step, **scores}
            export_best(spec, trainee, processes, best)
        return scores

    try:
        if step == 0 and val:  # where the run starts from: every later validation reads against this row
            first = {"step": 0, **validate()}
            if log is not None:
                log.write(first)
            interval_start = time.perf_counter()
        while step < spec.max_steps:
            mine = slice(processes.rank * trainee.micro_batch * trainee.accumulation,
                         (processes.rank + 1) * trainee.micro_batch * trainee.accumulation)
            windows = sampler.sample(spec.batch_size).rows(mine).to(device)
            loss, acc, grad_norm = train_step(trainee, optimizer, windows, spec.grad_clip)
            scheduler.step()
            sums[:2] += torch.stack([loss, acc])
            step += 1
            if log is not None:
                log.step()
            sums[2] += 1
            stopping, diverged = _agree(stop["signal"] or time.perf_counter() - start >= budget_s, loss, processes)
            if diverged:  # before the NaN weights reach a log row, a checkpoint or an export
                raise TerraInputError(f"training diverged at step {step}: the loss is not finite; rerun to resume "
                                      "from the last checkpoint with a lower train.lr or train.grad_clip")
            evaluate = step % spec.eval_every == 0 or step == spec.max_steps
            if step % spec.log_every == 0 or step == spec.max_steps or evaluate or stopping:
                totals = all_sum(sums, processes).tolist()
                elapsed = time.perf_counter() - interval_start
                last = {"step": step, "loss": totals[0] / totals[2], "acc": totals[1] / totals[2],
                        "lr": float(scheduler.get_last_lr()[0]),  # a tensor for torchao's optimizers
                        "grad_norm": float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm),
                        "tokens_per_s": totals[2] / processes.world_size * spec.batch_size * positions / elapsed,
                        "time_s": time.perf_counter() - start}
                if evaluate and val:
                    last.update(validate())
                if log is not None:
                    log.write(last)
                sums.zero_()
                interval_start = time.perf_counter()
            if stopping:
                reason = "SIGTERM" if stop["signal"] else "max_minutes"
                break
            if step % spec.ckpt_every == 0 and step < spec.max_steps:
                save()
        save()
    finally:
        if log is not None:
            log.close()
        signal.signal(signal.SIGTERM, previous)
    summary = {"step": step, "max_steps": spec.max_steps, "stopped": reason,
               **{k: v for k, v in last.items() if k != "step"}}
    if best is not None:
        summary["best"] = best
    if step >= spec.max_steps:
        summary["export"] = str(export(spec, trainee, processes))
        if processes.main:
            kept = f"; {out / BEST_DIR} holds step {summary['best']['step']}" if "best" in summary else ""
            print(f"training finished at step {step}; exported {out / EXPORT_DIR}{kept}")
    elif processes.main:
        print(f"stopped at step {step}/{spec.max_steps} ({reason}); run the same command again to resume")
    return summary


def route_note(route_slots: int, has_routes: bool, no_route_share: float) -> str:
    """The line a route model's run says once: what its route slots train on."""
    if not has_routes:
        return (f"data.tokens holds no routes: the model's {route_slots} route slots train with its \"no route\" "
                "embedding in every window")
    return (f"route slots: {route_slots} a frame, the data's routes resampled to them; "
            f"{no_route_share:.0%} of the windows train with no route (train.no_route_share)")


def train_step(trainee: Trainee, optimizer: torch.optim.Optimizer, windows: Windows, grad_clip: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step over this process's windows (``accumulation`` micro-batches); returns the mean loss and
    accuracy (on the device, unsynchronised) and the gradient norm before clipping."""
    loss_sum = acc_sum = torch.zeros((), device=windows.codes.device)
    for k in range(trainee.accumulation):
        with gradient_sync(trainee.module, k == trainee.accumulation - 1):
            loss, acc = trainee.module(*windows.rows(slice(k * trainee.micro_batch, (k + 1) * trainee.micro_batch)))
            (loss / trainee.accumulation).backward()
        loss_sum, acc_sum = loss_sum + loss.detach(), acc_sum + acc
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in trainee.module.parameters() if p.requires_grad], grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum / trainee.accumulation, acc_sum / trainee.accumulation, grad_norm


def _agree(flag: bool, loss: torch.Tensor, processes: Processes) -> tuple[bool, bool]:
    """Whether any process wants to stop (a signal or the time budget) and whether any process's loss is not
    finite, so all stop after the same step."""
    flags = torch.stack([torch.tensor(float(flag), device=processes.device), (~torch.isfinite(loss)).float()])
    stopping, diverged = all_sum(flags, processes).tolist()
    return stopping > 0, diverged > 0


@torch.no_grad()
def _validate(trainee: Trainee, data: TrainingData, val: list[int], processes: Processes) -> dict[str, float]:
    """Mean loss and accuracy over the first window of every validation clip (every process scores all); with
    routes, also the loss with no route (``val_loss_no_route``: above ``val_loss`` when the model reads its
    routes); with held-out recovery clips, their loss from their first frame back on the car's pose with and without
    their route (``val_recovery_loss``, ``val_recovery_loss_no_route``: the gap is what the route tells where the
    earlier frames are off the car)."""
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
    """``{name}_loss``, ``{name}_acc`` (and ``{name}_loss_no_route`` with routes) over the first windows of the
    chosen clips."""
    totals: dict[str, float] = {}
    for lo in range(0, len(chosen), trainee.micro_batch):
        part = chosen[lo:lo + trainee.micro_batch]
        windows = stack_windows(clips, part, [0] * len(part), trainee.frames).to(processes.device)
        loss, acc = trainee.module(*windows)
        totals[f"{name}_loss"] = totals.get(f"{name}_loss", 0.0) + float(loss) * len(part)
        totals[f"{name}_acc"] = totals.get(f"{name}_acc", 0.0) + float(acc) * len(part)
        if windows.routes is not None:
            blind, _ = trainee.module(*windows._replace(routes=None))
            key = f"{name}_loss_no_route"
            totals[key] = totals.get(key, 0.0) + float(blind) * len(part)
    return {key: total / max(len(chosen), 1) for key, total in totals.items()}


def trained_model(trainee: Trainee, processes: Processes, dtype: torch.dtype):
    """The trained model as a plain :class:`LlamaActionForCausalLM` in ``dtype`` on the main process (None on the
    others); a collective call when the model is sharded."""
    sharded = processes.distributed and trainee.peft is None
    full_state = None
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        gathered = get_model_state_dict(trainee.module, options=StateDictOptions(full_state_dict=True,
                                                                                 cpu_offload=True))
        full_state = {k.removeprefix("lm."): v for k, v in gathered.items()}
    if not processes.main:
        return None
    source = trainee.peft if trainee.peft is not None else trainee.loss.lm
    return standalone_model(source, full_state, trainee.loss.lm.config, dtype)


def _rollouts(spec: TrainSpec, trainee: Trainee, tokenizer, data: TrainingData, clips: list[int],
              processes: Processes, path: Path) -> float:
    """The validation rollouts' PSNR (terra/training/preview.py), run by the main process and shared with every
    process; the first clip's GIF written to ``path``."""
    model = trained_model(trainee, processes, torch.bfloat16 if processes.device.type == "cuda" else torch.float32)
    # float64: every process gets the score exactly as computed (float32 would round it)
    score = torch.zeros(1, dtype=torch.float64, device=processes.device)
    if model is not None:
        from terra.training.preview import validation_rollouts

        context = min(spec.sample_context, trainee.frames - 1)
        score += validation_rollouts(path, model, tokenizer, data.val, clips, trainee.frames, context, processes.device)
    return float(all_sum(score, processes).item())


def _improves(scores: dict[str, float], best: dict[str, float], metric: str) -> bool:
    """Whether ``scores`` beat ``best`` on ``metric``: a lower ``val_loss``, a higher ``val_psnr``."""
    return scores[metric] < best[metric] if metric == "val_loss" else scores[metric] > best[metric]


def export(spec: TrainSpec, trainee: Trainee, processes: Processes) -> Path:
    """Write ``model/`` (Terra's layout, ``export.dtype``, LoRA merged) and, for LoRA with ``export.adapter``,
    ``adapter/`` (PEFT's unmerged adapter), atomically."""
    target = spec.output_dir / EXPORT_DIR
    if _write_model(spec, trainee, processes, target) and trainee.peft is not None and spec.export_adapter:
        with atomic_dir(spec.output_dir / ADAPTER_DIR) as folder:
            trainee.peft.save_pretrained(folder)
    barrier(processes)
    return target


def export_best(spec: TrainSpec, trainee: Trainee, processes: Processes, scores: dict[str, float]) -> None:
    """Write ``best/``: the current weights as :func:`export` writes ``model/``, with :data:`BEST_FILE` (``scores``:
    the step and its validation) beside them."""
    _write_model(spec, trainee, processes, spec.output_dir / BEST_DIR, scores)
    barrier(processes)


def _write_model(spec: TrainSpec, trainee: Trainee, processes: Processes, target: Path,
                 scores: dict[str, float] | None = None) -> bool:
    """The trained model in Terra's layout at ``target``, atomically, with ``scores`` as :data:`BEST_FILE` when
    given; a collective call (a sharded model is gathered). True on the process that wrote it."""
    model = trained_model(trainee, processes, getattr(torch, spec.export_dtype))
    if model is None:
        return False
    with atomic_dir(target) as folder:
        model.save_pretrained(folder, max_shard_size=spec.export_max_shard_size)
        if scores is not None:
            (folder / BEST_FILE).write_text(json_text(scores) + "\n")
    return True


def _saved_best(out: Path) -> dict[str, float] | None:
    """The step and scores of a resumed run's ``best/`` (None when it has none)."""
    path = out / BEST_DIR / BEST_FILE
    return json.loads(path.read_text()) if path.is_file() else None
