"""A vLLM engine's steps, counted and timed, and rollouts run end to end beside them
(scripts/checks/check_jacobi_vllm.py's terra and e2e parts): whether end-to-end frames/s reach what the step time
predicts."""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any, Sequence

import numpy as np

from bench.lib.models import dummy_weights_model
from terra.config.assets import DEMO
from terra.config.sampling import SamplingConfig
from terra.contract.layout import TokenLayout
from terra.generation.rollout import RolloutRequest, WorldModelBackend
from terra.models import LlamaActionConfig
from terra.models.presets import TERRA

CONTEXT, STEP_FRAMES = 3, 44  # rollouts whose steps are timed: ACT-Bench's shape, long enough that none ends


class StepCounter:
    """The engine scheduler's steps that ran the model (one forward pass each), the tokens they carried and the
    requests in them (each a rollout's pass, a prompt's chunks included); the engine core runs in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""

    def __init__(self, backend) -> None:
        scheduler = backend.engine.engine_core.engine_core.scheduler  # InprocClient -> EngineCore -> Scheduler
        schedule = scheduler.schedule
        self.reset()

        def counting(*args, **kwargs):
            output = schedule(*args, **kwargs)
            if output.total_num_scheduled_tokens > 0:
                self.steps += 1
                self.tokens += output.total_num_scheduled_tokens
                self.passes += len(output.num_scheduled_tokens)
            return output

        scheduler.schedule = counting

    def reset(self) -> None:
        self.steps = self.tokens = self.passes = 0


def random_requests(layout: TokenLayout, streams: int, seed: int, frames: int = STEP_FRAMES) -> list[RolloutRequest]:
    """``streams`` rollouts of random context codes and actions (their own per ``seed``: no prefix-cache hits across
    counts), ``CONTEXT`` + ``frames`` frames."""
    rng = np.random.default_rng(seed)
    return [RolloutRequest(rng.integers(0, layout.codebook_size, (CONTEXT, layout.image_tokens)),
                           rng.normal(0, 2, (CONTEXT + frames, layout.action_tokens, layout.action_dim))
                           .astype(np.float32), frames, seed=i)
            for i in range(streams)]


class InFlight:
    """``requests`` kept in flight on ``backend``: a rollout's next frame submitted the moment its last is done."""

    def __init__(self, backend: WorldModelBackend, requests: Sequence[RolloutRequest], sampling: SamplingConfig):
        self.backend, self.sampling = backend, sampling
        self.states = [backend.start(r, i) for i, r in enumerate(requests)]
        for state in self.states:
            backend.submit(state, sampling)

    def steps(self, count: int) -> None:
        """``count`` polls of the engine (a step each)."""
        for _ in range(count):
            for done in self.backend.poll():
                if not done.state.finished:
                    self.backend.submit(done.state, self.sampling)

    def timed(self, counter: StepCounter, warmup: int, steps: int) -> dict[str, Any]:
        """The step time after ``warmup`` steps, over ``steps``, and the tokens a step carried."""
        self.steps(warmup)
        counter.reset()
        start = time.perf_counter()
        self.steps(steps)
        wall = time.perf_counter() - start
        return {"streams": len(self.states), "steps": counter.steps, "step_s": wall / max(counter.steps, 1),
                "tokens_per_step": counter.tokens / max(counter.steps, 1)}

    def cancel(self) -> None:
        self.backend.cancel(self.states)


def end_to_end(backend: WorldModelBackend, counter: StepCounter, requests: Sequence[RolloutRequest],
               sampling: SamplingConfig) -> dict[str, Any]:
    """``requests`` run to completion together as every app runs rollouts (``run_rollouts``, what
    ``WorldModelPipeline.generate`` and a batch's engine loop drive; codes only: no tokenizer, no video), timed:
    frames/s, and the forward passes a frame took (the engine's steps each rollout was in, prompts included)."""
    counter.reset()
    start = time.perf_counter()
    states = backend.run_rollouts(requests, sampling, progress=False)
    wall = time.perf_counter() - start
    frames = sum(len(s.passes) for s in states)
    return {"rollouts": len(states), "frames": frames, "wall_s": round(wall, 3), "frames_per_s": frames / wall,
            "passes_per_frame": counter.passes / frames, "steps": counter.steps}


def projected(step: dict[str, Any], e2e: dict[str, Any]) -> dict[str, float]:
    """What the step time predicts for the end-to-end run ``e2e`` of ``step["streams"]`` rollouts: that many frames
    every ``passes_per_frame`` steps of ``step_s``; and the measured frames/s over it."""
    rate = step["streams"] / (e2e["passes_per_frame"] * step["step_s"])
    return {"projected_frames_per_s": round(rate, 3), "measured_over_projected": round(e2e["frames_per_s"] / rate, 3)}


def engine_record(backend, draft_tokens: int) -> dict[str, Any]:
    config = backend.engine.vllm_config
    return {"draft_tokens": draft_tokens, "passes_per_step": backend.passes_per_step,
            "v2_runner": getattr(config, "use_v2_model_runner", None),
            "async_scheduling": config.scheduler_config.async_scheduling,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
            "max_cudagraph_capture_size": config.compilation_config.max_cudagraph_capture_size,
            "flash_attn_splits": getattr(getattr(config, "attention_config", None),
                                         "flash_attn_max_num_splits_for_cuda_graph", None)}


def start_engine(model: str, draft_tokens: int, args: argparse.Namespace, passes_per_step: int = 1):
    """An engine of ``model`` (``terra``: Terra's 2 B shape, vLLM's dummy weights; ``demo``: the demo world model)
    with room for the most ``--streams``, ``passes_per_step`` verifying passes an engine step, and its record."""
    from terra.generation.vllm_backend import VLLMBackend

    if model == "terra":
        folder = tempfile.mkdtemp(prefix="terra_shape_")
        weights = dummy_weights_model(folder, LlamaActionConfig(**TERRA))
    else:
        folder, weights = str(DEMO / "world_model"), {}
    most = args.max_num_seqs or max(args.streams)
    started = time.perf_counter()
    backend = VLLMBackend(folder, dtype=args.dtype, max_num_seqs=most, draft_tokens=draft_tokens,
                          passes_per_step=passes_per_step, gpu_memory_utilization=args.gpu_memory_utilization,
                          max_num_batched_tokens=max(8192, most * (draft_tokens + 1)), **weights, **args.engine_kwargs)
    return backend, {**engine_record(backend, draft_tokens), "model": model, "runs": [], "max_num_seqs": most,
                     "startup_s": round(time.perf_counter() - started, 1), "engine_args": args.engine_kwargs}


def print_steps(model: str, draft_tokens: int, run: dict[str, Any], passes_per_step: int = 1) -> None:
    """One line of an engine's run: its step, and end to end where measured."""
    e2e = run.get("e2e")
    line = "" if e2e is None else (f"; end to end {e2e['frames_per_s']:.2f} frames/s, projected "
                                   f"{e2e['projected_frames_per_s']:.2f} ({e2e['measured_over_projected']:.0%})")
    print(f"{model} draft_tokens {draft_tokens:3d} x {passes_per_step} passes, {run['streams']:4d} in flight: "
          f"{1000 * run['step_s']:.2f} ms a step, {run['tokens_per_step']:.0f} tokens a step{line}", flush=True)


def engine_drafts(text: str) -> tuple[int, int]:
    """An engine's ``DRAFT_TOKENS[xPASSES]`` (e.g. ``32x3``: 32 draft tokens, 3 verifying passes an engine step,
    backend.options.passes_per_step) as ``(draft_tokens, passes_per_step)``."""
    drafts, _, passes = text.strip().partition("x")
    return int(drafts), int(passes or 1)


def engine_type(text: str) -> tuple[int, int]:
    """An argparse ``type``: :func:`engine_drafts` of 0-4096 draft tokens (0: sequential) and 1-64 passes a step."""
    try:
        drafts, passes = engine_drafts(text)
    except ValueError:
        drafts, passes = -1, 0
    if not (0 <= drafts <= 4096 and 1 <= passes <= 64):
        raise argparse.ArgumentTypeError(f"takes DRAFT_TOKENS[xPASSES], 0-4096 draft tokens and 1-64 passes, e.g. "
                                         f"0,32,32x3 (got {text!r})")
    return drafts, passes


def e2e_engine_type(models: Sequence[str]):
    """An argparse ``type``: an e2e engine, ``MODEL:DRAFT_TOKENS[xPASSES]``, MODEL one of ``models``."""

    def parse(text: str) -> tuple[str, tuple[int, int]]:
        model, sep, drafts = text.partition(":")
        if not sep or model not in models:
            raise argparse.ArgumentTypeError(f"takes MODEL:DRAFT_TOKENS[xPASSES], MODEL one of {', '.join(models)}, "
                                             f"e.g. demo:32x2,terra:0 (got {text!r})")
        return model, engine_type(drafts)

    return parse


def engine_label(drafts: int, passes: int) -> str:
    """The inverse of :func:`engine_drafts`."""
    return f"{drafts}x{passes}" if passes > 1 else str(drafts)


def draft_tokens_of(record: dict[str, Any]) -> int | None:
    """A record's ``draft_tokens`` (an engine's, or a mode's sampling settings)."""
    return None if record.get("draft_tokens") is None else int(record["draft_tokens"])


def step_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every engine's step time per count of rollouts in flight (the terra and e2e parts), and where measured, the
    end-to-end frames/s beside what the step time projects."""
    rows = []
    for part in ("terra", "e2e"):
        for record in report.get(part, []):
            for run in record.get("runs", []):
                row = {"model": record.get("model", "terra"), "draft_tokens": draft_tokens_of(record),
                       "passes_per_step": record.get("passes_per_step", 1),
                       "streams": run["streams"], "step_ms": round(1000 * run["step_s"], 3),
                       "tokens_per_step": round(run.get("tokens_per_step", 0), 1)}
                if "e2e" in run:
                    e2e = run["e2e"]
                    row.update(passes_per_frame=round(e2e["passes_per_frame"], 2),
                               frames_per_s=round(e2e["frames_per_s"], 3),
                               projected_frames_per_s=e2e["projected_frames_per_s"],
                               measured_over_projected=e2e["measured_over_projected"])
                rows.append(row)
    return rows
