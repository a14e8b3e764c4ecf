#!/usr/bin/env python
"""Memory stays flat across many sequential generate calls in one process: no leaked engines or caches.

Each iteration is what one ``terra-generate`` call does through the Python API: load the tokenizer and the
world model (:meth:`WorldModelPipeline.from_pretrained`, Transformers backend), encode the context frames,
generate, decode, write a GIF, close the pipeline. A tiny random model and tokenizer are built in a temporary
folder first (nothing is downloaded). After every iteration the script records the process RSS (and the CUDA
allocator's bytes on a GPU) and checks, through weak references, that the pipeline's backend and tokenizer
were freed. It prints first/last/max and the slope, writes ``--out`` (JSON) if asked, and exits 1 when memory
grew by more than ``--max-growth-mb`` after the warm-up iterations or any object outlived its call::

    python scripts/bench/benchmark_memory.py                      # 100 iterations on the CPU, ~1 minute
    python scripts/bench/benchmark_memory.py --device cuda --out memory.json
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np
import psutil
import torch
import transformers

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import Parser, check_output, device_name, exit_2_on_input_error, in_range  # noqa: E402
from terra.config.sampling import SamplingConfig  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.core.device import resolve_device  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402
from terra.decoder import write_video  # noqa: E402
from terra.generation.rollout import RolloutRequest  # noqa: E402
from terra.inputs.actions import actions_for_manoeuvre  # noqa: E402
from terra.models import LlamaActionConfig, LlamaActionForCausalLM  # noqa: E402
from terra.models.presets import TINY, TINY_TOKENIZER, with_window  # noqa: E402
from terra.pipeline import WorldModelPipeline  # noqa: E402
from terra.tokenizer import LFQTokenizer  # noqa: E402

WORLD_MODEL = with_window(TINY, 8)  # Terra's layout rules at toy size, 8 frames per window
IMAGE_SIZE = tuple(TINY_TOKENIZER["image_size"])  # 8x downsampling -> 8x8 = 64 codes per frame


def build_models(folder: Path) -> tuple[Path, Path]:
    """Save a tiny random world model and a matching LFQ tokenizer (2^9 codes, 8x8 grid) under ``folder``."""
    torch.manual_seed(0)
    LlamaActionForCausalLM(LlamaActionConfig(**WORLD_MODEL)).save_pretrained(folder / "world_model")
    LFQTokenizer(TINY_TOKENIZER).save_pretrained(folder / "tokenizer")
    return folder / "world_model", folder / "tokenizer"


def one_call(world_model: Path, tokenizer: Path, video: Path, device: str, num_context: int, num_frames: int,
             seed: int) -> list[weakref.ref]:
    """One CLI-equivalent generate call; returns weak references to what must be freed once it returns."""
    pipeline = WorldModelPipeline.from_pretrained(world_model, tokenizer, backend="hf", device=device)
    try:
        rng = np.random.default_rng(seed)
        images = torch.from_numpy(rng.uniform(-1, 1, (num_context, 3, *IMAGE_SIZE)).astype(np.float32))
        actions = actions_for_manoeuvre("curve_left", num_context + num_frames)
        request = RolloutRequest(pipeline.encode(images), actions, num_frames, seed=seed)
        result = pipeline.generate([request], SamplingConfig(), progress=False)[0]
        write_video(video, result.frames)
        return [weakref.ref(obj) for obj in (pipeline.backend, pipeline.backend.model, pipeline.tokenizer)]
    finally:
        pipeline.close()


def analyse(rss_mb: Sequence[float], warmup: int, max_growth_mb: float) -> dict:
    """First/last/max, the slope after warm-up (MB per call), growth = mean of the last 10 − mean of the first
    10 after warm-up, and whether that growth stays within ``max_growth_mb``."""
    series = np.asarray(rss_mb, dtype=float)
    steady = series[warmup:]
    if len(steady) < 2:
        raise TerraInputError(f"need at least 2 iterations after the {warmup} warm-up ones; raise --iterations")
    window = max(1, min(10, len(steady) // 2))
    growth = float(steady[-window:].mean() - steady[:window].mean())
    slope = float(np.polyfit(np.arange(len(steady)), steady, 1)[0])
    return {
        "first_mb": float(series[0]),
        "last_mb": float(series[-1]),
        "max_mb": float(series.max()),
        "slope_mb_per_call": slope,
        "growth_mb": growth,
        "ok": growth <= max_growth_mb,
    }


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command line; bad values raise :class:`TerraInputError` (a bad flag value: one line, exit 2)."""
    window = WORLD_MODEL["num_temporal_embeddings"]
    p = Parser("benchmark_memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=in_range(int, 3, 100_000), default=100)
    p.add_argument("--warmup", type=in_range(int, 0, 100_000), default=10,
                   help="first iterations left out of slope and growth")
    p.add_argument("--frames", type=in_range(int, 1, window - 1), default=2, help="frames generated per call")
    p.add_argument("--context", type=in_range(int, 1, window - 1), default=2, help="context frames per call")
    p.add_argument("--max-growth-mb", type=in_range(float, 0, 1 << 20), default=20.0,
                   help="allowed RSS (and CUDA) growth after warm-up")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu | cuda | auto")
    p.add_argument("--out", type=Path, help="write the series and the verdict here (JSON)")
    args = p.parse_args(list(argv))
    if args.iterations < args.warmup + 2:
        raise TerraInputError(f"--iterations ({args.iterations}) must exceed --warmup ({args.warmup}) by at least 2")
    if args.context + args.frames > window:
        raise TerraInputError(f"--context and --frames must fit one window of {window} frames together")
    if args.out:
        check_output(args.out, "--out")
    args.device = resolve_device(args.device)
    return args


@exit_2_on_input_error("benchmark_memory")
def main(argv: Sequence[str] | None = None) -> int:
    """Run the iterations; 0 when memory stayed flat and nothing leaked, 1 otherwise, 2 for bad arguments."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    transformers.utils.logging.disable_progress_bar()
    process = psutil.Process()
    cuda = args.device.startswith("cuda")
    rss, cuda_mb, leaked = [], [], 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="terra_memory_") as tmp:
        world_model, tokenizer = build_models(Path(tmp))
        for i in range(args.iterations):
            refs = one_call(world_model, tokenizer, Path(tmp) / "rollout.gif", args.device, args.context, args.frames,
                            i)
            gc.collect()
            leaked += sum(ref() is not None for ref in refs)
            rss.append(process.memory_info().rss / 2**20)
            if cuda:
                cuda_mb.append(torch.cuda.memory_allocated() / 2**20)
    report = {"iterations": args.iterations, "device": args.device, "seconds": time.perf_counter() - start,
              "leaked_objects": leaked, "rss": analyse(rss, args.warmup, args.max_growth_mb), "rss_mb": rss}
    if cuda:
        report["cuda"] = analyse(cuda_mb, args.warmup, args.max_growth_mb)
        report["cuda_allocated_mb"] = cuda_mb
    ok = leaked == 0 and report["rss"]["ok"] and report.get("cuda", {"ok": True})["ok"]
    report["ok"] = ok
    for name in ("rss", "cuda"):
        if name in report:
            r = report[name]
            print(f"{name}: first {r['first_mb']:.1f} MB, last {r['last_mb']:.1f} MB, max {r['max_mb']:.1f} MB, "
                  f"slope {1024 * r['slope_mb_per_call']:.1f} KB/call, growth after warm-up {r['growth_mb']:+.1f} MB")
    print(f"{args.iterations} calls in {report['seconds']:.1f} s; objects alive after their call: {leaked}; "
          f"{'flat' if ok else 'LEAK'} (limit {args.max_growth_mb} MB)")
    if args.out:
        write_text(args.out, json_text(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
