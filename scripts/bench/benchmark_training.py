"""Training speed and memory at Terra's shape (2.0 B parameters, random init): the trainer's own step
(terra/training/run.py, ``train_step``) on whole 25-frame windows (14,550 positions), one variant per call, one
JSON line out.

    python scripts/bench/benchmark_training.py --variant full --micro-batch 1 --out bench/train.jsonl
    python scripts/bench/benchmark_training.py --variant full --activation-checkpointing --micro-batch 2 --out ...
    python scripts/bench/benchmark_training.py --variant lora --out ...
    torchrun --standalone --nproc_per_node=2 scripts/bench/benchmark_training.py --variant full --out ...

Fine-tuning in 24 GiB (benchmarks/training.md, "Fine-tuning in 24 GiB"): ``--memory-cap-gib`` caps what this process may
allocate on the GPU (``torch.cuda.set_per_process_memory_fraction``; over it the run reports "out of memory"), to
measure each setting capped at 24 (or 16) GiB against uncapped. One H100, ``--steps 4`` (2 warm-up + 4 timed
steps), each meant to take about a minute; the unknown is the first warm-up step of ``adamw8bit``, which compiles
torchao's optimizer step once per weight shape (about ten shapes; a rerun on the same machine reuses the cache):

    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True   # under a cap, no OOM from fragmentation
    B="python scripts/bench/benchmark_training.py --steps 4 --out train_24gib.jsonl"
    $B --variant lora --compile                                   # today's uncapped LoRA: the speed to hold
    $B --variant lora --activation-checkpointing                  # LoRA, bf16 base (as the trainer keeps it on GPUs)
    $B --variant lora --activation-checkpointing --memory-cap-gib 24
    $B --variant lora --activation-checkpointing --compile
    $B --variant lora --activation-checkpointing --compile --memory-cap-gib 24
    $B --variant lora --activation-checkpointing --compile --memory-cap-gib 16
    $B --variant lora --activation-checkpointing 11 --compile     # half the layers recomputed: between the two
    $B --variant full --activation-checkpointing --optimizer adamw8bit --weights-dtype bfloat16
    $B --variant full --activation-checkpointing --optimizer adamw8bit --weights-dtype bfloat16 --memory-cap-gib 24
    $B --variant full --activation-checkpointing --optimizer adamw8bit --weights-dtype bfloat16 --compile
    $B --variant full --activation-checkpointing --optimizer adamw8bit --weights-dtype bfloat16 --compile \
       --memory-cap-gib 24
    $B --variant full --activation-checkpointing --optimizer adamw8bit --compile --memory-cap-gib 24   # float32 weights

``--optimizer adamw8bit`` needs torchao (``pip install 'terra-world-model[train8bit]'``; one 3.4 MB wheel, pure
Python for the optimizer).

Model FLOPs per window (the MFU numerator; recomputation is not counted): 6 x (decoder weights) x positions +
6 x (output layer) x trained positions + 6 x layers x hidden x positions^2 (causal attention, forward and
backward), against a dense bf16 peak of 989 TFLOP/s per H100 (``--peak-tflops``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from terra.core.atomic import json_text
from terra.models.presets import TERRA
from terra.training.data import ClipSet, TrainingData, Windows
from terra.training.distributed import start_processes, stop_processes
from terra.training.run import build_trainee, make_optimizer, train_step
from terra.training.settings import DTYPES, OPTIMIZERS, train_spec

CONF = Path(__file__).resolve().parents[2] / "conf"  # read directly: Hydra need not be installed
if str(CONF.parent / "scripts") not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(CONF.parent / "scripts"))

from bench.lib.cli import Parser, check_output, exit_2_on_input_error, in_range  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser("benchmark_training", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=("full", "lora"), default="full")
    parser.add_argument("--micro-batch", type=in_range(int, 1, 64), default=1, help="windows per GPU per step")
    parser.add_argument("--activation-checkpointing", nargs="?", const=True, default=False,
                        type=in_range(int, 1, TERRA["num_hidden_layers"]), metavar="N",
                        help="recompute every decoder layer in the backward pass, or the first N")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    parser.add_argument("--weights-dtype", choices=DTYPES, default="float32",
                        help="the trained weights' dtype (bfloat16 needs --optimizer adamw8bit)")
    parser.add_argument("--memory-cap-gib", type=in_range(float, 0, 4096, above=True),
                        help="cap this process's GPU memory (default: the whole GPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    parser.add_argument("--steps", type=in_range(int, 1, 10_000), default=6, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--peak-tflops", type=in_range(float, 0, 10**6, above=True), default=989.0,
                        help="dense bf16 peak of one GPU")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines file to append the result to")
    parser.add_argument("--profile", type=Path,
                        help="one process: also write the GPU kernels of two more steps, by time, here")
    args = parser.parse_args(argv)
    for flag, path in (("--out", args.out), ("--profile", args.profile)):
        if path is not None:
            check_output(path, flag)
    return args


def terra_spec(args: argparse.Namespace, world_size: int):
    """The trainer's settings for Terra's shape (conf/train_world_model.yaml with the benchmark's overrides)."""
    cfg = OmegaConf.load(CONF / "train_world_model.yaml")
    net = {f"net.{k}": TERRA[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "num_temporal_embeddings",
                                          "rms_norm_eps")}
    scratch = Path(tempfile.mkdtemp(prefix="benchmark_training-"))  # folders for the settings; left empty
    (scratch / "data").mkdir()
    overrides = {**net, "net.rope_theta": 10000.0, "data.tokens": scratch / "data", "output_dir": scratch / "run",
                 "finetune": "full",
                 "train.batch_size": args.micro_batch * world_size, "train.micro_batch_size": args.micro_batch,
                 "train.activation_checkpointing": args.activation_checkpointing, "train.compile": args.compile,
                 "train.optimizer": args.optimizer, "train.weights_dtype": args.weights_dtype,
                 "train.precision": "bf16", "train.device": "cuda"}
    cfg.merge_with(OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()]))
    return train_spec(cfg)


def random_data(clips: int) -> TrainingData:
    """``clips`` random 25-frame clips of Terra's token layout (a codebook of 2^18, 24 x 24 codes per frame)."""
    frames, codebook = TERRA["num_temporal_embeddings"], TERRA["vocab_size"] - 1
    rng = torch.Generator().manual_seed(0)
    parts = [(str(i), torch.randint(codebook, (frames, 576), generator=rng).numpy(),
              (torch.rand(frames, 6, 3, generator=rng) * 10).numpy(), None) for i in range(clips)]
    return TrainingData(ClipSet.concat(parts), ClipSet.concat(parts[:1]), codebook, (24, 24), "")


def model_flops_per_window(config, frames: int, trained_positions: int) -> float:
    """Forward + backward FLOPs of one window (module docstring)."""
    positions = frames * config.num_spatio_embeddings
    layer = sum(p.numel() for p in _layer_shapes(config).parameters())
    head = config.hidden_size * config.vocab_size
    attention = 6 * config.num_hidden_layers * config.hidden_size * positions**2
    return 6 * layer * config.num_hidden_layers * positions + 6 * head * trained_positions + attention


def _layer_shapes(config) -> torch.nn.Module:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    with torch.device("meta"):
        return LlamaDecoderLayer(config, 0)


def write_profile(path: Path, step) -> None:
    """The CUDA kernels of two calls of ``step``, grouped by name and sorted by total GPU time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6
    head = f"two steps: {wall:.3f} s wall, {busy:.3f} s in GPU kernels ({100 * busy / wall:.1f} % busy)\n"
    path.write_text(head + events.table(sort_by="self_cuda_time_total", row_limit=60, max_name_column_width=90))


@exit_2_on_input_error("benchmark_training")
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    processes = start_processes("cuda")
    if args.memory_cap_gib is not None:
        device = torch.cuda.current_device()  # processes.device may be "cuda" without an index
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap_gib * 2**30 / total), device)
    spec = terra_spec(args, processes.world_size)
    if args.variant == "lora":
        from dataclasses import replace

        from terra.training.settings import LoraBlock

        lora = LoraBlock(16, 32.0, 0.0, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                         True, True)
        spec = replace(spec, finetune="lora", lora=lora)
    data = random_data(8)
    torch.cuda.reset_peak_memory_stats()
    result = {"variant": args.variant, "gpus": processes.world_size, "micro_batch": args.micro_batch,
              "activation_checkpointing": args.activation_checkpointing, "compile": args.compile,
              "optimizer": args.optimizer, "weights_dtype": args.weights_dtype, "memory_cap_gib": args.memory_cap_gib,
              "device": torch.cuda.get_device_name()}
    times = []
    try:
        with torch.device(processes.device):  # weights initialised on the GPU (the trainer builds on the CPU)
            trainee = build_trainee(spec, data, processes)
        optimizer = make_optimizer(trainee.module, spec, processes.device)
        config = trainee.loss.lm.config
        result["parameters"] = sum(p.numel() for p in trainee.loss.lm.parameters())
        windows = Windows(torch.randint(TERRA["vocab_size"] - 1, (args.micro_batch, 25 * 576), device=processes.device),
                          torch.rand(args.micro_batch, 25 * 6, 3, device=processes.device) * 10, None)
        for i in range(args.steps + 2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            loss, _, _ = train_step(trainee, optimizer, windows, 1.0)
            float(loss)
            if i >= 2:
                times.append(time.perf_counter() - start)
        if args.profile is not None and not processes.distributed:
            write_profile(args.profile, lambda: float(train_step(trainee, optimizer, windows, 1.0)[0]))
    except torch.OutOfMemoryError:
        result["error"] = "out of memory"
    if times:
        step_s = statistics.median(times)
        flops = model_flops_per_window(config, 25, trainee.loss.targets_per_window)
        windows_per_s = args.micro_batch * processes.world_size / step_s
        result.update(step_s=step_s, windows_per_s=windows_per_s, tokens_per_s=windows_per_s * 25 * 582,
                      model_tflops_per_window=flops / 1e12,
                      mfu=windows_per_s * flops / processes.world_size / (args.peak_tflops * 1e12))
    result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30  # what the cap limits
    if processes.main:
        print(json_text(result), flush=True)
        with args.out.open("a") as fh:
            fh.write(json_text(result) + "\n")
    stop_processes(processes)


if __name__ == "__main__":
    sys.exit(main())
