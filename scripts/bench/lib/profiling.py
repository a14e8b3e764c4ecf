"""Where the time goes, with vLLM's engine core in this process: one single-stream decode step (vLLM's CPU-side
stages and the GPU's kernel time), and a batched run's frame boundaries (our request building, vLLM's input
processing, the engine's stages)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from torch.profiler import ProfilerActivity, profile

from bench.lib.engine_stats import CallTimer
from bench.lib.environment import GpuBusyMonitor
from bench.lib.parts import SAMPLING
from bench.lib.rollouts import make_requests, timed_generate
from terra.contract.layout import TokenLayout
from terra.generation.vllm_backend import VLLMBackend


def profile_steps(backend: VLLMBackend, layout: TokenLayout, args: argparse.Namespace) -> dict:
    """Where a single-stream decode step's time goes, per generated token, with the engine core in-process.

    One frame with vLLM's scheduler, model runner (input preparation + CUDA-graph launch), sampler and output
    processing wrapped in timers (what is left of ``engine.step`` is mostly waiting for the GPU), then one frame
    under torch.profiler: the GPU's kernel time, busy (union of kernel intervals) against the frame's span.
    """
    timers = step_timers(backend)
    step = CallTimer(backend.engine, "step")
    row = timed_generate(backend, make_requests(layout, 1, args.context, 1, seed=20_000), SAMPLING)
    tokens = layout.image_tokens
    cpu = {name: 1e3 * t.seconds / tokens for name, t in timers.items()}
    cpu["rest of engine.step (waiting for the GPU, glue)"] = 1e3 * step.seconds / tokens - sum(cpu.values())

    result: dict[str, Any] = {
        "tokens": tokens,
        "ms_per_token_unprofiled": 1e3 * row["wall_s"] / tokens,
        "engine_step_ms_per_token": 1e3 * step.seconds / tokens,
        "engine_steps_per_token": step.calls / tokens,
        "cpu_ms_per_token": cpu,
    }
    if not args.device.startswith("cuda"):
        return result
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        timed_generate(backend, make_requests(layout, 1, args.context, 1, seed=20_001), SAMPLING)
    trace = args.out / "profile_trace.json"
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"]
              if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    trace.unlink()
    busy, span = busy_time([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events])
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e["name"][:90], []).append(float(e["dur"]))
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:10]
    result.update(
        gpu_busy_ms_per_token=busy / 1e3 / tokens,
        gpu_span_ms_per_token=span / 1e3 / tokens,
        gpu_kernels_per_token=len(events) / tokens,
        top_kernels=[{"name": n, "ms_per_token": sum(d) / 1e3 / tokens, "calls_per_token": len(d) / tokens}
                     for n, d in top],
    )
    return result


def step_timers(backend: VLLMBackend) -> dict[str, CallTimer]:
    """Timers on the stages of ``engine.step``: vLLM's scheduler, model runner (input preparation + CUDA-graph
    launch), sampler and output processing; the engine core must run in this process."""
    engine = backend.engine
    core = getattr(engine.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError("this part needs vLLM's engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    return {
        "scheduler.schedule": CallTimer(core.scheduler, "schedule"),
        "executor.execute_model": CallTimer(core.model_executor, "execute_model"),
        "executor.sample_tokens": CallTimer(core.model_executor, "sample_tokens"),
        "scheduler.update_from_output": CallTimer(core.scheduler, "update_from_output"),
        "output_processor.process_outputs": CallTimer(engine.output_processor, "process_outputs"),
    }


def boundary_split(backend: VLLMBackend, layout: TokenLayout, args: argparse.Namespace) -> dict:
    """Where a batched run's wall time goes: ``--compare-batch-sizes``' first count of rollouts, ``--context``
    frames each, ``--batched-frames`` generated in lockstep, so every frame boundary submits that many requests.

    Timed: our request building (:meth:`VLLMBackend.frame_prompt`: ids and action items of the window so far),
    vLLM's input processing (``input_processor.process_inputs``: the action items' processor and the block
    hashes) and the rest of ``add_request``, the stages of ``engine.step`` (:func:`step_timers`; what is left of
    the step is mostly waiting for the GPU), and our loop (the rest of the wall time). On a GPU, NVML's busy
    share over the run. Seconds in total, per generated frame of one rollout, and as shares of the wall time.
    """
    engine = backend.engine
    timers = step_timers(backend)
    prompt = CallTimer(backend, "frame_prompt")
    process = CallTimer(engine.input_processor, "process_inputs")
    add, step = CallTimer(engine, "add_request"), CallTimer(engine, "step")
    count = args.compare_list[0]
    requests = make_requests(layout, count, args.context, args.batched_frames, seed=30_000)
    with GpuBusyMonitor() as busy:
        start = time.time()
        row = timed_generate(backend, requests, SAMPLING)
        end = time.time()
    seconds = {
        "ours: frame_prompt (request building)": prompt.seconds,
        "vLLM: input_processor.process_inputs": process.seconds,
        "vLLM: rest of add_request": add.seconds - process.seconds,
        **{f"vLLM: {name}": t.seconds for name, t in timers.items()},
        "vLLM: rest of engine.step (waiting for the GPU, glue)": step.seconds - sum(t.seconds for t in timers.values()),
        "ours: the rest of the loop": row["wall_s"] - step.seconds - add.seconds - prompt.seconds,
    }
    frames = count * args.batched_frames
    return {
        "rollouts": count, "context": args.context, "frames_per_rollout": args.batched_frames,
        "wall_s": row["wall_s"], "frames_per_s": row["frames_per_s"], "engine_steps": step.calls,
        "requests": add.calls, "seconds": seconds,
        "ms_per_frame": {k: 1e3 * v / frames for k, v in seconds.items()},
        "share_pct": {k: 100 * v / row["wall_s"] for k, v in seconds.items()},
        "gpu_busy_pct": busy.busy_pct(start, end),
    }


def busy_time(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """Length of the union of ``(start, end)`` intervals (overlapping kernels count once) and their overall span."""
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    return busy, (end - min(a for a, _ in intervals)) if intervals else 0.0
