"""Where a drive starts: context frames, the actions between them, the speed, and what is known of the world."""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from terra.closedloop.car.vehicle import EGO_LENGTH_M
from terra.config.checks import one_line
from terra.core.errors import TerraInputError, past
from terra.contract.actions import FRAME_RATE_HZ, MAX_ACTION_M, MAX_SPEED_MPS
from terra.contract.routes import NO_LANE_NEAR
from terra.inputs.ego_motion import speed_of, to_ego
from terra.inputs.routes import ROUTE_KEYS
from terra.inputs.samples import Sample, read_samples
from terra.inputs.trajectory import MAX_COORDINATE_M, EgoTrajectory
from terra.roads import Road, routes_along, told_route_at
from terra.sim.clips import FUTURE_S, clip_from_trajectory
from terra.sim.renderer import FAR_M
from terra.sim.scene import Scene

ROUTE_AHEAD_M = 60.0  # route points ahead of the car
ROUTE_STEP_M = 2.0
VERDICT_ROUTE_POINTS = 2  # a road's verdict at a pose does not depend on how many points its route has
COMMAND_TURN_M = 2.0  # the route 20 m ahead this far to a side is a turn
SCENE_LENGTH_M = 600.0
ROAD_SAMPLE_M = 0.5  # where no segment's perpendicular reaches a car, its nearest centreline point this finely
SYNTHETIC = "synthetic"  # the scenarios setting of the true world's scenarios
NO_SAMPLE_ROUTE = ("terra-drive takes no route from a JSONL sample: a drive goes where its policy steers, and only "
                   "the synthetic scenarios know their road (docs/drive.md, \"Routes\")")
Reads = tuple[tuple[str, str], ...]  # (what, path) of files and folders read


@dataclass(frozen=True)
class Scenario:
    """A drive's start."""

    id: str
    images: np.ndarray  # uint8 [n, H, W, 3] context frames at the tokenizer's size, oldest first
    actions: np.ndarray  # [n - 1, 6, 3] the actions between them
    speed_kmh: float  # at the last context frame
    start_pose: np.ndarray  # world pose of the last context frame
    scene: Scene | None = None  # the true world's scene: a route and ground truth
    context_poses: np.ndarray | None = None  # [n, 3] world poses of the context frames, where the scene is known
    path: np.ndarray | None = None  # [M, 2] a recorded world path ahead (driving logs), used as the route
    road: Road | None = None  # a road read from a map: the model world's routes come from it instead of the scene
    road_source: str = "clipgt map"  # where ``road`` was read from, as a drive's record says
    source: str = ""
    reads: Reads = ()  # the files and folders it was read from (outputs stay apart from them)

    def route(self, pose: np.ndarray) -> np.ndarray:
        """The route ahead of world ``pose`` in its ego frame ``[M, 2]`` (empty when none is known)."""
        if self.scene is not None:
            s, _ = self.scene.road_coords(np.array([pose[0]]), np.array([pose[1]]))
            ahead = self.scene.lane_pose(s[0] + np.arange(0.0, ROUTE_AHEAD_M, ROUTE_STEP_M))[:, :2]
        elif self.path is not None and len(self.path) >= 2:
            nearest = int(np.argmin(np.hypot(*(self.path - pose[:2]).T)))
            ahead = self.path[nearest:]
        else:
            return np.zeros((0, 2))
        return to_ego(ahead, pose)

    @property
    def route_source(self) -> str | None:
        """Where :meth:`model_routes` reads from, as a drive's record says: ``road_source``, ``scene`` or None."""
        return self.road_source if self.road is not None else "scene" if self.scene is not None else None

    def model_routes(self, poses: np.ndarray, route_tokens: int) -> np.ndarray | None:
        """The world model's routes at world ``poses`` ``[..., 3]``."""
        if self.road is not None:
            poses = np.asarray(poses, dtype=np.float64)
            routes = routes_along(self.road, poses.reshape(-1, 3), route_tokens)
            return routes.reshape(poses.shape[:-1] + routes.shape[1:])
        return None if self.scene is None else self.scene.route(poses, route_tokens)

    def why_no_route(self, pose: np.ndarray) -> str:
        """Why :meth:`model_routes` at world ``pose`` tells no route: ``NO_LANE_NEAR`` or ``ROAD_ENDED``."""
        return NO_LANE_NEAR if self.road is None else told_route_at(self.road, pose, VERDICT_ROUTE_POINTS)[1]

    def left_scene(self, pose: np.ndarray) -> str | None:
        """Why a car at world ``pose`` has left the scenario's scene; None while in it or when the scene is unknown."""
        if self.scene is None:
            return None
        x, y = float(pose[0]), float(pose[1])
        s, d = (float(v[0]) for v in self.scene.road_coords(np.array([x]), np.array([y])))
        beyond = False
        if not np.isfinite(d):  # no segment's perpendicular reaches the car (past an end, or a bend's centre)
            along = np.linspace(0.0, self.scene.length_m, int(self.scene.length_m / ROAD_SAMPLE_M) + 1)
            points = self.scene.road_pose(along)
            gaps = np.hypot(points[:, 0] - x, points[:, 1] - y)
            nearest = int(np.argmin(gaps))
            s, d, beyond = float(along[nearest]), float(gaps[nearest]), nearest in (0, len(along) - 1)
        if beyond or s >= self.scene.length_m - EGO_LENGTH_M / 2:
            return f"the car reached an end of the scene's {self.scene.length_m:.0f} m road"
        if abs(d) > FAR_M:
            return f"the car left the scene, {past(abs(d), FAR_M)} m from the road (the world draws {FAR_M:g} m)"
        return None


def check_scenario(scenario: Scenario, where: str) -> None:
    """A scenario of the caller's (the gym env's ``scenarios``, drives) checked whole, once, where it enters."""
    if not isinstance(scenario.id, str) or not scenario.id:
        raise TerraInputError(f"{where}: id must be a non-empty string (got {scenario.id!r:.40})")
    where = f"{where} ({one_line(scenario.id)})"
    images = scenario.images
    if not isinstance(images, np.ndarray) or images.ndim != 4 or images.shape[-1] != 3 or not len(images) \
            or images.dtype != np.uint8:
        raise TerraInputError(f"{where} holds no context frames uint8 [n, H, W, 3] (got "
                              f"{getattr(images, 'dtype', type(images).__name__)} of shape "
                              f"{list(getattr(images, 'shape', []))})")
    n = len(images)
    speed = scenario.speed_kmh
    if not isinstance(speed, (int, float, np.integer, np.floating)) or isinstance(speed, bool) \
            or not 0 <= speed <= MAX_SPEED_MPS * 3.6:
        raise TerraInputError(f"{where}: speed_kmh must be a number from 0 to {MAX_SPEED_MPS * 3.6:g} (km/h at the "
                              f"last context frame; got {speed!r:.40})")
    if scenario.scene is not None and not isinstance(scenario.scene, Scene):
        raise TerraInputError(f"{where}: scene must be a Scene or None (got a {type(scenario.scene).__name__}); "
                              "a scenario of your own has no scene (terra/sim/scene.py)")
    if scenario.road is not None and not isinstance(scenario.road, Road):
        raise TerraInputError(f"{where}: road must be a Road or None (got a {type(scenario.road).__name__})")
    for name, shape, what, bound in (
            ("actions", (n - 1, 6, 3), "the actions between its context frames", MAX_ACTION_M),
            ("start_pose", (3,), "the world pose (x, y, yaw) of its last context frame", MAX_COORDINATE_M),
            ("context_poses", (n, 3), "world poses (x, y, yaw) of its context frames", MAX_COORDINATE_M),
            ("path", ("M", 2), "world points (x, y) of a recorded path ahead", MAX_COORDINATE_M)):
        value = getattr(scenario, name)
        if value is None and name in ("context_poses", "path"):
            continue
        problem = _array_problem(value, shape, bound)
        if problem:
            optional = "None or " if name in ("context_poses", "path") else ""
            raise TerraInputError(f"{where}: {name} must be {optional}[{', '.join(map(str, shape))}] finite numbers "
                                  f"within {bound:g} ({what}); got {problem}")


def _array_problem(value, shape: tuple, bound: float) -> str | None:
    """What is wrong with ``value`` as a finite array of ``shape`` (``"M"``: any length) within ``bound``, or None."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return f"a {type(value).__name__} that is not an array of numbers"
    if array.ndim != len(shape) or any(want != "M" and got != want for got, want in zip(array.shape, shape)):
        return f"shape {list(array.shape)}"
    if not np.isfinite(array).all():
        return "an array that holds NaN or inf"
    if array.size and np.abs(array).max() > bound:
        return f"an array that holds {past(np.abs(array).max(), bound)}"
    return None

def command_of(route: np.ndarray) -> str:
    """NAVSIM's driving command from a route in the ego frame: where it is 20 m ahead."""
    if len(route) < 2:
        return "unknown"
    along = np.hypot(*np.diff(route, axis=0).T).cumsum()
    lateral = float(np.interp(20.0, np.r_[0.0, along], route[:, 1]))
    return "left" if lateral > COMMAND_TURN_M else "right" if lateral < -COMMAND_TURN_M else "straight"


@dataclass(frozen=True)
class ScenarioSource:
    """A run's scenarios before any frame is read: their ids, what each reads, and how to load them (:meth:`load`)."""

    kind: str  # synthetic | logs | samples
    ids: tuple[str, ...]
    reads: tuple[Reads, ...]  # per scenario: the files and folders it reads
    seed: int = 0  # synthetic: the scenarios drawn
    clips: tuple[Path, ...] = ()  # driving logs: the clip folder of each scenario
    samples: tuple[Sample, ...] = ()  # a JSONL of samples: the sample of each scenario
    image_root: str | None = None  # a batch JSONL: where relative context paths start (None: the JSONL's folder)
    roads: tuple[Road, ...] = ()  # per scenario, a road read from a map that the model world's routes come from
    road_source: str = ""  # where ``roads`` were read from: ``clipgt map`` (a folder of maps) or a road file's name

    @property
    def inputs(self) -> Reads:
        """Every file and folder the scenarios read, each once."""
        return tuple(dict.fromkeys(item for reads in self.reads for item in reads))

    def load(self, image_size: Sequence[int], num_context: int = 3, resize: str = "crop",
             indices: Iterable[int] | None = None) -> list[Scenario]:
        """The scenarios at ``indices`` (default: all), their context frames read and fitted to ``image_size``."""
        chosen = range(len(self.ids)) if indices is None else sorted(set(indices))
        if self.kind == SYNTHETIC:
            loaded = synthetic_scenarios(len(self.ids), self.seed, image_size, num_context, indices=chosen)
        elif self.kind == "logs":
            loaded = [_log_scenario(self.clips[i], image_size, num_context, resize, self.reads[i]) for i in chosen]
        else:
            loaded = [_sample_scenario(self.samples[i], image_size, num_context, self.image_root, resize,
                                       self.reads[i]) for i in chosen]
        if not self.roads:
            return loaded
        return [replace(s, road=self.roads[i], road_source=self.road_source, reads=self.reads[i])
                for i, s in zip(chosen, loaded)]


def scenario_source(scenarios: str | Path, num_scenarios: int = 4, seed: int = 0,
                    image_root: str | None = None) -> ScenarioSource:
    """The scenarios a ``scenarios`` setting names."""
    if str(scenarios) == SYNTHETIC:
        ids = tuple(synthetic_id(seed, i) for i in range(num_scenarios))
        return ScenarioSource(SYNTHETIC, ids, ((),) * num_scenarios, seed=seed)
    path = Path(scenarios).expanduser()
    if not path.exists():
        raise TerraInputError(f"scenarios={scenarios} does not exist; give synthetic, a folder of driving-log clips "
                              "or a JSONL of samples")
    if path.is_dir():
        from terra.inputs.driving_logs import clip_folders

        clips = tuple(clip_folders(path))
        if not clips:
            raise TerraInputError(f"scenarios: driving-log folder {path} holds no clip folders")
        reads = ((("driving-log folder", str(path)),),) * len(clips)
        return ScenarioSource("logs", tuple(f"log-{clip.name}" for clip in clips), reads, clips=clips)
    samples = read_samples(path)
    for sample in samples:
        if sample.error is not None:
            raise TerraInputError(f"scenarios: {path.name} {sample.error}")
        carried = [key for key in ROUTE_KEYS if sample.record.get(key) is not None]
        if carried:
            raise TerraInputError(f"scenarios: {path.name} line {sample.line}: gives {carried[0]}, but "
                                  f"{NO_SAMPLE_ROUTE}; leave it out")
    if not samples:
        raise TerraInputError(f"scenarios: {path} holds no samples")
    return ScenarioSource("samples", tuple(f"sample-{s.record['sample_id']}" for s in samples),
                          tuple(_sample_reads(s, image_root) for s in samples), samples=tuple(samples),
                          image_root=image_root)


def synthetic_id(seed: int, index: int) -> str:
    """The id of synthetic scenario ``index`` drawn with ``seed``."""
    return f"synthetic-{seed}-{index:03d}"


def synthetic_scenarios(count: int, seed: int, image_size: Sequence[int], num_context: int = 3,
                        indices: Iterable[int] | None = None) -> list[Scenario]:
    """``count`` scenarios of the true world (or those at ``indices`` of them)."""
    rng = np.random.default_rng([int(seed), 0xD21E])
    chosen = set(range(count) if indices is None else indices)
    out = []
    for i in range(count):
        scene_seed = int(rng.integers(2**31))  # every scenario's draws, so that a subset is the same scenarios
        speed, start_s = float(rng.uniform(20.0, 40.0)), float(rng.uniform(10.0, 200.0))
        if i not in chosen:
            continue
        scene = Scene.generate(scene_seed, SCENE_LENGTH_M)
        t = np.arange(0.0, (num_context - 1) / FRAME_RATE_HZ + FUTURE_S + 0.05, 0.01)
        poses = scene.lane_pose(start_s + speed / 3.6 * t)
        trajectory = EgoTrajectory(t=t, x=poses[:, 0], y=poses[:, 1], yaw=np.unwrap(poses[:, 2]))
        clip = clip_from_trajectory(scene, trajectory, num_context, int(image_size[0]), int(image_size[1]),
                                    "follow_lane", start_s, speed)
        out.append(Scenario(synthetic_id(seed, i), clip.frames, clip.actions[: num_context - 1],
                            speed_of(clip.actions[-1]), clip.poses[-1], scene=scene, context_poses=clip.poses,
                            source=f"synthetic scene {scene.seed} at s={start_s:.0f} m, {speed:.0f} km/h"))
    return out


def log_scenarios(logs: str | Path, image_size: Sequence[int], num_context: int = 3,
                  resize: str = "stretch") -> list[Scenario]:
    """A scenario per clip folder of a driving log (the first ``num_context`` frames at 10 Hz)."""
    folder = Path(logs).expanduser()
    if not folder.is_dir():
        raise TerraInputError(f"scenarios: driving-log folder {folder} does not exist; give a folder of clip folders")
    return scenario_source(folder).load(image_size, num_context, resize)


def _log_scenario(clip_dir: Path, image_size: Sequence[int], num_context: int, resize: str,
                  reads: Reads) -> Scenario:
    from terra.inputs import driving_logs as logs_lib

    try:
        clip = logs_lib.open_clip(clip_dir)
        kept = logs_lib.Resampled()
        frames = [read() for read in islice(logs_lib.clip_frames(clip, tuple(image_size), resize, FRAME_RATE_HZ, kept),
                                            num_context)]
        if len(frames) < num_context:
            raise TerraInputError(f"has {len(frames)} frames at 10 Hz, fewer than num_context={num_context}")
        motion = logs_lib.read_motion(clip.trajectory)
        actions = logs_lib.clip_actions(motion, kept, clip.shared_clock)
    except TerraInputError as err:
        raise TerraInputError(f"scenarios: driving-log clip {clip_dir.name} {err}") from None
    path = start = None
    if isinstance(motion, EgoTrajectory):
        times = np.asarray(kept.times) if clip.shared_clock else np.asarray(kept.times) - kept.times[0] + motion.t[0]
        start = motion.poses_at(np.array([times[-1]]))[0]
        later = motion.t > times[-1]
        path = np.stack([motion.x[later], motion.y[later]], axis=-1)
    return Scenario(f"log-{clip_dir.name}", np.stack(frames), actions[: num_context - 1], speed_of(actions[-1]),
                    np.zeros(3) if start is None else start, path=path, source=f"driving log {clip_dir}",
                    reads=reads)


def _context_items(record: dict) -> list[str]:
    items = record["context_frames"] if "context_frames" in record else record["context"]
    return [items] if isinstance(items, str) else list(items)


def _sample_reads(sample: Sample, image_root: str | None) -> Reads:
    """What a JSONL sample reads."""
    from terra.inputs.context import resolve_path

    jsonl_dir = Path(sample.file).resolve().parent
    root = Path(image_root).expanduser() if image_root else jsonl_dir
    reads = [("scenarios file", str(Path(sample.file).expanduser()))]
    reads += [("context", resolve_path(item, root)) for item in _context_items(sample.record)]
    trajectory = sample.record.get("trajectory")
    if isinstance(trajectory, str):
        reads.append(("trajectory file", resolve_path(trajectory, jsonl_dir)))
    return tuple(reads)


def _sample_scenario(sample: Sample, image_size: Sequence[int], num_context: int, image_root: str | None, resize: str,
                     reads: Reads) -> Scenario:
    from terra.inputs.context import load_context
    from terra.inputs.actions import TRAJECTORY_KEYS
    from terra.inputs.requests import trajectory_actions

    record = sample.record
    jsonl_dir = Path(sample.file).resolve().parent
    root = Path(image_root).expanduser() if image_root else jsonl_dir
    where = f"scenarios: sample {record['sample_id']!r}"
    items = _context_items(record)
    images, _ = load_context(items, tuple(image_size), num_context, base=root, resize=resize)
    n = len(images)
    if sample.kind == "actbench":
        actions = trajectory_actions({"instruction_trajs": record["instruction_trajs"]}, n, 1, where,
                                     skip=len(items) - n)
    else:
        given = [k for k in TRAJECTORY_KEYS if k in record]
        if not given:
            raise TerraInputError(f"{where} has no trajectory; add one of {', '.join(TRAJECTORY_KEYS)}")
        value = record[given[0]]
        trajectory = value if given[0] == "trajectory" and isinstance(value, str) else {given[0]: value}
        actions = trajectory_actions(trajectory, n, 1, where, base=jsonl_dir, no_route=NO_SAMPLE_ROUTE)
    frames = ((images.permute(0, 2, 3, 1).numpy() + 1.0) * 127.5).round().clip(0, 255).astype(np.uint8)
    return Scenario(f"sample-{record['sample_id']}", frames, actions[: n - 1], speed_of(actions[n - 1]), np.zeros(3),
                    source=f"{Path(sample.file).name} line {sample.line}", reads=reads)
