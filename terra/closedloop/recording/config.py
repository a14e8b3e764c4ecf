"""The settings of a ``terra-drive`` run in one world: defaults, ranges and help."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from terra.closedloop.car.motion import VEHICLES
from terra.closedloop.scenario_maps import SCENE_ROAD
from terra.config.checks import MAX_FRAMES, SEED, Range, shown
from terra.config.ray_settings import EXECUTORS, RayBlock
from terra.config.schema import flag, setting
from terra.config.spec import RunConfig
from terra.core.errors import TerraInputError


def _road(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TerraInputError(f"road must be {SCENE_ROAD}, a road file (.json, .csv, a clipgt .zip) or a folder of "
                              f"clipgt maps (got {shown(value)})")
    return value


@dataclass
class DriveRunConfig(RunConfig):
    num_context: int = setting(3, "context frames each drive starts from; at least 1 and below the world model's "
                                  "window")
    policies: Any = setting(["route_follower", "constant_speed", "lane_follower", "lane_follower_bias_left"],
                            "reference policies, grpc:HOST:PORT or unix:///PATH (an AlpaSim egodriver) or "
                            "navsim:MODULE:CLASS (a NAVSIM agent); Choices below")
    navsim_args: Any = setting(None, "per NAVSIM agent class, the keyword arguments it is built with, checked against "
                                     "its constructor: +navsim_args.MyAgent.checkpoint_path=/ckpt/agent.pth "
                                     "(docs/drive.md)")
    scenarios: str = setting("synthetic", "synthetic | a folder of driving-log clips | a batch JSONL of samples")
    num_scenarios: int = setting(4, "synthetic scenarios (logs and JSONL: every clip or sample)",
                                 Range(1, 100_000, 4, whole=True))
    scenario_seed: int = setting(0, "the synthetic scenarios drawn", SEED)
    image_root: Optional[str] = setting(None, "JSONL scenarios: relative context paths resolve against it (null: "
                                              "the JSONL's folder)")
    road: str = setting(SCENE_ROAD, "the road the model world tells the model: scene (each scenario's own) | a folder "
                                 "of AlpaSim clipgt maps, <scenario id>.zip each | one road file (.json, .csv, a "
                                 "clipgt .zip); docs/drive.md, \"Roads from maps\"", check=_road)
    world: str = setting("model", "model | truth (the synthetic world's renders) | both (the fidelity study) | "
                                  "package.module:Class (docs/drive.md, \"Your own world\")")
    vehicle: str = setting("bicycle", "how a plan moves the car, in every world alike: a tracking controller on a "
                                      "kinematic bicycle, or exactly as planned",
                           choices=tuple(VEHICLES))
    num_steps: Optional[int] = setting(None, "frames each drive generates; null: 20, or with world=both 200",
                                       Range(1, MAX_FRAMES, 20, whole=True, nullable=True))
    estimator: Optional[str] = setting(None, "an ACT-Estimator folder: plan following per drive (drives of >= 41 "
                                             "steps)")
    seed: int = setting(0, "every random stream of the run: scenario i's drives sample the world model with seed + i",
                        SEED)
    num_seeds: int = setting(1, "drives of each scenario x policy, replica k with seed + i * num_seeds + k",
                             Range(1, 1000, 1, whole=True))
    policy_timeout_s: float = setting(30.0, "a plan (any call into a policy, agent, driver or world) taking longer "
                                            "ends its drive", Range(0.001, 3600, 30))
    max_concurrent: int = setting(64, "drives in the world at once, per engine", Range(1, 4096, 64, whole=True))
    writer_processes: int = setting(1, "processes measuring and writing finished drives beside the loop (0: the "
                                       "loop's own)", Range(0, 256, 1, whole=True))
    shard_index: int = setting(0, "this machine's shard: drive k when k % num_shards == shard_index",
                               Range(0, (1 << 20) - 1, 0, whole=True))
    num_shards: int = setting(1, "", Range(1, 1 << 20, 4, whole=True))
    executor: str = setting("local", "one engine in this process, or one per GPU as Ray actors (the drives split)",
                            choices=EXECUTORS)
    ray: RayBlock = setting(RayBlock(), "")
    resume: Any = flag(True, "skip drives whose files are complete")
    videos: Any = flag(True, "an MP4 and a top-down PNG per drive beside its JSON")
    output_dir: Optional[str] = setting(None, "null: outputs/drives/<date>/<time>; keep it fixed to resume a run")
    progress: Any = flag(True, "a bar on a terminal; in a log a line a minute")
