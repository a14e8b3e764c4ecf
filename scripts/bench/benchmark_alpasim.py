#!/usr/bin/env python
"""terra-alpasim under load: N AlpaSim rollouts at once against the WorldModelService on loopback, and the time of
each 8-frame chunk.

The server is built from conf/alpasim.yaml as ``terra-alpasim`` builds it (the overrides after the options are
Hydra's, as on its command line), on a free loopback port; N clients (terra/alpasim/client.py) then play AlpaSim's
runtime at once, each in its own thread: ``start_session`` with a frame of the synthetic world as the camera's
JPEG, a first chunk of 5 frames, ``--chunks`` chunks of 8, ``close_session``, each rollout along its own curve.
A chunk's time is the client's, from request to answer (gRPC, generation, decoding, JPEG encoding). Before the
first N, one rollout's first chunk warms the engine up. Beside each N, who waits meanwhile (bench/lib/occupancy.py):
the GPU's busy share, and the CPU shares of vLLM's engine core and of this process (server and clients). Targets
(benchmarks/alpasim.md): on one H100 with the demo model, 16 rollouts at once, and one rollout's 8-frame chunk in
<= 0.4 s. Examples::

    python scripts/bench/benchmark_alpasim.py --sessions 1,4 --chunks 3 backend=hf device=cpu     # CPU, demo model
    python scripts/bench/benchmark_alpasim.py --sessions 1,4,16,32 --chunks 8 backend=vllm device=cuda \\
        --out bench/alpasim_h100.json                                                     # GPU

``--count-steps`` (vLLM) runs the engine core in this process and counts the rollouts' passes in its scheduler's
steps (scripts/bench/lib/engine_steps.py, ``StepCounter``) beside the backend's own count of passes: the check of that
count on the sessions' path (benchmarks/alpasim.md, "AlpaSim's video-model service").

``--map on`` gives each rollout an HD map (AlpaSim's clipgt zip, terra/roads/clipgt.py) whose lanes run along its
path (its lane, one each side, one the other way, and the road's edges), so that a model with route slots is told
each frame's route (terra/alpasim/maps.py); ``--map both`` runs each N without and with the map, ``--rounds`` times
in turn, for the chunk time with a map against without on the same machine at the same hour. ``--read-maps N,...``
only times reading maps of N lanes each (what ``start_session`` does once; no model loaded), and another thread's
longest wait for the interpreter meanwhile (what other sessions' calls wait at most).

The server's engine is sized as ``terra-alpasim`` sizes it: for ``alpasim.max_sessions``, the most rollouts of
``--sessions`` (one session: the engine of one rollout). ``--engine-rollouts N`` makes room for N instead, as a
server started for N sessions serving fewer (``terra-alpasim``'s default is 64).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import (  # noqa: E402
    Parser, check_output, compose_config, exit_2_on_input_error, in_range, listed, run_threads)
from bench.lib.occupancy import Occupancy, occupancy_line  # noqa: E402
from terra.alpasim import video_model_pb2 as pb  # noqa: E402
from terra.alpasim.client import Path as PathOf, RuntimeClient, curve, trajectory  # noqa: E402
from terra.alpasim.service import WorldModelServicer, bind, start  # noqa: E402
from terra.alpasim.sessions import SessionTable  # noqa: E402
from terra.alpasim.settings import MAX_SESSIONS, alpasim_spec  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.generation.backends import backend_kind  # noqa: E402
from terra.pipeline import WorldModelPipeline, resolve_run  # noqa: E402
from terra.roads.road import MAX_LANES  # noqa: E402
from terra.sim import builtin_context  # noqa: E402

FIRST_CHUNK, CHUNK = 5, 8  # AlpaSim's 8frame preset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser("benchmark_alpasim", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=listed(in_range(int, 1, MAX_SESSIONS)), default="1,4,16",
                        help="comma-separated numbers of rollouts at once")
    parser.add_argument("--chunks", type=in_range(int, 1, 1000), default=4,
                        help="8-frame chunks per rollout, after the first of 5")
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    parser.add_argument("--count-steps", action="store_true",
                        help="vLLM: also count the passes in the engine scheduler's steps (engine core in-process)")
    parser.add_argument("--map", choices=("off", "on", "both"), default="off",
                        help="an HD map along each rollout's path (both: without and with, in turn)")
    parser.add_argument("--rounds", type=in_range(int, 1, 1000), default=1,
                        help="with --map both: rounds of without and with")
    parser.add_argument("--read-maps", type=listed(in_range(int, 1, MAX_LANES)), default=[],
                        help="comma-separated lane counts: only time reading maps of that many lanes")
    parser.add_argument("--engine-rollouts", type=in_range(int, 1, MAX_SESSIONS),
                        help="the rollouts the engine makes room for (default: the most of --sessions, as "
                             "terra-alpasim makes for alpasim.max_sessions)")
    parser.add_argument("overrides", nargs="*", help="terra-alpasim's settings, e.g. backend=vllm device=cuda")
    args = parser.parse_args(argv)
    if args.out:
        check_output(args.out, "--out")
    return args


def build(overrides: list[str], sessions: int, engine_rollouts: int | None = None):
    """The server's pipeline and session table from conf/alpasim.yaml, for ``sessions`` rollouts at once, and the
    engine options the run resolved (the ``memory`` preset's among them): as terra/apps/alpasim.py builds them, the
    decoding and the engine's room for ``alpasim.max_sessions`` (``engine_rollouts``: room for that many)."""
    cfg = compose_config("alpasim", [*overrides, "alpasim.port=0",
                                     f"alpasim.max_sessions={max(sessions, engine_rollouts or 0)}"])
    spec, settings = alpasim_spec(cfg)
    run = resolve_run(spec, settings.max_sessions, max_rollouts=settings.max_sessions)
    pipeline = WorldModelPipeline.from_run(run)
    table = SessionTable(pipeline, settings, run.spec.sampling, run.spec.overlap, run.spec.resize)
    return str(cfg.model.get("name", "world model")), pipeline, table, run.spec.backend_options


def camera_frame(image_size: tuple[int, int]) -> bytes:
    """A frame of the synthetic world (the demo model's own) as the camera's JPEG."""
    images, _ = builtin_context("straight", 1, image_size, 0, {"speed_kmh": 30.0})
    rgb = ((images[0].permute(1, 2, 0).numpy() + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def path_of(i: int) -> tuple[PathOf, float]:
    """Rollout ``i``'s path (its own curve) and speed (m/s)."""
    speed = 6.0 + i % 5
    return curve(speed=speed, rate=0.05 * ((i % 7) - 3)), speed


def map_along(path: PathOf, speed: float, seconds: float) -> bytes:
    """AlpaSim's HD map (a clipgt zip) of a road along ``path``: its lane (from 2 s before the path's start to 100 m
    past its end, a point a metre), a lane each side, one the other way beyond the left one, and the road's edges."""
    from terra.roads import Lane, Road, write_clipgt

    t = np.arange(-2.0, seconds + 100.0 / speed, 1.0 / speed)
    x, y, yaw = np.array([path(v) for v in t]).T
    left = np.stack([-np.sin(yaw), np.cos(yaw)], axis=-1)

    def beside(metres: float) -> np.ndarray:
        return np.stack([x, y], axis=-1) + metres * left

    lanes = [Lane(beside(0.0), "ego"), Lane(beside(3.5), "left"), Lane(beside(-3.5), "right"),
             Lane(beside(7.0)[::-1], "oncoming")]
    buffer = io.BytesIO()
    write_clipgt(Road(lanes, [beside(8.75), beside(-5.25)], "the benchmark's road"), buffer, "bench")
    return buffer.getvalue()


def rollouts(address: str, frame: bytes, count: int, chunks: int, device: str, with_map: bool = False) -> dict:
    """``count`` rollouts at once (``with_map``: each with an HD map along its path); each one's start, first chunk
    and 8-frame chunk times, and who was busy meanwhile (the GPU of ``device``, the engine core, this process)."""
    times: list[dict] = [{} for _ in range(count)]
    seconds = (FIRST_CHUNK + CHUNK * chunks) / 10.0
    maps = [map_along(*path_of(i), seconds) if with_map else b"PK\x05\x06" + bytes(18) for i in range(count)]

    def drive(i: int) -> None:
        client = RuntimeClient(address)
        try:
            path, _ = path_of(i)
            begin = time.perf_counter()
            session = client.start(frame, seed=i + 1, static_world_map=pb.StaticWorldMap(hdmap_parquets=maps[i]))
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
    with Occupancy(device) as occupancy:
        wall = run_threads(count, drive)
    cpu = time.process_time() - cpu  # every thread of the process: the server's and the clients' (a shared CPU's
    # robust figure where the wall time is not)
    chunk = [t for record in times for t in record["chunk_s"]]
    frames = count * (FIRST_CHUNK + CHUNK * chunks)
    return {"sessions": count, "chunks": chunks, "map": with_map, "wall_s": wall, "frames_per_s": frames / wall,
            "start_s": statistics.median(r["start_s"] for r in times),
            "first_chunk_s": statistics.median(r["first_chunk_s"][0] for r in times),
            "chunk_p50_s": float(np.percentile(chunk, 50)), "chunk_p90_s": float(np.percentile(chunk, 90)),
            "chunk_max_s": max(chunk),
            "realtime_x": CHUNK / 10.0 / float(np.percentile(chunk, 50)),  # 8 frames are 0.8 s of video
            "cpu_s_per_frame": cpu / frames, **occupancy.figures}


def read_maps(counts: list[int]) -> list[dict]:
    """The time to read (``read_clipgt``) maps of ``counts`` straight lanes of 100 m at random places and headings,
    and another thread's longest wait for the interpreter meanwhile."""
    from terra.roads import Lane, Road, read_clipgt, write_clipgt

    records = []
    for count in counts:
        x, y, heading = np.random.default_rng(0).uniform(-3000.0, 3000.0, (3, count))
        t = np.linspace(0.0, 100.0, 11)
        road = Road([Lane(np.stack([a + t * np.cos(c), b + t * np.sin(c)], -1), f"lane-{i}")
                     for i, (a, b, c) in enumerate(zip(x, y, heading))])
        buffer = io.BytesIO()
        write_clipgt(road, buffer)
        waits, done = [0.0], threading.Event()
        ticker = threading.Thread(target=_tick, args=(done, waits))
        ticker.start()
        begin = time.perf_counter()
        read_clipgt(buffer.getvalue())
        seconds = time.perf_counter() - begin
        done.set()
        ticker.join()
        records.append({"lanes": count, "map_mib": len(buffer.getvalue()) / 2**20, "read_s": seconds,
                        "longest_wait_s": max(waits)})
        print(f"{count} lanes ({records[-1]['map_mib']:.1f} MiB): read in {seconds:.2f} s; another thread waited "
              f"{max(waits) * 1000:.0f} ms at most", flush=True)
    return records


def _tick(done: threading.Event, waits: list[float], every_s: float = 0.005) -> None:
    """Wake every ``every_s`` until ``done``, noting how much later than asked each wake came."""
    last = time.perf_counter()
    while not done.wait(every_s):
        now = time.perf_counter()
        waits.append(now - last - every_s)
        last = now


class RouteClock:
    """While entered, the server's seconds in the routes of chunks (terra/alpasim/maps.py, ``SessionMap.routes``):
    the work a map adds to a chunk, summed over the server's threads."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def __enter__(self) -> "RouteClock":
        from terra.alpasim.maps import SessionMap

        self._routes = routes = SessionMap.routes

        def timed(session_map, poses):
            begin = time.perf_counter()
            try:
                return routes(session_map, poses)
            finally:
                with self._lock:
                    self.seconds += time.perf_counter() - begin

        SessionMap.routes = timed
        return self

    def __exit__(self, *exc) -> None:
        from terra.alpasim.maps import SessionMap

        SessionMap.routes = self._routes


def warm_up(address: str, frame: bytes) -> None:
    """One rollout's first chunk: the engine's first steps, the tokenizer's first decoding."""
    client = RuntimeClient(address)
    client.rollout(frame, curve(), chunks=[FIRST_CHUNK])
    client.close_channel()


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.read_maps:
        records = read_maps(args.read_maps)
        if args.out:
            write_text(args.out, json_text(records))
        return records
    if args.count_steps:  # before vLLM is imported: the scheduler must live in this process to be counted
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    model, pipeline, table, _ = build(args.overrides, max(args.sessions), args.engine_rollouts)
    clock = RouteClock()
    counter = None
    if args.count_steps and backend_kind(pipeline.backend) == "vllm":
        from bench.lib.engine_steps import StepCounter

        counter = StepCounter(pipeline.backend)
    server, port = bind(table.settings)
    start(server, WorldModelServicer(table, model))
    address = f"127.0.0.1:{port}"
    machine = f"{platform.node()} ({platform.processor() or platform.machine()})"
    try:
        clock.__enter__()
        frame = camera_frame(pipeline.image_size)
        warm_up(address, frame)
        records = []
        maps = {"off": (False,), "on": (True,), "both": (False, True) * args.rounds}[args.map]
        for count, with_map in ((count, with_map) for count in args.sessions for with_map in maps):
            before = table.engine.pass_stats
            if counter is not None:
                counter.reset()
            clock.seconds = 0.0
            device = str(pipeline.device)
            record = {"model": model, "backend": pipeline.backend.name, "device": device, "machine": machine,
                      **rollouts(address, frame, count, args.chunks, device, with_map)}
            record["routes_s_per_chunk"] = clock.seconds / (count * (FIRST_CHUNK + CHUNK * args.chunks)) * CHUNK
            after = table.engine.pass_stats
            record["decoding"] = table.sampling.decoding
            record["draft_tokens"] = table.sampling.draft_tokens
            record["passes_per_frame"] = (after.passes - before.passes) / (after.frames - before.frames)
            if counter is not None:  # each request in a scheduled step is one rollout's pass (prompt chunks too)
                record["scheduler_passes_per_frame"] = counter.passes / (after.frames - before.frames)
            records.append(record)
            print(f"{count:3d} rollouts{' with a map' if with_map else ''}: 8-frame chunk p50 "
                  f"{record['chunk_p50_s']:.3f} s, p90 "
                  f"{record['chunk_p90_s']:.3f} s ({record['realtime_x']:.2f}x real time); first chunk (5) "
                  f"{record['first_chunk_s']:.3f} s; start {record['start_s']:.3f} s; {record['frames_per_s']:.1f} "
                  "frames/s in all; "
                  f"{record['passes_per_frame']:.1f} passes a frame ({record['decoding']}); "
                  f"{record['routes_s_per_chunk'] * 1000:.2f} ms a chunk in routes; {occupancy_line(record)}"
                  + (f", {record['scheduler_passes_per_frame']:.1f} in the scheduler's steps" if counter else ""),
                  flush=True)
    finally:
        clock.__exit__()
        server.stop(1).wait()
        table.shutdown()
        pipeline.close()
    if args.out:
        write_text(args.out, json_text(records))
    return records


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_alpasim")(main)())
