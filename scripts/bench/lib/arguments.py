"""The command line of scripts/bench/benchmark.py: flags, their checks and the values derived from them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from bench.lib.cli import Parser, check_output, device_name, existing, in_range, listed, one_of
from bench.lib.parts import PARTS
from terra.core.device import auto_dtype, resolve_device
from terra.core.errors import TerraInputError

# Engine arguments set from flags of their own (bench/lib/backends.py engine_settings); --engine-arg sets any other,
# the parts' own kv_cache_dtype and enforce_eager included.
FLAGGED_ENGINE_ARGS = {"dtype": "--dtype", "max_num_seqs": "--max-num-seqs",
                       "gpu_memory_utilization": "--gpu-memory-utilization"}
MAX_FRAMES = 10_000  # generated frames of a rollout (terra-drive's num_steps bound)
MAX_BATCH = 4096  # rollouts at once
DESCRIPTION = "Speed of Terra's world model: Transformers vs vLLM, single stream and batched, on one GPU."


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command line; bad values raise :class:`TerraInputError` (a bad flag value: one line, exit 2)."""
    model = existing("folder", "config.json")
    frames = in_range(int, 1, MAX_FRAMES)
    batch_sizes = listed(in_range(int, 1, MAX_BATCH))
    p = Parser("benchmark", description=DESCRIPTION)
    p.add_argument("--parts", type=listed(one_of(*PARTS)), default=",".join(PARTS),
                   help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--out", type=Path, default=Path("benchmark_results"),
                   help="folder for <part>.json and summary.json")
    p.add_argument("--model", type=model, help="benchmark this checkpoint folder instead of random weights of Terra's "
                   "shape")
    p.add_argument("--tokenizer", type=model, help="tokenizer folder for the e2e part (default: random, sized for the "
                   "model)")
    p.add_argument("--e2e-backend", choices=("vllm", "hf"), default="vllm", help="backend of the e2e part")
    p.add_argument("--e2e-video", default="e2e_rollout.mp4",
                   help="file the e2e part writes in --out (.mp4, or .gif where ffmpeg is not installed)")
    p.add_argument("--tiny", action="store_true", help="a tiny random model (CPU smoke runs)")
    p.add_argument("--device", type=device_name, default="auto", help="auto | cuda | cpu")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"),
                   help="auto (bf16 on GPU, fp32 on CPU) | bfloat16 | float16 | float32")
    p.add_argument("--context", type=in_range(int, 1, 24), default=3, help="context frames per rollout")
    p.add_argument("--single-frames", type=frames, default=8, help="generated frames, single stream")
    p.add_argument("--hf-frames", type=frames, default=8,
                   help="generated frames for the Transformers part (~54 s each on an H100)")
    p.add_argument("--batch-sizes", type=batch_sizes, default="1,8,32,64", help="concurrent rollouts of the batched "
                   "part")
    p.add_argument("--compare-batch-sizes", type=batch_sizes, default="64", help="batch sizes of the plain and fp8 "
                   "parts")
    p.add_argument("--batched-frames", type=frames, default=22, help="generated frames per rollout when batched")
    p.add_argument("--greedy-frames", type=frames, default=2, help="frames of the greedy rollout (FP8 agreement)")
    p.add_argument("--max-num-seqs", type=in_range(int, 1, MAX_BATCH),
                   help="vLLM max_num_seqs (default: the largest batch size)")
    p.add_argument("--gpu-memory-utilization", type=in_range(float, 0, 1, above=True),
                   help="vLLM's share of device memory (default 0.9; 0.1 on CPU)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="extra vllm.LLM argument (YAML value), e.g. async_scheduling=true; repeatable")
    p.add_argument("--requests", choices=("per_frame", "streaming"), default="per_frame",
                   help="vLLM request path of the Terra parts: a request per frame, or a streaming-input request per "
                        "window (terra/generation/vllm_streaming.py)")
    p.add_argument("--part-timeout", type=in_range(float, 0, 7 * 86400, above=True), default=3600,
                   help="seconds before a part's subprocess is killed")
    p.add_argument("--table", action="store_true", help="only print the table of the JSON files already in --out")
    p.add_argument("--worker", choices=sorted(PARTS), help=argparse.SUPPRESS)
    args = p.parse_args(list(argv))

    args.part_names = args.parts
    args.batch_list, args.compare_list = args.batch_sizes, args.compare_batch_sizes
    timed = [name for name in args.part_names if PARTS[name].in_process]
    if args.requests == "streaming" and timed:
        raise TerraInputError(f"the {' and '.join(timed)} part(s) time the synchronous engine's steps; run them with "
                              "--requests per_frame")
    if args.model and args.tiny:
        raise TerraInputError("--model and --tiny exclude each other; drop one")
    args.model, args.tokenizer = (str(path) if path else None for path in (args.model, args.tokenizer))
    if Path(args.e2e_video).name != args.e2e_video or Path(args.e2e_video).suffix not in (".mp4", ".gif"):
        raise TerraInputError(f"--e2e-video {args.e2e_video!r} must be a file name ending .mp4 or .gif (it is written "
                              "in --out)")
    if args.table and not args.out.is_dir():
        raise TerraInputError(f"--table reads the part JSON files in --out {args.out}, which is no folder")
    if not args.worker:
        check_output(args.out, "--out", [p for p in (args.model, args.tokenizer) if p], folder=True)
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
        try:
            kwargs[key] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise TerraInputError(f"--engine-arg {key}: {value!r} is not a YAML value ({' '.join(str(err).split())})"
                                  ) from None
    return kwargs
