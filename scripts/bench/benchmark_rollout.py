#!/usr/bin/env python
"""Batch-rollout throughput: one JSONL through ``terra-rollout`` per engine count, in process or on Ray.

Builds, unless ``--model``/``--tokenizer``/``--demo`` name existing ones, a world model of Terra's published shape
with random bf16 weights and a random LFQ tokenizer of Terra's size (288x512 → 18x32 codes, 2^18 codes), writes
a JSONL of ``--samples`` samples in Terra's format (three rendered context frames each from the synthetic world,
manoeuvres cycling through the named ones), then runs ``terra-rollout`` once per entry of ``--gpus``
(``executor=local``: 0 = the CPU, 1 = one GPU) or of ``--actors`` (``executor=ray``: that many actors, one per
GPU, on a local Ray cluster the run starts), each into a fresh output folder. ``--actbench`` shapes the run
like Terra's ACT-Bench generation: 3 context + 44 generated frames per sample, MP4 written.

Per run it reports the wall time of the whole command (engine start-up included) and, from the manifest, the
span: from the earliest sample's start to the last sample written. Samples/s and generated frames/s are over
that span, so the speed-up compares the rollout work, not start-up; the projected wall time of ``--project``
samples (ACT-Bench: 2,286) is the run's start-up plus that many samples at the span's rate; where the run had a
first, full wave of rollouts and a smaller second one, it is also projected by waves (:func:`projection_by_waves`),
which does not count the small wave's slower steps against every sample. The generation
(from the same start to the last rollout leaving the engine, the manifest's ``generated_at``) gets its own
frames/s, and on a GPU the share of it in which a kernel ran (NVML, every 0.5 s; the trace is kept too).
Writes ``OUT/<run>.json`` and ``OUT/summary.json`` and prints a table::

    python scripts/bench/benchmark_rollout.py --executor ray --actors 1,2 --samples 512 --frames 8 --out bench_ray
    python scripts/bench/benchmark_rollout.py --executor ray --actors 1,2 --actbench --samples 256 --out bench_actbench
    python scripts/bench/benchmark_rollout.py --gpus 1 --samples 256 --frames 8 --out bench_rollout   # in process
    python scripts/bench/benchmark_rollout.py --gpus 1 --actbench --samples 256 --requests per_frame --out bench_pf
    python scripts/bench/benchmark_rollout.py --demo --backend hf --gpus 0 --samples 4 --frames 2 --out /tmp/br  # CPU
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

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(ROOT / "scripts"))

from bench.lib.cli import (  # noqa: E402
    Parser, check_output, exit_2_on_input_error, existing, in_range, listed, word_or)
from bench.lib.environment import GpuBusyMonitor  # noqa: E402
from bench.lib.models import random_tokenizer, random_world_model  # noqa: E402
from terra.batch import read_manifest  # noqa: E402
from terra.config.assets import DEMO  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402
from terra.inputs.trajectory import MANOEUVRES  # noqa: E402
from terra.models.presets import TERRA  # noqa: E402
from terra.sim import sample_frames  # noqa: E402
from terra.tokenizer import load_tokenizer  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.tokenizer.lfq import TERRA_CONFIG  # noqa: E402

ACTBENCH_FRAMES = 44  # Terra's ACT-Bench generation: 3 context frames, 44 generated, scored as MP4


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command line; bad values raise :class:`TerraInputError` (a bad flag value: one line, exit 2)."""
    model = existing("folder", "config.json")
    p = Parser("benchmark_rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmark_rollout"), help="folder for models, samples, runs, JSON")
    p.add_argument("--executor", default="local", choices=("local", "ray"), help="terra-rollout's executor")
    p.add_argument("--gpus", type=listed(in_range(int, 0, 64)), default="1",
                   help="executor=local: comma list of runs, 1 = one GPU, 0 = the CPU")
    p.add_argument("--actors", type=listed(in_range(int, 1, 64)), default="1,2",
                   help="executor=ray: comma list of actor counts, one run each")
    p.add_argument("--device", default="auto", choices=("auto", "cpu"), help="cpu: CPU actors (executor=ray)")
    p.add_argument("--samples", type=in_range(int, 1, 100_000), default=256, help="samples in the JSONL")
    p.add_argument("--frames", type=in_range(int, 1, 10_000), default=8, help="frames generated per sample")
    p.add_argument("--actbench", action="store_true", help="ACT-Bench's shape: 44 generated frames, MP4 written")
    p.add_argument("--project", type=in_range(int, 1, 10**7), default=2286,
                   help="samples whose wall time is projected (ACT-Bench's)")
    p.add_argument("--max-concurrent", type=word_or("auto", in_range(int, 1, 4096)), default="auto",
                   help="rollouts in flight per engine (auto: what fits)")
    p.add_argument("--backend", default="vllm", choices=("vllm", "hf", "auto"), help="rollout backend")
    p.add_argument("--requests", choices=("auto", "streaming", "per_frame"),
                   help="vLLM request path (backend.options.requests): a streaming-input request per window, a "
                        "request per frame, or auto (streaming where vLLM has it); default: the config's (per_frame)")
    p.add_argument("--format", default="gif", choices=("gif", "mp4", "png"), help="video format written per sample")
    p.add_argument("--model", type=model,
                   help="world model folder (default: Terra's shape, random weights, written under OUT)")
    p.add_argument("--tokenizer", type=model,
                   help="tokenizer folder (default: a random Terra-sized LFQ tokenizer under OUT)")
    p.add_argument("--demo", action="store_true", help="use the shipped demo model and tokenizer")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Hydra override for terra-rollout, e.g. +backend.options.kv_cache_dtype=fp8")
    args = p.parse_args(list(argv))
    if args.actbench:
        args.frames, args.format = ACTBENCH_FRAMES, "mp4"
    args.runs = args.gpus if args.executor == "local" else args.actors
    if args.executor == "local" and max(args.runs) > 1:
        raise TerraInputError("--gpus takes 0 or 1 with executor=local; compare GPUs with --executor ray "
                              f"--actors {','.join(map(str, args.gpus))}")
    if args.requests and args.backend != "vllm":
        raise TerraInputError(f"--requests picks vLLM's request path; it needs --backend vllm (got {args.backend})")
    if args.demo and (args.model or args.tokenizer):
        raise TerraInputError("--demo uses the shipped model and tokenizer; drop --model/--tokenizer or --demo")
    args.model, args.tokenizer = (str(path) if path else None for path in (args.model, args.tokenizer))
    check_output(args.out, "--out", [path for path in (args.model, args.tokenizer) if path], folder=True)
    return args


def random_models(out: Path, model: str | None, tokenizer: str | None) -> tuple[str, str]:
    """The given folders, else a Terra-shaped world model (random bf16 weights) and LFQ tokenizer under ``out``.

    Both are made on the CPU: this process only waits for ``terra-rollout`` and must hold no GPU memory beside
    its engine and writers (a model made on the GPU kept 4.5 GiB there for the whole run: benchmarks/rollout.md)."""
    model_dir, tokenizer_dir = out / "models" / "world_model", out / "models" / "tokenizer"
    if model is None and not (model_dir / "config.json").is_file():
        random_world_model(model_dir, TERRA)
    if tokenizer is None and not (tokenizer_dir / "config.json").is_file():
        random_tokenizer(tokenizer_dir, TERRA_CONFIG)
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
        lines.append(json_text({"sample_id": i, "context": [f"context/{n}" for n in names],
                                 "manoeuvre": MANOEUVRES[i % len(MANOEUVRES)]}))
    write_text(path, "\n".join(lines) + "\n")
    return path


def run_name(args: argparse.Namespace, count: int) -> str:
    """``run_gpus<n>`` (executor=local) or ``run_ray<n>`` (executor=ray): the run's folder and JSON file."""
    return f"run_gpus{count}" if args.executor == "local" else f"run_ray{count}"


def run_rollouts(args: argparse.Namespace, samples: Path, model: tuple[str, str], count: int) -> dict[str, Any]:
    """One ``terra-rollout`` run; its wall time, counts, the manifest's generation span and projection."""
    run_dir = args.out / run_name(args, count)
    on_cpu = count == 0 if args.executor == "local" else args.device == "cpu"
    overrides = [
        f"samples={samples}", f"output.dir={run_dir}", f"num_frames={args.frames}", f"executor={args.executor}",
        f"max_concurrent={args.max_concurrent}", f"backend={args.backend}", f"output.formats=[{args.format}]",
        "resume=false", "progress=false",
        *((f"ray.num_actors={count}",) if args.executor == "ray" else ()),
        *(("device=cpu",) if on_cpu else ()),
        *((f"backend.options.requests={args.requests}",) if args.requests else ()),
        *(("model=demo", "tokenizer=demo") if args.demo else
          ("model=terra_v1", f"model.world_model={model[0]}", "tokenizer=terra_lfq", f"tokenizer.path={model[1]}")),
        *args.override,
    ]
    command = [sys.executable, "-m", "terra.apps.rollout", *overrides]  # terra-rollout
    print(f"[benchmark_rollout] {run_name(args, count)}: {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    with GpuBusyMonitor() as busy:
        proc = subprocess.run(command, cwd=ROOT)
    wall = time.perf_counter() - start
    records = read_manifest(run_dir / "manifest.jsonl")
    ok = [r for r in records if r["status"] == "ok"]
    row: dict[str, Any] = {
        "executor": args.executor, ("num_gpus" if args.executor == "local" else "actors"): count,
        "exit_code": proc.returncode, "command": shlex.join(["terra-rollout", *overrides]),
        "wall_s": wall, "samples": len(records), "ok": len(ok), "failed": len(records) - len(ok),
        "frames_per_sample": args.frames, "gpus_used": sorted({str(r.get("gpus", "in-process")) for r in ok}),
        "requests": args.requests or "the config's (per_frame)",
    }
    summary_file = run_dir / "manifest.summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    row["decoding"] = summary.get("decoding")  # the decoding that ran, forward passes per frame, tokens per pass
    if args.executor == "ray":
        row["per_actor"] = summary.get("actors", {})
    if ok:
        first = min(r["finished_at"] - r["seconds"] for r in ok)
        last, generated = max(r["finished_at"] for r in ok), max(r["generated_at"] for r in ok)
        span = last - first
        rate = len(ok) / span
        startup = max(wall - span, 0.0)
        row.update(span_s=span, samples_per_s=rate, frames_per_s=rate * args.frames,
                   projected_samples=args.project, projected_wall_s=startup + args.project / rate,
                   generation_s=generated - first, generated_frames_per_s=len(ok) * args.frames / (generated - first),
                   gpu_busy_pct_generation=busy.busy_pct(first, generated),
                   gpu_busy_pct_span=busy.busy_pct(first, last))
        waves = projection_by_waves(ok, startup, args.project)
        if waves is not None:
            row["waves"] = waves
    if busy.trace:  # seconds since the command started, utilisation %
        t0 = busy.trace[0][0] - busy.period_s
        row["gpu_busy_trace"] = [[round(t - t0, 1), u] for t, u in busy.trace]
    return row


def projection_by_waves(ok: Sequence[dict[str, Any]], startup_s: float, project: int) -> dict[str, float] | None:
    """Wall time of ``project`` samples run as this run ran them: ``startup_s``, full waves as long as the first,
    a last, smaller wave timed between the two measured ones, and the last wave's writing.

    Rollouts of one length advance together, so an engine holding ``n1`` runs ``project`` samples as waves of
    ``n1``; a wave's steps cost a fixed part plus a part per rollout, so its time is linear in its rollouts and the
    last wave's follows from the first (``n1`` rollouts: those admitted before any left the engine) and the second
    (the rest, fewer). ``None`` without such a second wave (all samples in one wave, or two full ones)."""
    admitted = sorted((r["generated_at"] - r["generate_s"], r["generated_at"]) for r in ok)
    first_out = min(out for _, out in admitted)
    first = [w for w in admitted if w[0] < first_out]
    second = admitted[len(first):]
    if not second or len(second) >= len(first):
        return None

    def span(wave: list[tuple[float, float]]) -> float:
        return max(out for _, out in wave) - wave[0][0]

    n1, n2, t1, t2 = len(first), len(second), span(first), span(second)
    full, rest = divmod(project, n1)
    last = t2 + (t1 - t2) * (rest - n2) / (n1 - n2) if rest else 0.0
    writing = max(r["finished_at"] for r in ok) - max(out for _, out in admitted)
    return {"in_flight": n1, "first_wave_s": t1, "second_wave": n2, "second_wave_s": t2,
            "projected_wall_s": startup_s + full * t1 + last + writing}


def table(rows: list[dict[str, Any]]) -> str:
    """One line per run plus the speed-up of each against the first."""
    project = f"{rows[0].get('projected_samples', '-')} samples"
    header = (f"{'run':>10} {'ok':>5} {'failed':>6} {'wall s':>8} {'span s':>8} {'samples/s':>10} {'frames/s':>9} "
              f"{'speed-up':>8} {project:>14} {'by waves':>9}")
    lines = [header, "-" * len(header)]
    base = rows[0].get("frames_per_s")
    for r in rows:
        fps = r.get("frames_per_s")
        speedup = f"{fps / base:.2f}x" if fps and base else "-"
        name = f"gpus {r['num_gpus']}" if "num_gpus" in r else f"ray x{r['actors']}"
        projected = f"{r['projected_wall_s'] / 60:.1f} min" if "projected_wall_s" in r else "-"
        by_waves = f"{r['waves']['projected_wall_s'] / 60:.1f} min" if "waves" in r else "-"
        lines.append(f"{name:>10} {r['ok']:>5} {r['failed']:>6} {r['wall_s']:>8.1f} {r.get('span_s', 0):>8.1f} "
                     f"{r.get('samples_per_s', 0):>10.2f} {fps or 0:>9.2f} {speedup:>8} {projected:>14} {by_waves:>9}")
    return "\n".join(lines)


@exit_2_on_input_error("benchmark_rollout")
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; 2 for bad input, 1 when a run failed a sample, else 0."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.demo:
        model = ("", "")
        height, width = load_tokenizer(str(DEMO / "tokenizer")).image_size
    else:
        model = random_models(args.out, args.model, args.tokenizer)
        height, width = load_tokenizer(model[1]).image_size
    samples = write_samples(args.out, args.samples, height, width)
    rows = []
    for count in args.runs:
        rows.append(run_rollouts(args, samples.resolve(), model, count))
        write_text(args.out / f"{run_name(args, count)}.json", json_text(rows[-1], indent=1))
    summary = {"command": shlex.join(["scripts/bench/benchmark_rollout.py", *(sys.argv[1:] if argv is None else argv)]),
               "runs": rows}
    if len(rows) > 1 and rows[0].get("frames_per_s"):
        summary["speedup_vs_first"] = {run_name(args, count): r.get("frames_per_s", 0) / rows[0]["frames_per_s"]
                                       for count, r in zip(args.runs, rows)}
    write_text(args.out / "summary.json", json_text(summary, indent=1))
    print(table(rows))
    return 0 if all(r["exit_code"] == 0 and r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
