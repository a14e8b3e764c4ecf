"""The command line of scripts/bench/benchmark.py: flags, their checks and the values derived from them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from bench.lib.parts import PARTS
from terra.core.device import auto_dtype, resolve_device
from terra.core.errors import TerraInputError

# Engine arguments set from flags of their own (bench/lib/backends.py engine_settings); --engine-arg sets any other,
# the parts' own kv_cache_dtype and enforce_eager included.
FLAGGED_ENGINE_ARGS = {"dtype": "--dtype", "max_num_seqs": "--max-num-seqs",
                       "gpu_memory_utilization": "--gpu-memory-utilization"}
DESCRIPTION = "Speed of Terra's world model: Transformers vs vLLM, single stream and batched, on one GPU."


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command line; bad values raise :class:`TerraInputError`."""
    p = argparse.ArgumentParser(description=DESCRIPTION)
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--out", type=Path, default=Path("benchmark_results"),
                   help="folder for <part>.json and summary.json")
    p.add_argument("--model", help="benchmark this checkpoint folder instead of random weights of Terra's shape")
    p.add_argument("--tokenizer", help="tokenizer folder for the e2e part (default: random, sized for the model)")
    p.add_argument("--e2e-backend", choices=("vllm", "hf"), default="vllm", help="backend of the e2e part")
    p.add_argument("--e2e-video", default="e2e_rollout.mp4",
                   help="file the e2e part writes (.mp4, or .gif where ffmpeg is not installed)")
    p.add_argument("--tiny", action="store_true", help="a tiny random model (CPU smoke runs)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU) | bfloat16 | float16 | float32")
    p.add_argument("--context", type=int, default=3, help="context frames per rollout")
    p.add_argument("--single-frames", type=int, default=8, help="generated frames, single stream")
    p.add_argument("--hf-frames", type=int, default=8,
                   help="generated frames for the Transformers part (~54 s each on an H100)")
    p.add_argument("--batch-sizes", default="1,8,32,64", help="concurrent rollouts of the batched part")
    p.add_argument("--compare-batch-sizes", default="64", help="batch sizes of the plain and fp8 parts")
    p.add_argument("--batched-frames", type=int, default=22, help="generated frames per rollout when batched")
    p.add_argument("--greedy-frames", type=int, default=2, help="frames of the greedy rollout (FP8 agreement)")
    p.add_argument("--max-num-seqs", type=int, help="vLLM max_num_seqs (default: the largest batch size)")
    p.add_argument("--gpu-memory-utilization", type=float,
                   help="vLLM's share of device memory (default 0.9; 0.1 on CPU)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="extra vllm.LLM argument (YAML value), e.g. async_scheduling=true; repeatable")
    p.add_argument("--requests", choices=("per_frame", "streaming"), default="per_frame",
                   help="vLLM request path of the Terra parts: a request per frame, or a streaming-input request per "
                        "window (terra/generation/vllm_streaming.py)")
    p.add_argument("--part-timeout", type=float, default=3600, help="seconds before a part's subprocess is killed")
    p.add_argument("--table", action="store_true", help="only print the table of the JSON files already in --out")
    p.add_argument("--worker", choices=sorted(PARTS), help=argparse.SUPPRESS)
    args = p.parse_args(list(argv))

    args.part_names = [x for x in args.parts.split(",") if x]
    unknown = [x for x in args.part_names if x not in PARTS]
    if unknown:
        raise TerraInputError(f"--parts has unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    args.batch_list = _int_list(args.batch_sizes, "--batch-sizes")
    args.compare_list = _int_list(args.compare_batch_sizes, "--compare-batch-sizes")
    for flag in ("context", "single_frames", "hf_frames", "batched_frames", "greedy_frames"):
        if getattr(args, flag) < 1:
            raise TerraInputError(f"--{flag.replace('_', '-')} must be at least 1 (got {getattr(args, flag)})")
    timed = [name for name in args.part_names if PARTS[name].in_process]
    if args.requests == "streaming" and timed:
        raise TerraInputError(f"the {' and '.join(timed)} part(s) time the synchronous engine's steps; run them with "
                              "--requests per_frame")
    if args.model and args.tiny:
        raise TerraInputError("--model and --tiny exclude each other; drop one")
    for flag, path in (("--model", args.model), ("--tokenizer", args.tokenizer)):
        if path and not (Path(path) / "config.json").is_file():
            raise TerraInputError(f"{flag} {path} has no config.json; pass a saved checkpoint folder")
    args.engine_kwargs = engine_arguments(args.engine_arg, FLAGGED_ENGINE_ARGS)
    args.device = resolve_device(args.device)
    args.dtype = auto_dtype(args.device, args.dtype)
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = 0.9 if args.device.startswith("cuda") else 0.1
    if args.max_num_seqs is None:
        args.max_num_seqs = max(args.batch_list + args.compare_list)
    return args


def engine_arguments(items: Sequence[str], flagged: Mapping[str, str]) -> dict[str, Any]:
    """``--engine-arg KEY=VALUE`` items (VALUE read as YAML) as engine keyword arguments; a key with a flag of its
    own (``flagged``: key -> flag) is refused. Also scripts/checks/check_jacobi_vllm.py's."""
    kwargs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TerraInputError(f"--engine-arg {item!r} is not KEY=VALUE; e.g. --engine-arg async_scheduling=true")
        if key in flagged:
            raise TerraInputError(f"--engine-arg {key} has its own flag; use {flagged[key]} instead")
        kwargs[key] = yaml.safe_load(value)
    return kwargs


def _int_list(text: str, flag: str) -> list[int]:
    """``1,8,32`` as integers; anything else (or a value below 1) is a one-line error naming ``flag``."""
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise TerraInputError(f"{flag} must be a comma list of positive integers (got {text!r}), e.g. 1,8,32,64")
    return values
