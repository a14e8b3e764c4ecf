"""A training run from a checked :class:`TrainSpec`: data → model → steps → export."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from pathlib import Path
from typing import Any

import torch
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from terra.core.errors import TerraInputError
from terra.training import checkpoint as ckpt
from terra.training.data import Windows, WindowSampler, load_training_data
from terra.training.distributed import Processes, all_sum, barrier, gradient_sync, start_processes, stop_processes
from terra.training.runlog import RunLog
from terra.training.settings import ADAPTER_DIR, BEST_DIR, CHECKPOINT_DIR, EXPORT_DIR, LOG_FILE, TrainSpec
from terra.training.model import Trainee, build_trainee, trained_model
from terra.training.validation import improves, plan_validation, validation_scores
from terra.core.atomic import atomic_dir, json_text

BEST_FILE = "best.json"  # in best/: the step and validation scores of its weights


def train(spec: TrainSpec) -> dict[str, Any]:
    """Run (or resume) training; return a summary of where it stopped."""
    processes = start_processes(spec.device)
    try:
        # one run per output folder: the main process holds its lock (the folder created, its names recorded)
        with spec.output.hold(LOG_FILE) if processes.main else contextlib.nullcontext():
            return _train(spec, processes)
    finally:
        stop_processes(processes)


def _train(spec: TrainSpec, processes: Processes) -> dict[str, Any]:
    out = spec.output_dir  # created and locked by the main process
    torch.set_float32_matmul_precision("high")  # TF32 for what runs outside autocast on GPUs; no-op on CPU
    torch.manual_seed(spec.seed)
    data = load_training_data(spec.data, spec.val_clips, spec.recoveries)
    trainee = build_trainee(spec, data, processes)
    route_tokens = trainee.loss.lm.config.num_route_tokens
    if data.recoveries is not None and not route_tokens:
        raise TerraInputError("data.recoveries teach a route model to draw the road where its route says, and this "
                              "model has no route slots; set net.num_route_tokens (e.g. 8) or data.recoveries=null")
    if processes.main and route_tokens:
        print(route_note(route_tokens, data.has_routes, spec.no_route_share))
    data = data.for_route_slots(route_tokens)
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
    validation = plan_validation(spec, data, trainee.frames, processes)
    config = trainee.loss.lm.config
    positions = trainee.frames * config.num_spatio_embeddings
    trained = sum(p.numel() for p in module.parameters() if p.requires_grad)
    if processes.main:
        print(f"world model: {sum(p.numel() for p in trainee.loss.lm.parameters()) / 1e6:.2f} M parameters "
              f"({trained / 1e6:.2f} M trained, finetune={spec.finetune}), {len(data.train)} training clips, "
              f"{len(validation.clips)} validation clips, window {trainee.frames} frames x "
              f"{config.num_spatio_embeddings} positions, {processes.world_size} process(es) on {device.type}")

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
    saved_best = out / BEST_DIR / BEST_FILE
    best = json.loads(saved_best.read_text()) if spec.export.best and step > 0 and saved_best.is_file() else None

    def validate() -> dict[str, float]:
        nonlocal best
        scores = validation_scores(spec, trainee, data, validation, processes, step, log)
        # every process has the same scores: all agree on an improvement
        if spec.export.best and (best is None or improves(scores, best, spec.export.best_by)):
            best = {"step": step, **scores}
            _write_model(spec, trainee, processes, out / BEST_DIR, best)
            barrier(processes)
        return scores

    try:
        if step == 0 and validation.clips:  # where the run starts from: every later validation reads against this row
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
            sums += torch.stack([loss, acc, torch.ones_like(loss)])
            step += 1
            if log is not None:  # the bar's loss and tokens/s are the last row's: no GPU sync per step
                log.bar.update(1)
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
                if evaluate and validation.clips:
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


def route_note(route_tokens: int, has_routes: bool, no_route_share: float) -> str:
    if not has_routes:
        return (f"data.tokens holds no routes: the model's {route_tokens} route slots train with its \"no route\" "
                "embedding in every window")
    return (f"route slots: {route_tokens} a frame, the data's routes resampled to them; "
            f"{no_route_share:.0%} of the windows train with no route (train.no_route_share)")


def train_step(trainee: Trainee, optimizer: torch.optim.Optimizer, windows: Windows, grad_clip: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step of ``accumulation`` micro-batches: mean loss and accuracy (on device), unclipped grad norm."""
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


def make_optimizer(module: torch.nn.Module, spec: TrainSpec, device: torch.device) -> torch.optim.Optimizer:
    """``train.optimizer`` over ``module``'s trained weights, weight decay on matrices only."""
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": spec.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, fused=device.type == "cuda")
    from torchao.optim import AdamW8bit

    cls = AdamW8bit if device.type == "cuda" else eager(AdamW8bit)
    # stochastic rounding acts on bf16 weights only; float32 ones are updated exactly
    return cls(groups, lr=spec.lr, betas=spec.betas, bf16_stochastic_round=True)


def eager(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """``cls`` with the ``torch.compile`` calls inside its step run as plain Python (torch's "force_eager" stance)."""
    return type(f"Eager{cls.__name__}", (cls,), {"step": torch.compiler.set_stance("force_eager")(cls.step)})


def _agree(flag: bool, loss: torch.Tensor, processes: Processes) -> tuple[bool, bool]:
    """Whether any process wants to stop and whether any loss is not finite, so all stop after the same step."""
    flags = torch.stack([torch.tensor(float(flag), device=processes.device), (~torch.isfinite(loss)).float()])
    stopping, diverged = all_sum(flags, processes).tolist()
    return stopping > 0, diverged > 0


def export(spec: TrainSpec, trainee: Trainee, processes: Processes) -> Path:
    """Write ``model/`` (Terra's layout, ``export.dtype``, LoRA merged) and, with ``export.adapter``, ``adapter/``."""
    target = spec.output_dir / EXPORT_DIR
    if _write_model(spec, trainee, processes, target) and trainee.peft is not None and spec.export.adapter:
        with atomic_dir(spec.output_dir / ADAPTER_DIR) as folder:
            trainee.peft.save_pretrained(folder)
    barrier(processes)
    return target


def _write_model(spec: TrainSpec, trainee: Trainee, processes: Processes, target: Path,
                 scores: dict[str, float] | None = None) -> bool:
    """The trained model in Terra's layout at ``target``, atomically; a collective call."""
    model = trained_model(trainee, processes, getattr(torch, spec.export.dtype))
    if model is None:
        return False
    with atomic_dir(target) as folder:
        model.save_pretrained(folder, max_shard_size=spec.export.max_shard_size)
        if scores is not None:
            (folder / BEST_FILE).write_text(json_text(scores) + "\n")
    return True
