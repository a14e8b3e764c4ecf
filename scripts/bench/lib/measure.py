"""One part, run inside its worker subprocess: build the backend, take its measurements, return its record."""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import torch

from bench.lib.backends import build_backend, engine_settings
from bench.lib.e2e import measure_e2e
from bench.lib.engine_stats import CallTimer, prefix_summary
from bench.lib.environment import GpuMemoryMonitor, environment
from bench.lib.models import read_config, read_layout
from bench.lib.parts import GREEDY, PARTS, SAMPLING, Part
from bench.lib.profiling import boundary_split, profile_steps
from bench.lib.rollouts import make_requests, timed_generate
from terra.config.memory import ModelShape
from terra.contract.layout import TokenLayout
from terra.generation.hf_backend import HFBackend
from terra.generation.rollout import WorldModelBackend


def run_part(name: str, args: argparse.Namespace) -> dict:
    """Build the part's backend, run its measurements, return its record (the worker writes it)."""
    part = PARTS[name]
    layout = read_layout(args)
    engine = engine_settings(part, args)
    record: dict[str, Any] = {"part": name, "description": part.description}
    record["settings"] = {
        "model": args.model or ("tiny random" if args.tiny else "Terra shape, random weights"),
        "dtype": args.dtype, "context_frames": args.context, "tokens_per_frame": layout.image_tokens,
        "enforce_eager": engine["enforce_eager"], "kv_cache_dtype": engine["kv_cache_dtype"],
        "sampling": dataclasses.asdict(SAMPLING),
    }
    if part.backend == "e2e":
        record["settings"]["backend"] = args.e2e_backend
    if part.backend in ("terra", "plain") or (part.backend == "e2e" and args.e2e_backend == "vllm"):
        record["settings"].update(max_num_seqs=args.max_num_seqs,
                                  gpu_memory_utilization=engine["gpu_memory_utilization"],
                                  engine_kwargs=args.engine_kwargs,
                                  requests="per_frame" if part.backend == "plain" else args.requests)
    monitor = GpuMemoryMonitor(args.device)
    with monitor:
        t0 = time.perf_counter()
        backend = build_backend(part, args)
        record["startup_s"] = time.perf_counter() - t0
        try:
            record.update(measure_e2e(backend, layout, args) if part.backend == "e2e"
                          else measure(part, backend, layout, args))
        finally:
            backend.close()
    record["memory"] = monitor.report()
    if args.device.startswith("cuda") and torch.cuda.is_initialized():
        record["memory"]["torch_max_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9  # this process only
    record["elapsed_s"] = time.perf_counter() - t0
    record["env"] = environment(args.device)  # after the run: vLLM is imported by then
    return record


def measure(part: Part, backend: WorldModelBackend, layout: TokenLayout, args: argparse.Namespace) -> dict:
    """The part's timings on an already built backend (warm-up first, then fresh contexts per measurement)."""
    out: dict[str, Any] = {}
    engine = getattr(backend, "engine", None)
    sizes = {"batch": args.batch_list, "compare": args.compare_list}.get(part.batch_sizes, [])
    if engine is not None:
        cache = engine.vllm_config.cache_config
        tokens = (cache.num_gpu_blocks or 0) * cache.block_size
        # Terra's config: the plain Llama's engine has its KV shape too (bench/lib/models.py writes its config from it)
        per_token = ModelShape.from_config(read_config(args)).kv_bytes_per_token(cache.cache_dtype, args.dtype)
        longest = args.context + max(args.single_frames, args.batched_frames if sizes else 0)
        out["engine"] = {
            "block_size": cache.block_size, "kv_cache_blocks": cache.num_gpu_blocks, "kv_cache_tokens": tokens,
            "kv_bytes_per_token": per_token, "kv_cache_gb": tokens * per_token / 1e9,
            # what the largest measurement holds at its end (no sharing across rollouts): the memory it needs
            "kv_needed_gb": max([1, *sizes]) * min(longest * layout.frame_span, layout.window_positions) * per_token
            / 1e9,
        }
    timed = engine is not None and hasattr(engine, "step")  # the synchronous engine (not --requests streaming)
    if timed:
        step, add = CallTimer(engine, "step"), CallTimer(engine, "add_request")
    stats = getattr(backend, "frame_stats", None)  # grows over calls; each measurement takes its own slice

    def measured(count: int, frames: int, seed: int) -> dict:
        """Time ``count`` rollouts of ``frames`` frames; add engine call times and their prefix-cache use."""
        first_stat = len(stats) if stats is not None else 0
        if timed:
            step.reset()
            add.reset()
        row = timed_generate(backend, make_requests(layout, count, args.context, frames, seed), SAMPLING)
        if timed:
            row.update(engine_steps=step.calls, engine_step_s=step.seconds, add_request_s=add.seconds)
        if stats is not None:
            row["prefix"] = prefix_summary(stats[first_stat:], out["engine"]["block_size"], layout.action_tokens)
            if count == 1:
                row["prefix_per_frame"] = [
                    {"frame": s.frame, "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens}
                    for s in stats[first_stat:]
                ]
        return row

    if part.backend == "hf":
        _warm_up_hf(backend, layout)
    else:
        timed_generate(backend, make_requests(layout, 1, args.context, 1, seed=10_000), SAMPLING)
    if part.single:
        out["single"] = measured(1, args.hf_frames if part.backend == "hf" else args.single_frames, seed=0)
    if part.profile:
        out["profile"] = profile_steps(backend, layout, args)
    if part.boundary:
        out["boundary"] = boundary_split(backend, layout, args)
    out["batched"] = []
    for b in sizes:
        out["batched"].append(measured(b, args.batched_frames, seed=1000 * b))
        print(f"[benchmark] {b} rollouts: {out['batched'][-1]['frames_per_s']:.2f} frames/s", flush=True)
    if part.greedy:
        request = make_requests(layout, 1, args.context, args.greedy_frames, seed=7)
        out["greedy_tokens"] = backend.generate(request, GREEDY, progress=False)[0].reshape(-1).tolist()
    return out


def _warm_up_hf(backend: HFBackend, layout: TokenLayout) -> None:
    """Load the GPU kernels before timing: one frame's prefill and one single-token step, without a cache."""
    ids = torch.full((1, layout.frame_span), layout.slot_token_id, dtype=torch.long, device=backend.device)
    ids[:, : layout.image_tokens] = 0
    conditions = torch.zeros(1, layout.slot_tokens, layout.action_dim, device=backend.device)
    positions = torch.arange(layout.frame_span, device=backend.device)[None]
    with torch.inference_mode():
        backend.model(input_ids=ids, conditions=conditions, position_ids=positions, logits_to_keep=1)
        backend.model(input_ids=ids[:, :1], position_ids=positions[:, :1], logits_to_keep=1)
    if backend.device.type == "cuda":
        torch.cuda.synchronize()
