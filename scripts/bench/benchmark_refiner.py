"""Speed of Terra's video refiner (decoder=refiner) with random weights: seconds, peak GPU memory, the split
(token decode, conditioning encode, UNet steps, temporal decode) and the UNet's achieved TFLOP/s, as JSON.

Cases: one 25-frame refinement pass and one 47-frame sample (ACT-Bench: 3 context + 44 generated frames, two
overlapping passes). The networks are Terra's at full size in bf16 with random weights (speed does not depend
on the values); the tokenizer is Terra's LFQ at full size. A warm-up refinement of one step runs first (and
compiles the UNet with --compile). UNet FLOPs are counted once per input shape with
``torch.utils.flop_counter.FlopCounterMode`` and multiplied by the calls each case makes.

    python scripts/bench/benchmark_refiner.py --out refiner.json                       # H100 / H200, bf16
    python scripts/bench/benchmark_refiner.py --compile --channels-last --out refiner_compiled.json
    python scripts/bench/benchmark_refiner.py --preset tiny --device cpu --frames 5,8  # a smoke run on a CPU
"""

from __future__ import annotations

import dataclasses
import platform
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing
SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import Parser, check_output, device_name, exit_2_on_input_error, in_range, listed  # noqa: E402
from terra.core.device import resolve_device  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.decoder.refiner import TERRA, plan_passes, preset  # noqa: E402
from terra.decoder.refiner.model import VideoRefiner  # noqa: E402
from terra.decoder.refiner.sampler import conditioning_vector  # noqa: E402
from terra.tokenizer import LFQTokenizer  # noqa: E402
from terra.tokenizer.lfq import TERRA_CONFIG  # noqa: E402

TINY_TOKENIZER = {"encoder_decoder_config": {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "z_channels": 5},
                  "image_size": [16, 24]}


def random_init(module: torch.nn.Module, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
    """Give a meta-device module random weights on ``device``: matrices and kernels N(0, 1/fan_in), norm
    scales 1, biases and mixing factors 0 (activations stay finite through the network)."""
    module.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if param.ndim >= 2:
                fan_in = param[0].numel()
                param.copy_(torch.randn(param.shape, generator=generator, device=device) * fan_in**-0.5)
            else:
                param.fill_(1.0 if name.endswith("weight") else 0.0)
        for buffer in module.buffers():
            buffer.zero_()
    module.to(dtype=dtype)


def unet_flops(refiner: VideoRefiner, frames: int, batch: int) -> int:
    """FLOPs of one UNet call on ``batch`` branches of ``frames`` frames (counted on the uncompiled UNet)."""
    config, dtype, device = refiner.config, refiner.dtype, refiner.device
    unet = getattr(refiner.unet, "_orig_mod", refiner.unet)
    h, w = config.latent_size
    sample = torch.zeros(batch, frames, 2 * config.latent_channels, h, w, device=device, dtype=dtype)
    context = torch.zeros(batch, 1, config.context_dim, device=device, dtype=dtype)
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        unet(sample, torch.tensor(1.0), encoder_hidden_states=context,
             added_time_ids=conditioning_vector(config, batch, device), return_dict=False)
    return counter.get_total_flops()


def run_case(refiner: VideoRefiner, tokenizer: LFQTokenizer, frames: int, seed: int) -> dict:
    """Refine ``frames`` random codes once; seconds, peak memory, split and UNet throughput."""
    config, device = refiner.config, refiner.device
    codes = torch.randint(0, tokenizer.codebook_size, (frames, *tokenizer.grid_shape),
                          generator=torch.Generator().manual_seed(seed))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    video = refiner.refine(codes, tokenizer, seed=seed)
    seconds = time.perf_counter() - start
    passes = plan_passes(frames, config.num_frames, config.min_overlap)
    branches = 1 if config.guidance == "published" else 2
    flops = sum(unet_flops(refiner, end - begin, branches) for begin, end, _ in passes) * config.num_steps
    unet_s = video.timings["unet_s"]
    return {
        "frames": frames, "passes": [[begin, end] for begin, end, _ in passes], "seconds": round(seconds, 3),
        "split_s": {k: round(v, 3) for k, v in video.timings.items()},
        "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
        "unet_calls": len(passes) * config.num_steps, "unet_tflop": round(flops / 1e12, 3),
        "unet_tflops_per_s": round(flops / unet_s / 1e12, 1) if unet_s > 0 else None,
        "output_shape": list(video.frames.shape),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = Parser("benchmark_refiner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="terra", choices=("terra", "tiny"), help="terra (full size) | tiny "
                        "(smoke run)")
    parser.add_argument("--device", type=device_name, default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--frames", type=listed(in_range(int, 1, 1000)), default="25,47",
                        help="comma-separated video lengths to refine")
    parser.add_argument("--steps", type=in_range(int, 1, 1000), default=None,
                        help="Euler steps per pass (default: the preset's 15)")
    parser.add_argument("--guidance", default="published", choices=["published", "zero_frames"])
    parser.add_argument("--decode-batch", type=in_range(int, 1, 1024), default=None)
    parser.add_argument("--compile", action="store_true", help="torch.compile the UNet")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.out is not None:
        check_output(args.out, "--out")

    device, dtype = torch.device(resolve_device(args.device)), getattr(torch, args.dtype)
    changes = {"guidance": args.guidance, "compile": args.compile, "channels_last": args.channels_last}
    if args.steps is not None:
        changes["num_steps"] = args.steps
    if args.decode_batch is not None:
        changes["decode_batch"] = args.decode_batch
    config = preset(args.preset).replace(**changes)
    with torch.device("meta"):
        refiner = VideoRefiner(config)
        tokenizer = LFQTokenizer(TERRA_CONFIG if args.preset == "terra" else TINY_TOKENIZER)
    random_init(refiner, device, dtype)
    refiner.prepare(device, dtype)
    random_init(tokenizer, device, torch.float32, seed=1)
    tokenizer.eval()

    warm = time.perf_counter()  # one step over a full pass: kernels chosen, UNet compiled with --compile
    refiner.config = config.replace(num_steps=1)
    refiner.refine(torch.zeros(config.num_frames, *tokenizer.grid_shape, dtype=torch.long), tokenizer)
    refiner.config = config
    warmup_s = time.perf_counter() - warm

    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "diffusers": __import__("diffusers").__version__, "dtype": args.dtype,
        "preset": args.preset, "settings": {k: v for k, v in dataclasses.asdict(config).items()
                                            if k in ("num_steps", "guidance", "decode_batch", "compile",
                                                     "channels_last", "num_frames", "height", "width")},
        "unet_parameters": sum(p.numel() for p in refiner.unet.parameters()),
        "full_size": config.unet_channels == TERRA.unet_channels, "warmup_s": round(warmup_s, 2),
        "cases": [run_case(refiner, tokenizer, n, seed=i) for i, n in enumerate(args.frames)],
    }
    text = json_text(report, indent=2)
    print(text)
    if args.out is not None:
        write_text(args.out, text + "\n")
    return report


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_refiner")(main)())
