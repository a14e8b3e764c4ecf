#!/usr/bin/env python
"""Lane keeping through terra-alpasim: told the lane of a lane-level map, does the drawn car keep its lane as the
truth does?

The server is built from conf/alpasim.yaml as ``terra-alpasim`` builds it (the overrides after the options are
Hydra's), on a free loopback port. Each synthetic scenario (terra-drive's, ``--scenario-seed``) becomes an AlpaSim
session: its context frame as the camera's initial frame and a clipgt map of its road with two lanes each way
(:func:`lane_map`: the scene's lanes and one more beyond each, rails a lane wide, in pieces chained by successors).
Each policy drives each scenario in closed loop (terra/closedloop/loop.py's ``run_drives``): every step the policy
plans on the newest frame the service sent, the car moves, and the service renders the frame at the rig's new pose,
a chunk of one pose, told the map's route there (terra/alpasim/maps.py). The first chunk's single pose is read by
the service as standing still at it (terra/alpasim/poses.py), so frame 1 is drawn from a car at rest.

Measured per drive: the mean |lane offset| of its frames as terra/fidelity/lanes.py reads a lane (``find_lane``:
the lane centre's lateral position at the car), on the service's frames (model) and on the synthetic world's true
renders at the same poses (truth), over the frames both read; per policy, the means over drives and the mean
paired difference with 95 % intervals over scenarios (terra/stats.py). Examples::

    python scripts/experiments/lane_keeping_alpasim.py --policies lane_follower --scenarios 1 --frames 12 \\
        backend=hf device=cpu                                                   # CPU, demo model, a minute or two
    python scripts/experiments/lane_keeping_alpasim.py backend=vllm device=cuda # the issue's size, one GPU
    python scripts/experiments/lane_keeping_alpasim.py backend=vllm device=cuda model.world_model=OUT/world_model
"""

from __future__ import annotations

import argparse
import io
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from carla_driver_interface.protocol import Trajectory
from PIL import Image

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.benchmark_alpasim import build  # noqa: E402
from bench.lib.cli import Parser, check_output, compose_config, exit_2_on_input_error, in_range, listed  # noqa: E402
from terra.alpasim import video_model_pb2 as pb  # noqa: E402
from terra.alpasim.client import ANCHOR_US, RuntimeClient, pose_at  # noqa: E402
from terra.alpasim.poses import FRAME_INTERVAL_US  # noqa: E402
from terra.alpasim.service import WorldModelServicer, bind, start  # noqa: E402
from terra.alpasim.sessions import SessionTable  # noqa: E402
from terra.closedloop.loop import drive_specs, run_drives  # noqa: E402
from terra.closedloop.policies.builtin import policy_factories  # noqa: E402
from terra.closedloop.scenarios import Scenario, synthetic_scenarios  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.fidelity.lanes import find_lane  # noqa: E402
from terra.roads import Lane, Road, write_clipgt  # noqa: E402
from terra.sim.renderer import render  # noqa: E402
from terra.sim.scene import SCENE_LANE_PIECE_M, SCENE_ROAD_SPACING_M  # noqa: E402
from terra.sim.scene import LANE_WIDTH_M, ROAD_HALF_WIDTH_M, Scene  # noqa: E402
from terra.stats import mean, paired_difference  # noqa: E402

POLICIES = ("lane_follower", "lane_follower_near", "lane_follower_stanley", "route_follower")
LANES_EACH_WAY = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser("lane_keeping_alpasim", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", type=listed(str), default=",".join(POLICIES),
                        help="comma-separated closed-loop policies (terra-drive's names)")
    parser.add_argument("--scenarios", type=in_range(int, 1, 256), default=16, help="synthetic scenarios")
    parser.add_argument("--scenario-seed", type=in_range(int, 0, 2**31 - 1), default=0)
    parser.add_argument("--frames", type=in_range(int, 2, 3000), default=200, help="frames a drive (10 a second)")
    parser.add_argument("--map-shift-m", type=in_range(float, -10.0, 10.0), default=0.0,
                        help="move every lane of the map this far to its left (m): 1.75 tells a right-hand lane's "
                             "car the road's centre line, the convention of models trained before lane routes")
    parser.add_argument("--out", type=Path, help="write the per-drive records and the summary as JSON here")
    parser.add_argument("overrides", nargs="*", help="terra-alpasim's settings, e.g. backend=vllm device=cuda")
    args = parser.parse_args(argv)
    if args.out:
        check_output(args.out, "--out")
    return args


def lane_map(scene: Scene, clip_id: str, shift_m: float = 0.0) -> bytes:
    """A clipgt map of ``scene``'s road with :data:`LANES_EACH_WAY` lanes each way: the scene's ego and oncoming
    lanes and one beyond each on its outer side, each in pieces of about ``SCENE_LANE_PIECE_M`` in its driving
    direction chained by successors, and the road's edges; ``shift_m``: every lane moved that far to the left of
    the scene's driving direction."""
    ends = np.linspace(0.0, scene.length_m, max(1, round(scene.length_m / SCENE_LANE_PIECE_M)) + 1)
    pieces = [np.linspace(a, b, int(np.ceil((b - a) / SCENE_ROAD_SPACING_M)) + 1) for a, b in zip(ends, ends[1:])]
    ego = scene.ego_lane_offset_m
    lanes = []
    for k in range(LANES_EACH_WAY):
        outward = np.sign(ego) * LANE_WIDTH_M * k
        for name, offset, order in ((f"ego{k}", ego + outward + shift_m, pieces),
                                    (f"oncoming{k}", -ego - outward + shift_m, [s[::-1] for s in pieces[::-1]])):
            for i, s in enumerate(order):
                successors = (f"{name}-{i + 1}",) if i + 1 < len(order) else ()
                lanes.append(Lane(scene.lane_pose(s, offset)[:, :2], f"{name}-{i}", successors))
    s = pieces[0] if len(pieces) == 1 else np.concatenate([pieces[0], *(p[1:] for p in pieces[1:])])
    edge = ROAD_HALF_WIDTH_M + LANE_WIDTH_M * (LANES_EACH_WAY - 1)
    road = Road(lanes, [scene.lane_pose(s, side * edge)[:, :2] for side in (1.0, -1.0)], "lane map",
                spacing_m=SCENE_ROAD_SPACING_M)
    buffer = io.BytesIO()
    write_clipgt(road, buffer, clip_id)
    return buffer.getvalue()


def png(frame: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass
class Session:
    """One drive's AlpaSim session: its id, the frames asked so far and those told a route."""

    scenario: Scenario
    id: pb.SessionId
    sent: int = 0
    routed: int = 0  # frames the service told a route (counted from the rollout's route slots as it closes)


class AlpasimWorld:
    """The world model behind terra-alpasim's gRPC service, as a closed-loop world: a drive is a session started
    from the scenario's context frame and its lane map; each step is a chunk of the one pose the car reached."""

    name = "alpasim"

    def __init__(self, address: str, image_size: tuple[int, int], table: SessionTable, shift_m: float = 0.0) -> None:
        self.client = RuntimeClient(address)
        self.table, self.shift_m = table, shift_m
        self.opened: list[Session] = []  # in the order of the drives opened
        self.image_size = image_size
        self.generate_s = 0.0
        self.decode_s = 0.0
        self.pool = ThreadPoolExecutor(64)

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> Session:
        frame = np.asarray(scenario.images[-1])
        world_map = pb.StaticWorldMap(hdmap_parquets=lane_map(scenario.scene, scenario.id, self.shift_m))
        session = self.client.start(png(frame), seed=seed + 1, resolution=self.image_size, static_world_map=world_map)
        self.opened.append(Session(scenario, session))
        return self.opened[-1]

    def context_frames(self, drive: Session) -> np.ndarray:
        return drive.scenario.images

    def step(self, drives, actions, poses) -> list:
        def one(drive: Session, pose: np.ndarray):
            drive.sent += 1
            chunk = Trajectory(poses=[pose_at(ANCHOR_US + drive.sent * FRAME_INTERVAL_US,
                                                            *map(float, pose))])
            try:
                answer = self.client.chunk(drive.id, chunk)
                image = answer.camera_outputs[0].rgb_frames[0].data
                return np.asarray(Image.open(io.BytesIO(image)).convert("RGB"))
            except Exception as err:  # noqa: BLE001
                return err

        return list(self.pool.map(one, drives, [np.asarray(p, dtype=np.float64) for p in poses]))

    def close(self, drive: Session) -> None:
        slots = self.table.get(drive.id.session_id).rollout.state.route_slots  # slot t: the route of frame t + 1
        drive.routed = int(np.isfinite(slots[:drive.sent]).all(axis=(1, 2)).sum())
        self.client.close(drive.id)

    def shutdown(self) -> None:
        self.pool.shutdown()
        self.client.close_channel()


def lane_offsets(frames: list[np.ndarray]) -> np.ndarray:
    """Each frame's |lane offset| (m) as terra/fidelity/lanes.py reads it; NaN where no lane is read."""
    out = np.full(len(frames), np.nan)
    for i, frame in enumerate(frames):
        lane = find_lane(np.asarray(frame))
        if lane is not None:
            out[i] = abs(lane.offset)
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    factories = policy_factories(args.policies)
    overrides = [*args.overrides, "alpasim.image_format=png"]
    model, pipeline, table, _ = build(overrides, args.scenarios * len(factories))
    model = f"{model} ({compose_config('alpasim', overrides).model.world_model})"
    height, width = pipeline.image_size
    scenarios = synthetic_scenarios(args.scenarios, args.scenario_seed, (height, width), num_context=1)
    server, port = bind(table.settings)
    start(server, WorldModelServicer(table, model))
    world = AlpasimWorld(f"127.0.0.1:{port}", (height, width), table, args.map_shift_m)
    try:
        drives = run_drives(world, drive_specs(scenarios, factories), args.frames - 1)
    finally:
        world.shutdown()
        server.stop(1).wait()
        table.shutdown()
        pipeline.close()
    records = []
    opened = iter(world.opened)
    for drive in drives:
        session = None if drive.stage == "setup" else next(opened)
        if drive.error is not None:
            print(f"{drive.spec.id}: {drive.error}", flush=True)
            continue
        frames, poses = drive.frames[drive.num_context:], drive.world_poses()[1:]
        truth = [render(drive.spec.scenario.scene, pose, height, width) for pose in poses]
        drawn, true = lane_offsets(frames), lane_offsets(truth)
        both = np.isfinite(drawn) & np.isfinite(true)
        records.append({"scenario": drive.spec.scenario.id, "policy": drive.spec.policy, "frames": len(frames),
                        "told_route": session.routed, "read": int(both.sum()),
                        "model_m": float(drawn[both].mean()) if both.any() else np.nan,
                        "truth_m": float(true[both].mean()) if both.any() else np.nan})
    summary = {"model": model, "frames": args.frames, "map_shift_m": args.map_shift_m, "policies": {}}
    print(f"mean |lane offset| (m) of {model}'s frames and of the true renders at the same poses, {args.frames} "
          f"frames a drive, the map's lanes moved {args.map_shift_m:g} m left, 95 % intervals over scenarios:",
          flush=True)
    for policy in dict.fromkeys(record["policy"] for record in records):
        mine = [r for r in records if r["policy"] == policy]
        ids = [r["scenario"] for r in mine]
        drawn, true = np.array([r["model_m"] for r in mine]), np.array([r["truth_m"] for r in mine])
        stats = {"model": mean(ids, drawn), "truth": mean(ids, true), "difference": paired_difference(ids, drawn, true)}
        summary["policies"][policy] = {name: [i.estimate, i.low, i.high] for name, i in stats.items()}
        summary["policies"][policy]["drives"] = len(mine)
        print(f"  {policy}: " + ", ".join(f"{name} {i.estimate:.3f} [{i.low:.3f}, {i.high:.3f}]"
                                          for name, i in stats.items())
              + f" ({len(mine)} drives; of their {sum(r['frames'] for r in mine)} frames "
                f"{sum(r['told_route'] for r in mine)} told a route, {sum(r['read'] for r in mine)} read)", flush=True)
    if args.out:
        write_text(args.out, json_text({"summary": summary, "drives": records}))
    return summary


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("lane_keeping_alpasim")(main)())
