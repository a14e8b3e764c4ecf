#!/usr/bin/env python
"""Batch-rollout throughput on one GPU against several: one JSONL through ``scripts/rollout.py`` per count.

Builds, unless ``--model``/``--tokenizer``/``--demo`` name existing ones, a world model of Terra's published shape
with random bf16 weights and a random LFQ tokenizer of Terra's size (288x512 → 18x32 codes, 2^18 codes), writes
a JSONL of ``--samples`` samples in Terra's format (three rendered context frames each from the synthetic world,
manoeuvres cycling through the named ones), then runs ``scripts/rollout.py`` once per entry of ``--gpus``
(``num_gpus`` values; 1 = in-process, 2 = two spawned engines, one per GPU), each into a fresh output folder.

Per run it reports the wall time of the whole command (engine start-up included) and, from the manifest, the
generation span: from the earliest sample's start to the last sample written. Samples/s and generated
frames/s are over that span, so the speed-up compares the rollout work, not start-up. Writes ``OUT/<run>.json``
and ``OUT/summary.json`` and prints a table::

    python scripts/benchmark_rollout.py --gpus 1,2 --samples 256 --frames 8 --out bench_rollout
    python scripts/benchmark_rollout.py --demo --backend hf --gpus 0 --samples 4 --frames 2 --out /tmp/br  # CPU
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image

from terra.batch import DEMO, read_manifest
from terra.errors import TerraInputError
from terra.models import LlamaActionConfig, LlamaActionForCausalLM
from terra.models.presets import TERRA
from terra.sim import sample_frames
from terra.trajectory import MANOEUVRES
from tokenizer import LFQTokenizer, load_tokenizer
from tokenizer.atomic import write_text
from tokenizer.lfq import TERRA_CONFIG

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command line; bad values raise :class:`TerraInputError`."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmark_rollout"), help="folder for models, samples, runs, JSON")
    p.add_argument("--gpus", default="1,2", help="comma list of num_gpus values, one run each (0 = CPU)")
    p.add_argument("--samples", type=int, default=256, help="samples in the JSONL")
    p.add_argument("--frames", type=int, default=8, help="frames generated per sample")
    p.add_argument("--max-concurrent", type=int, default=64, help="rollouts per generate call (per engine)")
    p.add_argument("--backend", default="vllm", choices=("vllm", "hf", "auto"), help="rollout backend")
    p.add_argument("--format", default="gif", choices=("gif", "mp4", "png"), help="video format written per sample")
    p.add_argument("--model", help="world model folder (default: Terra's shape, random weights, written under OUT)")
    p.add_argument("--tokenizer", help="tokenizer folder (default: a random Terra-sized LFQ tokenizer under OUT)")
    p.add_argument("--demo", action="store_true", help="use the shipped demo model and tokenizer")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Hydra override for scripts/rollout.py, e.g. +backend.options.kv_cache_dtype=fp8")
    args = p.parse_args(list(argv))
    try:
        args.gpu_list = [int(x) for x in args.gpus.split(",") if x]
    except ValueError:
        args.gpu_list = []
    if not args.gpu_list or min(args.gpu_list) < 0:
        raise TerraInputError(f"--gpus must be a comma list of GPU counts >= 0 (got {args.gpus!r}), e.g. 1,2")
    for flag in ("samples", "frames", "max_concurrent"):
        if getattr(args, flag) < 1:
            raise TerraInputError(f"--{flag.replace('_', '-')} must be at least 1 (got {getattr(args, flag)})")
    if args.demo and (args.model or args.tokenizer):
        raise TerraInputError("--demo uses the shipped model and tokenizer; drop --model/--tokenizer or --demo")
    for flag, path in (("--model", args.model), ("--tokenizer", args.tokenizer)):
        if path and not (Path(path) / "config.json").is_file():
            raise TerraInputError(f"{flag} {path} has no config.json; pass a saved checkpoint folder")
    return args


def random_models(out: Path, model: str | None, tokenizer: str | None) -> tuple[str, str]:
    """The given folders, else a Terra-shaped world model (random bf16 weights) and LFQ tokenizer under ``out``."""
    model_dir, tokenizer_dir = out / "models" / "world_model", out / "models" / "tokenizer"
    if model is None and not (model_dir / "config.json").is_file():
        torch.manual_seed(0)
        config = LlamaActionConfig(**TERRA)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            LlamaActionForCausalLM._from_config(config, dtype=torch.bfloat16).save_pretrained(model_dir)
    if tokenizer is None and not (tokenizer_dir / "config.json").is_file():
        torch.manual_seed(1)
        LFQTokenizer(TERRA_CONFIG).save_pretrained(tokenizer_dir)
    return str(Path(model or model_dir).resolve()), str(Path(tokenizer or tokenizer_dir).resolve())


def write_samples(out: Path, count: int, height: int, width: int) -> Path:
    """``count`` Terra-format samples: three rendered context frames each (PNG) and a named manoeuvre."""
    path = out / "samples.jsonl"
    frames_dir = out / "context"
    frames_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        names = [f"{i:05d}_{k}.png" for k in range(3)]
        if not all((frames_dir / n).is_file() for n in names):
            for name, frame in zip(names, sample_frames(3, height, width, seed=i)):
                Image.fromarray(frame).save(frames_dir / name)
        lines.append(json.dumps({"sample_id": i, "context": [f"context/{n}" for n in names],
                                 "manoeuvre": MANOEUVRES[i % len(MANOEUVRES)]}))
    write_text(path, "\n".join(lines) + "\n")
    return path


def run_rollouts(args: argparse.Namespace, samples: Path, model: tuple[str, str], num_gpus: int) -> dict[str, Any]:
    """One ``scripts/rollout.py`` run; its wall time, counts and the manifest's generation span."""
    run_dir = args.out / f"run_gpus{num_gpus}"
    overrides = [
        f"samples={samples}", f"output.dir={run_dir}", f"num_frames={args.frames}", f"num_gpus={num_gpus}",
        f"max_concurrent={args.max_concurrent}", f"backend={args.backend}", f"output.formats=[{args.format}]",
        "resume=false", "progress=false",
        *(("device=cpu",) if num_gpus == 0 else ()),
        *(("model=demo", "tokenizer=demo") if args.demo else
          ("model=terra_v1", f"model.world_model={model[0]}", "tokenizer=terra_lfq", f"tokenizer.path={model[1]}")),
        *args.override,
    ]
    command = [sys.executable, str(ROOT / "scripts" / "rollout.py"), *overrides]
    print(f"[benchmark_rollout] num_gpus={num_gpus}: {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT)
    wall = time.perf_counter() - start
    records = read_manifest(run_dir / "manifest.jsonl")
    ok = [r for r in records if r["status"] == "ok"]
    row: dict[str, Any] = {
        "num_gpus": num_gpus, "exit_code": proc.returncode, "command": shlex.join(["scripts/rollout.py", *overrides]),
        "wall_s": wall, "samples": len(records), "ok": len(ok), "failed": len(records) - len(ok),
        "frames_per_sample": args.frames, "gpus_used": sorted({str(r.get("gpus", "in-process")) for r in ok}),
    }
    if ok:
        span = max(r["finished_at"] for r in ok) - min(r["finished_at"] - r["seconds"] for r in ok)
        row.update(span_s=span, samples_per_s=len(ok) / span, frames_per_s=len(ok) * args.frames / span)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """One line per run plus the speed-up of each against the first."""
    header = f"{'num_gpus':>8} {'ok':>5} {'failed':>6} {'wall s':>8} {'span s':>8} {'samples/s':>10} {'frames/s':>9} {'speed-up':>8}"
    lines = [header, "-" * len(header)]
    base = rows[0].get("frames_per_s")
    for r in rows:
        fps = r.get("frames_per_s")
        speedup = f"{fps / base:.2f}x" if fps and base else "-"
        lines.append(f"{r['num_gpus']:>8} {r['ok']:>5} {r['failed']:>6} {r['wall_s']:>8.1f} {r.get('span_s', 0):>8.1f} "
                     f"{r.get('samples_per_s', 0):>10.2f} {fps or 0:>9.2f} {speedup:>8}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; 2 for bad input, 1 when a run failed a sample, else 0."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except TerraInputError as err:
        print(f"benchmark_rollout: error: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.demo:
        model = ("", "")
        height, width = load_tokenizer(str(DEMO / "tokenizer")).image_size
    else:
        model = random_models(args.out, args.model, args.tokenizer)
        height, width = load_tokenizer(model[1]).image_size
    samples = write_samples(args.out, args.samples, height, width)
    rows = []
    for num_gpus in args.gpu_list:
        rows.append(run_rollouts(args, samples.resolve(), model, num_gpus))
        write_text(args.out / f"run_gpus{num_gpus}.json", json.dumps(rows[-1], indent=1))
    summary = {"command": shlex.join(["scripts/benchmark_rollout.py", *(sys.argv[1:] if argv is None else argv)]),
               "runs": rows}
    if len(rows) > 1 and rows[0].get("frames_per_s"):
        summary["speedup_vs_first"] = {r["num_gpus"]: r.get("frames_per_s", 0) / rows[0]["frames_per_s"] for r in rows}
    write_text(args.out / "summary.json", json.dumps(summary, indent=1))
    print(table(rows))
    return 0 if all(r["exit_code"] == 0 and r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
