#!/usr/bin/env python
"""terra-alpasim under load: N AlpaSim rollouts at once against the WorldModelService on loopback, and the time of
each 8-frame chunk.

The server is built from conf/alpasim.yaml as ``terra-alpasim`` builds it (the overrides after the options are
Hydra's, as on its command line), on a free loopback port; N clients (terra/alpasim/client.py) then play AlpaSim's
runtime at once, each in its own thread: ``start_session`` with a frame of the synthetic world as the camera's
JPEG, a first chunk of 5 frames, ``--chunks`` chunks of 8, ``close_session``, each rollout along its own curve.
A chunk's time is the client's, from request to answer (gRPC, generation, decoding, JPEG encoding). Before the
first N, one rollout's first chunk warms the engine up. Targets (benchmarks/alpasim.md):
on one H100 with the demo model, 16 rollouts at once, and one rollout's 8-frame chunk in <= 0.4 s. Examples::

    python scripts/benchmark_alpasim.py --sessions 1,4 --chunks 3 backend=hf device=cpu           # CPU, demo model
    python scripts/benchmark_alpasim.py --sessions 1,4,16,32 --chunks 8 backend=vllm device=cuda \\
        --out bench/alpasim_h100.json                                                           # GPU

``--count-steps`` (vLLM) runs the engine core in this process and counts the rollouts' passes in its scheduler's
steps (scripts/bench/engine_steps.py, ``StepCounter``) beside the backend's own count of passes: the check of that
count on the sessions' path (benchmarks/alpasim.md, "AlpaSim's video-model service").

The server's engine is sized as ``terra-alpasim`` sizes it: for ``alpasim.max_sessions``, the most rollouts of
``--sessions`` (one session: the engine of one rollout). ``--engine-rollouts N`` makes room for N instead, as a
server started for N sessions serving fewer (``terra-alpasim``'s default is 16).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

SCRIPTS = Path(__file__).resolve().parent
if str(SCRIPTS) not in sys.path:  # run as a file, scripts/ is already there; loaded by path (tests), it is not
    sys.path.append(str(SCRIPTS))

from bench.cli import run_threads  # noqa: E402
from terra.alpasim.client import RuntimeClient, curve, trajectory  # noqa: E402
from terra.alpasim.service import WorldModelServicer, bind, start  # noqa: E402
from terra.alpasim.sessions import SessionTable  # noqa: E402
from terra.alpasim.settings import alpasim_spec  # noqa: E402
from terra.apps.runner import CONF_DIR  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.generation.backends import backend_kind  # noqa: E402
from terra.pipeline import WorldModelPipeline, resolve_run  # noqa: E402
from terra.sim import builtin_context  # noqa: E402

FIRST_CHUNK, CHUNK = 5, 8  # AlpaSim's 8frame preset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", default="1,4,16", help="comma-separated numbers of rollouts at once")
    parser.add_argument("--chunks", type=int, default=4, help="8-frame chunks per rollout, after the first of 5")
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    parser.add_argument("--count-steps", action="store_true",
                        help="vLLM: also count the passes in the engine scheduler's steps (engine core in-process)")
    parser.add_argument("--engine-rollouts", type=int,
                        help="the rollouts the engine makes room for (default: the most of --sessions, as "
                             "terra-alpasim makes for alpasim.max_sessions)")
    parser.add_argument("overrides", nargs="*", help="terra-alpasim's settings, e.g. backend=vllm device=cuda")
    args = parser.parse_args(argv)
    try:
        args.sessions = [int(n) for n in args.sessions.split(",")]
    except ValueError:
        parser.error(f"--sessions must be comma-separated whole numbers (got {args.sessions!r})")
    if min(args.sessions) < 1 or args.chunks < 1 or (args.engine_rollouts is not None and args.engine_rollouts < 1):
        parser.error("--sessions, --chunks and --engine-rollouts must be at least 1")
    return args


def build(overrides: list[str], sessions: int, engine_rollouts: int | None = None):
    """The server's pipeline and session table from conf/alpasim.yaml, for ``sessions`` rollouts at once, and the
    engine options the run resolved (the ``memory`` preset's among them): as terra/apps/alpasim.py builds them, the
    decoding and the engine's room for ``alpasim.max_sessions`` (``engine_rollouts``: room for that many)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("alpasim", [*overrides, "alpasim.port=0",
                                  f"alpasim.max_sessions={max(sessions, engine_rollouts or 0)}"])
    spec, settings = alpasim_spec(cfg)
    run = resolve_run(spec, settings.max_sessions)
    pipeline = WorldModelPipeline.from_run(run, max_rollouts=settings.max_sessions)
    table = SessionTable(pipeline, settings, run.spec.sampling, run.spec.overlap, run.spec.resize)
    return str(cfg.model.get("name", "world model")), pipeline, table, run.spec.backend_options


def camera_frame(image_size: tuple[int, int]) -> bytes:
    """A frame of the synthetic world (the demo model's own) as the camera's JPEG."""
    images, _ = builtin_context("straight", 1, image_size, 0, {"speed_kmh": 30.0})
    rgb = ((images[0].permute(1, 2, 0).numpy() + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def rollouts(address: str, frame: bytes, count: int, chunks: int) -> dict:
    """``count`` rollouts at once; each one's start, first chunk and 8-frame chunk times."""
    times: list[dict] = [{} for _ in range(count)]

    def drive(i: int) -> None:
        client = RuntimeClient(address)
        try:
            path = curve(speed=6.0 + i % 5, rate=0.05 * ((i % 7) - 3))
            begin = time.perf_counter()
            session = client.start(frame, seed=i + 1)
            times[i]["start_s"] = time.perf_counter() - begin
            first, spans = 1, [FIRST_CHUNK] + [CHUNK] * chunks
            for k, size in enumerate(spans):
                begin = time.perf_counter()
                answer = client.chunk(session, trajectory(path, range(first, first + size)))
                elapsed = time.perf_counter() - begin
                assert len(answer.camera_outputs[0].rgb_frames) == size
                times[i].setdefault("first_chunk_s" if k == 0 else "chunk_s", []).append(elapsed)
                first += size
            client.close(session)
        finally:
            client.close_channel()

    cpu = time.process_time()
    wall = run_threads(count, drive)
    cpu = time.process_time() - cpu  # every thread of the process: the server's and the clients' (a shared CPU's
    # robust figure where the wall time is not)
    chunk = [t for record in times for t in record["chunk_s"]]
    frames = count * (FIRST_CHUNK + CHUNK * chunks)
    return {"sessions": count, "chunks": chunks, "wall_s": wall, "frames_per_s": frames / wall,
            "start_s": statistics.median(r["start_s"] for r in times),
            "first_chunk_s": statistics.median(r["first_chunk_s"][0] for r in times),
            "chunk_p50_s": float(np.percentile(chunk, 50)), "chunk_p90_s": float(np.percentile(chunk, 90)),
            "chunk_max_s": max(chunk),
            "realtime_x": CHUNK / 10.0 / float(np.percentile(chunk, 50)),  # 8 frames are 0.8 s of video
            "cpu_s_per_frame": cpu / frames}


def warm_up(address: str, frame: bytes) -> None:
    """One rollout's first chunk: the engine's first steps, the tokenizer's first decoding."""
    client = RuntimeClient(address)
    client.rollout(frame, curve(), chunks=[FIRST_CHUNK])
    client.close_channel()


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.count_steps:  # before vLLM is imported: the scheduler must live in this process to be counted
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    model, pipeline, table, _ = build(args.overrides, max(args.sessions), args.engine_rollouts)
    counter = None
    if args.count_steps and backend_kind(pipeline.backend) == "vllm":
        from bench.engine_steps import StepCounter

        counter = StepCounter(pipeline.backend)
    server, port = bind(table.settings)
    start(server, WorldModelServicer(table, model))
    address = f"127.0.0.1:{port}"
    machine = f"{platform.node()} ({platform.processor() or platform.machine()})"
    try:
        frame = camera_frame(pipeline.image_size)
        warm_up(address, frame)
        records = []
        for count in args.sessions:
            before = table.engine.pass_stats
            if counter is not None:
                counter.reset()
            record = {"model": model, "backend": pipeline.backend.name, "device": str(pipeline.device),
                      "machine": machine, **rollouts(address, frame, count, args.chunks)}
            after = table.engine.pass_stats
            record["decoding"] = table.sampling.decoding
            record["draft_tokens"] = table.sampling.draft_tokens
            record["passes_per_frame"] = (after.passes - before.passes) / (after.frames - before.frames)
            if counter is not None:  # each request in a scheduled step is one rollout's pass (prompt chunks too)
                record["scheduler_passes_per_frame"] = counter.passes / (after.frames - before.frames)
            records.append(record)
            print(f"{count:3d} rollouts: 8-frame chunk p50 {record['chunk_p50_s']:.3f} s, p90 "
                  f"{record['chunk_p90_s']:.3f} s ({record['realtime_x']:.2f}x real time); first chunk (5) "
                  f"{record['first_chunk_s']:.3f} s; start {record['start_s']:.3f} s; {record['frames_per_s']:.1f} "
                  "frames/s in all; "
                  f"{record['passes_per_frame']:.1f} passes a frame ({record['decoding']})"
                  + (f", {record['scheduler_passes_per_frame']:.1f} in the scheduler's steps" if counter else ""),
                  flush=True)
    finally:
        server.stop(1).wait()
        table.shutdown()
        pipeline.close()
    if args.out:
        write_text(args.out, json_text(records))
    return records


if __name__ == "__main__":
    main()
