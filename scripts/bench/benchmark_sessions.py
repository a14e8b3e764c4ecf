#!/usr/bin/env python
"""Closed-loop sessions (terra/session/): frame latency and frames/s with N concurrent sessions, against batch
rollouts of the same frames on the same engine.

For every N in ``--sessions``, N sessions open (built-in context scenes with the demo model, random codes
otherwise) and each is stepped ``--frames`` times from its own thread with drive actions (a slow steering sine);
the first frame of a session carries its context's prefill and is reported apart. With ``--batch`` the same N
rollouts (same contexts, actions and seeds) then run as one ``backend.generate`` call, and the codes of both
are compared (they must be equal: one code path). Examples::

    python scripts/bench/benchmark_sessions.py                                     # CPU: demo model, Transformers
    python scripts/bench/benchmark_sessions.py --decode --sessions 1               # latency with RGB decoding
    python scripts/bench/benchmark_sessions.py --model terra --backend vllm --sessions 1,16,64 --frames 16 --batch \\
        --requests streaming --out bench/sessions_h100.json                  # GPU: Terra's shape, random bf16

``--model terra`` writes only Terra's config.json and lets vLLM initialise random weights
(``load_format=dummy``); ``--model tiny`` is a toy model for smoke runs; a folder is a real checkpoint.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import (  # noqa: E402
    DRAFT_TOKENS, Parser, check_output, device_name, existing, exit_2_on_input_error, in_range, listed, model_or,
    run_threads)
from bench.lib.models import dummy_weights_model  # noqa: E402
from terra.alpasim.settings import MAX_SESSIONS  # noqa: E402
from terra.config.backend import DTYPES, REQUEST_PATHS  # noqa: E402
from terra.config.checks import MAX_FRAMES  # noqa: E402
from terra.config.assets import DEMO  # noqa: E402
from terra.config.sampling import SamplingConfig  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.core.device import resolve_device  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402
from terra.generation.backends import create_backend  # noqa: E402
from terra.generation.decoding import resolve_decoding  # noqa: E402
from terra.generation.rollout import PassStats, RolloutRequest, WorldModelBackend  # noqa: E402
from terra.models import LlamaActionConfig, LlamaActionForCausalLM  # noqa: E402
from terra.models.presets import TERRA, TINY  # noqa: E402
from terra.pipeline import WorldModelPipeline  # noqa: E402
from terra.session import SessionHost, drive_action  # noqa: E402
from terra.session.context import SessionContext, builtin  # noqa: E402



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, each value in its range (scripts/bench/lib/cli.py): a bad one is one line and exit 2."""
    parser = Parser("benchmark_sessions", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=model_or("demo", "terra", "tiny"), default="demo",
                        help="demo | terra (random weights) | tiny | a checkpoint folder")
    parser.add_argument("--tokenizer", type=existing("folder", "config.json"),
                        help="tokenizer folder (default: the demo tokenizer with --model demo)")
    parser.add_argument("--backend", default="hf", choices=("hf", "vllm"))
    parser.add_argument("--device", type=device_name, default="auto")
    parser.add_argument("--dtype", default="auto", choices=DTYPES)
    parser.add_argument("--sessions", type=listed(in_range(int, 1, MAX_SESSIONS)), default="1,4,8",
                        help="comma-separated session counts")
    parser.add_argument("--frames", type=in_range(int, 1, MAX_FRAMES), default=6, help="frames each session steps")
    parser.add_argument("--num-context", type=in_range(int, 1, MAX_FRAMES), default=3)
    parser.add_argument("--temperature", type=in_range(float, 0, 100), default=1.0)
    parser.add_argument("--decoding", default="auto", choices=("auto", "sequential", "speculative"),
                        help="sampling.decoding (auto: as terra-serve chooses it for the most sessions)")
    parser.add_argument("--draft-tokens", type=DRAFT_TOKENS, default=32,
                        help="sampling.draft_tokens of speculative decoding")
    parser.add_argument("--batch", action="store_true", help="also run the same rollouts as one generate() call")
    parser.add_argument("--decode", action="store_true", help="decode every frame to RGB inside the step loop")
    parser.add_argument("--threads", type=in_range(int, 1, 1024), help="torch CPU threads (default: torch's)")
    parser.add_argument("--max-num-seqs", type=in_range(int, 1, 4096),
                        help="vLLM: sequences per step (default: the largest N)")
    parser.add_argument("--requests", choices=REQUEST_PATHS,
                        help="vLLM's request path (backend.options.requests; default per_frame)")
    parser.add_argument("--block", type=in_range(int, 0, MAX_FRAMES), default=0,
                        help="long sessions: the mean step time and the memory of this process and its children (the "
                             "engine's) per block of this many frames, to see both stay flat as windows roll over")
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    args = parser.parse_args(argv)
    if args.requests and args.backend != "vllm":
        parser.error(f"--requests picks vLLM's request path; it needs --backend vllm (got {args.backend})")
    with parser.one_line_errors():
        if args.out is not None:
            check_output(args.out, "--out")
    return args


def build_host(args: argparse.Namespace, folder: Path, sampling: SamplingConfig) -> SessionHost:
    """A session host over :func:`build_model`."""
    return SessionHost(build_model(args, folder, sampling), max_frames=args.frames, num_context=args.num_context)


def build_model(args: argparse.Namespace, folder: Path,
                sampling: SamplingConfig) -> WorldModelPipeline | WorldModelBackend:
    """The chosen model on the chosen backend: a pipeline when there is a tokenizer, else the bare backend, built
    for ``sampling``'s decoding (``auto``: chosen for the most sessions of ``--sessions``, as terra-serve chooses it
    for ``serve.max_sessions``)."""
    options = {"sampling": resolve_decoding(sampling, args.backend, resolve_device(args.device), max(args.sessions),
                                            args.requests or "per_frame")}
    if args.backend == "vllm":
        options["max_num_seqs"] = args.max_num_seqs or max(args.sessions)
        if args.requests:
            options["requests"] = args.requests
    if args.model in ("terra", "tiny"):
        config = LlamaActionConfig(**(TERRA if args.model == "terra" else TINY))
        if args.backend == "vllm":  # config.json only; the engine makes up the weights
            options.update(dummy_weights_model(folder, config))
        elif args.model == "terra":
            raise TerraInputError("--model terra runs on --backend vllm, which makes up its random weights")
        else:
            torch.manual_seed(0)
            LlamaActionForCausalLM(config).save_pretrained(folder)
        return create_backend(args.backend, folder, args.device, args.dtype, **options)
    world_model = DEMO / "world_model" if args.model == "demo" else Path(args.model)
    tokenizer = args.tokenizer or (DEMO / "tokenizer" if args.model == "demo" else None)
    if tokenizer is None:
        return create_backend(args.backend, world_model, args.device, args.dtype, **options)
    engine = options.pop("sampling", sampling)
    return WorldModelPipeline.from_pretrained(world_model, tokenizer, backend=args.backend, device=args.device,
                                              dtype=args.dtype, decoding=engine.decoding,
                                              draft_tokens=engine.draft_tokens, num_threads=args.threads, **options)


def contexts(host: SessionHost, count: int, num_context: int) -> list[SessionContext]:
    """Built-in scenes when the host has a tokenizer, else random codes; straight at 30 km/h in between."""
    if host.pipeline is not None:
        return [builtin(host.pipeline, num_context, scene=i) for i in range(count)]
    layout = host.layout
    rng = np.random.default_rng(0)
    between = np.repeat(drive_action(0.0, 30.0)[None], num_context - 1, axis=0)
    return [SessionContext(rng.integers(0, layout.codebook_size, (num_context, layout.image_tokens)), between, 30.0,
                           "random codes") for _ in range(count)]


def drive_actions(session_index: int, frames: int, speed_kmh: float) -> np.ndarray:
    """``[frames, 6, 3]``: steering along a slow sine, a different phase per session."""
    steer = 0.6 * np.sin(0.3 * np.arange(frames) + session_index)
    return np.stack([drive_action(float(s), speed_kmh) for s in steer])


def run_sessions(host: SessionHost, args: argparse.Namespace, count: int, sampling: SamplingConfig) -> dict:
    """N sessions stepped concurrently from N threads; latencies, frames/s and each one's codes."""
    starts = contexts(host, count, args.num_context)
    actions = [drive_actions(i, args.frames, c.speed_kmh) for i, c in enumerate(starts)]
    sessions = [host.open_context(c, seed=i, sampling=sampling) for i, c in enumerate(starts)]
    latencies: list[list[float]] = [[] for _ in range(count)]
    blocks: list[dict] = []

    def drive(i: int) -> None:
        for k, action in enumerate(actions[i]):
            start = time.perf_counter()
            sessions[i].step(action, decode=args.decode)
            latencies[i].append(time.perf_counter() - start)
            if i == 0 and args.block and (k + 1) % args.block == 0:
                blocks.append({"frames": k + 1, "step_s": statistics.mean(latencies[0][-args.block:]),
                               **memory_now()})
                print(block_line(blocks[-1]), flush=True)  # as it happens: a run cut short keeps its blocks

    wall = run_threads(count, drive)
    codes = [s.codes()[args.num_context :].reshape(args.frames, -1) for s in sessions]
    stats = sum((s.pass_stats() for s in sessions), PassStats())
    decoding = stats.as_dict(sessions[0].sampling)
    for session in sessions:
        session.close()
    first = [lat[0] for lat in latencies]
    steady = [x for lat in latencies for x in lat[1:]]
    return {
        "frames_per_s": count * args.frames / wall, "wall_s": wall,
        "first_frame_s": statistics.mean(first),
        "latency_mean_s": statistics.mean(steady) if steady else None,
        "latency_p50_s": float(np.percentile(steady, 50)) if steady else None,
        "latency_p90_s": float(np.percentile(steady, 90)) if steady else None,
        "decoding": decoding, "blocks": blocks, "codes": codes, "contexts": starts, "actions": actions,
        "sampling": sessions[0].sampling,
    }


def block_line(block: dict) -> str:
    """One block of a long session: its mean step time and the memory then."""
    return (f"    frames {block['frames']:>5}: {block['step_s'] * 1000:7.1f} ms per step, {block['rss_mib']:8.0f} MiB "
            f"resident, {block['torch_gpu_mib']:7.0f} MiB on the GPU here")


def memory_now() -> dict:
    """Resident memory of this process and of its children (a vLLM engine's core) in MiB, and the GPU memory torch
    holds here."""
    import psutil

    me = psutil.Process()
    rss = me.memory_info().rss + sum(child.memory_info().rss for child in me.children(recursive=True))
    gpu = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    return {"rss_mib": rss / 2**20, "torch_gpu_mib": gpu / 2**20}


def run_batch(host: SessionHost, args: argparse.Namespace, sessions: dict) -> dict:
    """The same rollouts as one ``generate`` call on the same backend, decoded as the sessions were."""
    sampling = sessions["sampling"]
    requests = []
    for i, (context, actions) in enumerate(zip(sessions["contexts"], sessions["actions"])):
        full = np.concatenate([context.actions, actions])
        requests.append(RolloutRequest(context.codes.reshape(len(context.codes), -1), full, args.frames, seed=i))
    start = time.perf_counter()
    generated = host.backend.generate(requests, sampling, progress=False)
    wall = time.perf_counter() - start
    equal = all(np.array_equal(g, s) for g, s in zip(generated, sessions["codes"]))
    return {"batch_frames_per_s": len(requests) * args.frames / wall, "batch_wall_s": wall, "identical": equal}


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sampling = SamplingConfig(temperature=args.temperature, decoding=args.decoding, draft_tokens=args.draft_tokens)
    records = []
    with tempfile.TemporaryDirectory(prefix="terra-bench-sessions-") as folder:
        host = build_host(args, Path(folder), sampling)
        try:
            run_sessions(host, args, 1, sampling)  # warm-up: first calls, CUDA graphs, caches
            for count in args.sessions:
                result = run_sessions(host, args, count, sampling)
                record = {"sessions": count, "frames": args.frames, "backend": host.backend.name,
                          "model": args.model, "decode": args.decode,
                          **{k: v for k, v in result.items() if k not in ("codes", "contexts", "actions", "sampling")}}
                if args.batch:
                    record.update(run_batch(host, args, result))
                records.append(record)
                print(format_record(record), flush=True)
        finally:
            host.close()
            host.backend.close()
    if args.out:
        write_text(args.out, json_text({"command": " ".join(sys.argv), "records": records}, indent=2))
    return records


def format_record(record: dict) -> str:
    text = (f"{record['sessions']:>3} session(s), {record['decoding']['decoding']} decoding "
            f"({record['decoding']['passes_per_frame']:.1f} passes/frame): {record['frames_per_s']:7.2f} frames/s, "
            f"first frame {record['first_frame_s'] * 1000:7.0f} ms")
    if record["latency_mean_s"] is not None:
        text += (f", then {record['latency_mean_s'] * 1000:6.0f} ms per frame "
                 f"(p50 {record['latency_p50_s'] * 1000:.0f}, p90 {record['latency_p90_s'] * 1000:.0f})")
    if "batch_frames_per_s" in record:
        text += f"; batch {record['batch_frames_per_s']:7.2f} frames/s, identical codes: {record['identical']}"
    return text


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_sessions")(main)())
