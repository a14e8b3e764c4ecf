"""Where one single-stream decode step's time goes: vLLM's CPU-side stages and the GPU's kernel time."""

from __future__ import annotations

import argparse
import json
from typing import Any

from torch.profiler import ProfilerActivity, profile

from bench.engine_stats import CallTimer
from bench.parts import SAMPLING
from bench.rollouts import make_requests, timed_generate
from terra.generation.layout import TokenLayout
from terra.generation.vllm_backend import VLLMBackend


def profile_steps(backend: VLLMBackend, layout: TokenLayout, args: argparse.Namespace) -> dict:
    """Where a single-stream decode step's time goes, per generated token, with the engine core in-process.

    One frame with vLLM's scheduler, model runner (input preparation + CUDA-graph launch), sampler and output
    processing wrapped in timers (what is left of ``engine.step`` is mostly waiting for the GPU), then one frame
    under torch.profiler: the GPU's kernel time, busy (union of kernel intervals) against the frame's span.
    """
    engine = backend.engine
    core = getattr(engine.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError("the profile part needs vLLM's engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    timers = {
        "scheduler.schedule": CallTimer(core.scheduler, "schedule"),
        "executor.execute_model": CallTimer(core.model_executor, "execute_model"),
        "executor.sample_tokens": CallTimer(core.model_executor, "sample_tokens"),
        "scheduler.update_from_output": CallTimer(core.scheduler, "update_from_output"),
        "output_processor.process_outputs": CallTimer(engine.output_processor, "process_outputs"),
    }
    step = CallTimer(engine, "step")
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


def busy_time(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """Length of the union of ``(start, end)`` intervals (overlapping kernels count once) and their overall span."""
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    return busy, (end - min(a for a, _ in intervals)) if intervals else 0.0
