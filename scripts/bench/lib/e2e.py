"""The e2e part: the tokenizer's frames/s at full size, then one rollout through :class:`WorldModelPipeline`."""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from terra.decoder import write_video
from terra.tokenizer import ImageTokenizer, LFQTokenizer, load_tokenizer
from terra.tokenizer.lfq import TERRA_CONFIG

from bench.lib.models import read_config
from bench.lib.parts import SAMPLING
from bench.lib.rollouts import make_requests, timed_generate
from terra.contract.layout import TokenLayout
from terra.generation.rollout import RolloutRequest, WorldModelBackend
from terra.inputs.actions import actions_for_manoeuvre
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline, check_compatible


def make_tokenizer(args: argparse.Namespace) -> ImageTokenizer:
    """``--tokenizer``, else a random LFQ tokenizer that fits the model (Terra's: 288x512, 18x32, 2^18 codes)."""
    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    return LFQTokenizer(TINY_TOKENIZER if args.tiny else TERRA_CONFIG)


def measure_e2e(backend: WorldModelBackend, layout: TokenLayout, args: argparse.Namespace) -> dict:
    """Tokenizer frames/s at full size, then one rollout end to end: encode, generate, decode, write the video."""
    tokenizer = make_tokenizer(args)
    check_compatible(read_config(args), tokenizer)
    pipeline = WorldModelPipeline(tokenizer, backend, device=args.device)
    total = args.context + args.batched_frames
    generator = torch.Generator().manual_seed(0)
    frames = torch.rand(total, 3, *pipeline.image_size, generator=generator) * 2 - 1
    pipeline.decode(pipeline.encode(frames[:1]))  # warm-up: kernels of both directions
    timed_generate(backend, make_requests(layout, 1, args.context, 1, seed=10_000), SAMPLING)

    start = time.perf_counter()
    codes = pipeline.encode(frames)
    encoded = time.perf_counter()
    pipeline.decode(codes)
    decoded = time.perf_counter()
    out: dict[str, Any] = {"tokenizer": {
        "image_size": list(pipeline.image_size), "frames": total,
        "encode_frames_per_s": total / (encoded - start), "decode_frames_per_s": total / (decoded - encoded),
    }}

    start = time.perf_counter()
    context = pipeline.encode(frames[: args.context])
    encode_s = time.perf_counter() - start
    actions = actions_for_manoeuvre("curve_left", total)
    request = RolloutRequest(context, actions, args.batched_frames, seed=0)
    result = pipeline.generate([request], SAMPLING, progress=False)[0]
    written = time.perf_counter()
    write_video(args.out / args.e2e_video, result.frames)
    end = time.perf_counter()
    out["e2e"] = {
        "frames": total, "generated_frames": args.batched_frames, "encode_s": encode_s,
        "generate_s": result.timings["generate_s"], "decode_s": result.timings["decode_s"],
        "write_s": end - written, "total_s": end - start, "video": args.e2e_video, "decoding": result.pass_record(),
    }
    return out
