"""Encode/decode throughput (frames/s) of the tokenizer families, random weights, CPU or CUDA, and on CUDA the
memory a decode batch takes above the weights (torch's peak allocation: what the ``memory`` presets count for the
app's own process, terra/config/memory.py ``MAIN_PROCESS``).

Models: ``lfq_terra`` (Terra's LFQ shape, 288x512 → 18x32, 2^18 codes), ``vq16`` (LlamaGen VQ-16 at
288x512) and ``lfq_demo`` (the demo tokenizer, 144x256 → 9x16, from conf/train_tokenizer/model/lfq_demo.yaml).
Prints a Markdown table (for benchmarks/tokenizer.md); ``--json`` also writes the rows to a file.

    python scripts/bench/benchmark_tokenizer.py --device cpu --frames 2
    python scripts/bench/benchmark_tokenizer.py --device cuda --dtype bfloat16 --batch-size 16 --frames 256
    python scripts/bench/benchmark_tokenizer.py --device cuda --models lfq_terra --batch-size 1,2,4,8,16 --frames 64 \
        --no-cudnn-benchmark
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from omegaconf import OmegaConf

from terra.core.atomic import json_text, write_text
from terra.core.device import resolve_device
from terra.tokenizer import ImageTokenizer, LFQTokenizer, VQTokenizer
from terra.tokenizer.lfq import TERRA_CONFIG
from terra.tokenizer.vq import VQ16_CONFIG

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(ROOT / "scripts"))

from bench.lib.cli import (  # noqa: E402
    THREADS, Parser, check_output, device_name, exit_2_on_input_error, in_range, listed, one_of)


def _demo() -> ImageTokenizer:
    model_cfg = OmegaConf.load(ROOT / "conf" / "train_tokenizer" / "model" / "lfq_demo.yaml")
    return LFQTokenizer(OmegaConf.to_container(model_cfg.config, resolve=True))


MODELS: dict[str, Callable[[], ImageTokenizer]] = {
    "lfq_terra": lambda: LFQTokenizer(TERRA_CONFIG),
    "vq16": lambda: VQTokenizer(VQ16_CONFIG),
    "lfq_demo": _demo,
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(fn: Callable[[], object], frames: int, batch: int, warmup: int, device: torch.device) -> float:
    """Frames per second of ``fn`` (one call = ``batch`` frames) over ``frames`` timed frames."""
    for _ in range(warmup):
        fn()
    _sync(device)
    calls = max(1, -(-frames // batch))
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return calls * batch / (time.perf_counter() - start)


def benchmark(name: str, device: torch.device, dtype: torch.dtype, batch: int, frames: int, warmup: int) -> dict:
    """One row: encode and decode frames/s of model ``name``."""
    torch.manual_seed(0)
    tok = MODELS[name]().to(device=device, dtype=dtype).eval()
    images = torch.rand(batch, 3, *tok.image_size, device=device) * 2 - 1
    codes = torch.randint(0, tok.codebook_size, (batch, *tok.grid_shape), device=device)
    with torch.inference_mode():
        encode = _rate(lambda: tok.encode(images), frames, batch, warmup, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            held = torch.cuda.memory_allocated(device)
        decode = _rate(lambda: tok.decode(codes), frames, batch, warmup, device)
    peak = (torch.cuda.max_memory_allocated(device) - held) / 2**30 if device.type == "cuda" else None
    return {
        "model": name, "family": tok.model_type, "input": "x".join(map(str, tok.image_size)),
        "codes": "x".join(map(str, tok.grid_shape)), "codebook": tok.codebook_size,
        "params_m": round(sum(p.numel() for p in tok.parameters()) / 1e6, 1), "device": _device_name(device),
        "dtype": str(dtype).replace("torch.", ""), "batch": batch, "threads": torch.get_num_threads(),
        "encode_fps": round(encode, 2), "decode_fps": round(decode, 2),
        "decode_peak_gib": None if peak is None else round(peak, 3),
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


@exit_2_on_input_error("benchmark_tokenizer")
def main(argv: list[str] | None = None) -> None:
    """Benchmark the models named by ``--models`` and print one Markdown row each."""
    parser = Parser("benchmark_tokenizer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=listed(one_of(*MODELS)), default="lfq_terra,vq16,lfq_demo",
                        help=f"comma list of {sorted(MODELS)}")
    parser.add_argument("--device", type=device_name, default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch-size", type=listed(in_range(int, 1, 1024)), default=None,
                        help="frames per call, or a comma list of them (default 1 on CPU, 16 on CUDA)")
    parser.add_argument("--frames", type=in_range(int, 1, 100_000), default=None,
                        help="timed frames per measurement (default 2 CPU, 256 CUDA)")
    parser.add_argument("--warmup", type=in_range(int, 0, 1000), default=1, help="untimed calls first")
    parser.add_argument("--threads", type=THREADS, default=None, help="torch CPU threads")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    parser.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction, default=True,
                        help="cuDNN's algorithm search (the apps leave it off: --no-cudnn-benchmark measures "
                        "their peak)")
    args = parser.parse_args(argv)
    if args.json:
        check_output(args.json, "--json")

    device = torch.device(resolve_device(args.device))
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
    gpu = device.type == "cuda"
    batches = args.batch_size or [16 if gpu else 1]
    frames = args.frames or (256 if gpu else 2)
    names = args.models

    rows = []
    columns = ["model", "family", "input", "codes", "codebook", "params (M)", "device", "dtype", "batch",
               "encode frames/s", "decode frames/s", "decode peak (GiB)"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join(["---"] * len(columns)) + "|")
    for name in names:
        for batch in batches:
            row = benchmark(name, device, getattr(torch, args.dtype), batch, frames, args.warmup)
            rows.append(row)
            print(f"| {row['model']} | {row['family']} | {row['input']} | {row['codes']} | {row['codebook']} | "
                  f"{row['params_m']} | {row['device']} | {row['dtype']} | {row['batch']} | {row['encode_fps']} | "
                  f"{row['decode_fps']} | {'-' if row['decode_peak_gib'] is None else row['decode_peak_gib']} |",
                  flush=True)
    if args.json:
        write_text(args.json, json_text(rows, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
