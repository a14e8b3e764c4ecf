"""The driving loop: many drives (scenario x policy) at once in one world, step by step."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from terra.closedloop.guard import CallLine, UserCall, UserCodeError, handed, user_call
from terra.closedloop.car.motion import DT_S, VEHICLES, Actuation, Vehicle, action_of
from terra.closedloop.plans import EgoStatus, Observation, Plan, Policy, as_plan
from terra.closedloop.scenarios import Scenario, command_of
from terra.closedloop.worlds import World
from terra.core.errors import TerraInputError, error_line
from terra.contract.actions import ACTION_TIMES
from terra.inputs.ego_motion import compose, to_ego

def drive_id(scenario_id: str, policy: str, replica: int = 0) -> str:
    """The id of a drive."""
    return f"{scenario_id}__{policy}" + (f"__seed{replica}" if replica else "")


@dataclass(frozen=True)
class DriveSpec:
    """One drive to make: a scenario, a policy (built fresh for the drive) and the world model's seed."""

    scenario: Scenario
    policy: str  # the policy's name in records
    make_policy: Callable[[], Policy]
    seed: int = 0
    policy_args: dict | None = None  # the keyword arguments the policy is built with (a NAVSIM agent's navsim_args)
    replica: int = 0  # which of the scenario x policy's drives (num_seeds), each with a seed of its own

    @property
    def id(self) -> str:
        return drive_id(self.scenario.id, self.policy, self.replica)


def drive_specs(scenarios: Sequence[Scenario], policies: dict[str, Callable[[], Policy]], seed: int = 0,
                indices: Sequence[int] | None = None, policy_args: dict[str, dict] | None = None,
                num_seeds: int = 1) -> list[DriveSpec]:
    """Every scenario x policy x replica (``num_seeds`` of each), scenario by scenario."""
    indices = range(len(scenarios)) if indices is None else indices
    policy_args = policy_args or {}
    return [DriveSpec(scenario, name, factory, seed=seed + index * num_seeds + k, policy_args=policy_args.get(name),
                      replica=k)
            for scenario, index in zip(scenarios, indices) for name, factory in policies.items()
            for k in range(num_seeds)]


@dataclass
class LoopTimings:
    """Where the loop's wall time went, in seconds (the world's own split: its ``generate_s`` and ``decode_s``)."""

    setup_s: float = 0.0  # policies built, drives opened (context frames encoded and decoded)
    policies_s: float = 0.0  # the plans: the policies of all drives plan at once, the vehicles follow them
    world_s: float = 0.0  # the world's steps (the world model's generation and decoding, or the renderer)
    record_s: float = 0.0  # the drives' files written

    def add(self, other: "LoopTimings") -> None:
        for name, value in other.__dict__.items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class Drive:
    """A drive as it goes and once it ended: frames, plans, actions, poses and timings."""

    spec: DriveSpec
    world: str
    vehicle: Vehicle
    frames: list[np.ndarray] = field(default_factory=list)  # context frames first (as the world shows them)
    num_context: int = 0
    plans: list[Plan | Actuation] = field(default_factory=list)  # Actuation: the gymnasium env's actuation actions
    actions: list[np.ndarray] = field(default_factory=list)  # actions[k] conditioned generated frame k
    poses: list[np.ndarray] = field(default_factory=list)  # [3] per frame from the last context frame, ego frame
    speeds: list[float] = field(default_factory=list)  # m/s at each pose
    policy_s: list[float] = field(default_factory=list)
    stage: str | None = None  # where it failed: setup | policy | world
    error: str | None = None
    ended: str | None = None  # why it ended before num_steps (the car left the scene), not failed
    warnings: list[str] = field(default_factory=list)  # what went wrong without spoiling the drive (a close)
    policy: Any = None
    gil_bound: bool = False  # the policy's plans run one after another on the loop's CallLine
    handle: Any = None
    # from the world, where it tells them (None otherwise); all but route_source taken as the drive ends
    references: np.ndarray | None = None  # its view of the truth at the drive's poses (reference_frames)
    truths: dict[bytes, np.ndarray] | None = None  # its true renders by world pose (measuring renders the rest)
    route_source: str | None = None  # where the world model's routes come from (None: it is told none)
    route_told: list[str] | None = None  # each step: TOLD, or why the model was told no route

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def steps(self) -> int:
        return len(self.actions)

    def _in_world(self, poses: np.ndarray) -> np.ndarray:
        """World poses of ``poses [..., 3]`` in the drive's frame (its origin the scenario's start pose)."""
        return compose(np.asarray(self.spec.scenario.start_pose, dtype=np.float64), poses)

    def world_poses(self) -> np.ndarray:
        """``[steps + 1, 3]`` world poses (the scenario's start pose composed with the drive's own)."""
        return self._in_world(np.stack(self.poses))

    def action_for(self, plan: Plan | Actuation) -> np.ndarray:
        """The next frame's action if the car keeps to ``plan``."""
        return action_of(self.vehicle.forecast(plan, ACTION_TIMES))

    def command(self, plan: Plan | Actuation, action: np.ndarray, seconds: float = 0.0) -> None:
        """Record the plan and its action and move the car along the plan to the next frame's pose."""
        self.vehicle.step(plan, DT_S)
        self.plans.append(plan)
        self.actions.append(action)
        self.policy_s.append(seconds)

    def reached(self) -> np.ndarray:
        """The world pose the car reached with the last command: the next frame's."""
        return self._in_world(self.vehicle.pose)

    def advance(self, frame: np.ndarray) -> None:
        """Record the next frame at the pose and speed the car reached."""
        self.frames.append(np.asarray(frame))
        self.poses.append(self.vehicle.pose)
        self.speeds.append(self.vehicle.speed)

    def finished(self) -> "Drive":
        """The drive without its policy, world session and factory: what can go to another process."""
        return replace(self, spec=replace(self.spec, make_policy=None), policy=None, handle=None)

    def fail(self, stage: str, message: str) -> None:
        if self.error is None:
            self.stage, self.error = stage, message

    def end(self, reason: str) -> None:
        """End the drive early with ``reason``, its last step (the frame, pose, speed, plan and action) undone."""
        self.ended = reason
        for record in (self.frames, self.poses, self.speeds, self.plans, self.actions, self.policy_s):
            del record[-1]

    def observation(self, history: int) -> Observation:
        """What the policy sees now: the newest ``history`` frames with their ego states and poses."""
        poses = np.stack(self.poses[-history:])
        now = poses[-1]
        statuses = []
        for k in range(max(0, len(self.poses) - history), len(self.poses)):
            speed = self.speeds[k]
            accel = (speed - self.speeds[k - 1]) / DT_S if k > 0 else 0.0
            yaw_rate = (self.poses[k][2] - self.poses[k - 1][2]) / DT_S if k > 0 else 0.0
            statuses.append(EgoStatus(speed, yaw_rate, accel))
        route = self.spec.scenario.route(self._in_world(now))
        ego = replace(statuses[-1], command=command_of(route))
        relative = np.concatenate([to_ego(poses[:, :2], now), (poses[:, 2:] - now[2])], axis=-1)
        frames = tuple(self.frames[-history:])
        return Observation(self.steps, self.steps * DT_S, frames, ego, tuple(statuses[:-1]) + (ego,), relative, route,
                           now.copy())


def start_drive(world: World, spec: DriveSpec, num_steps: int, policy_timeout_s: float = 30.0,
                vehicle: str = "bicycle") -> Drive:
    """Build and reset the drive's policy, make its ``vehicle`` and open the drive in ``world``; failures recorded."""
    drive = Drive(spec, world.name, VEHICLES[vehicle](spec.scenario.speed_kmh / 3.6))
    who = f"policy {spec.policy}"
    try:
        drive.policy = policy = user_call(who, "build", policy_timeout_s, spec.make_policy)
        drive.gil_bound = user_call(who, "build", policy_timeout_s, lambda: bool(getattr(policy, "gil_bound", False)))
        scenario = handed(spec.scenario)
        user_call(who, "reset", policy_timeout_s, lambda: policy.reset(scenario))
        drive.handle = world.open(spec.scenario, spec.seed, num_steps)
        told = getattr(world, "route_source", None)
        drive.route_source = None if told is None else told(drive.handle)
        context = world.context_frames(drive.handle)
    except Exception as err:  # noqa: BLE001  (a bad scenario ends its drive only; user code's line as it is)
        drive.fail("setup", str(err) if isinstance(err, UserCodeError) else error_line(err))
        return drive
    drive.frames, drive.num_context = list(context), len(context)
    drive.poses, drive.speeds = [drive.vehicle.pose], [drive.vehicle.speed]
    return drive


def run_drives(world: World, specs: Sequence[DriveSpec], num_steps: int, policy_timeout_s: float = 30.0,
               history: int = 16, progress: Callable[[int], None] | None = None,
               timings: LoopTimings | None = None, vehicle: str = "bicycle") -> list[Drive]:
    """Drive every spec for ``num_steps`` frames in ``world``, all in lockstep; return the drives."""
    timings = LoopTimings() if timings is None else timings
    started = time.perf_counter()
    drives = [start_drive(world, spec, num_steps, policy_timeout_s, vehicle) for spec in specs]
    timings.setup_s += time.perf_counter() - started
    line = CallLine()  # the plans of policies that hold the GIL, one after another
    try:
        for step in range(num_steps):
            going = [d for d in drives if d.ok and d.ended is None]
            if not going:
                break
            started = time.perf_counter()
            _plan_all(going, step, policy_timeout_s, history, line)
            going = [d for d in going if d.ok]
            timings.policies_s += time.perf_counter() - started
            started = time.perf_counter()
            frames = world.step([d.handle for d in going], [d.actions[-1] for d in going],
                                [d.reached() for d in going]) if going else []
            timings.world_s += time.perf_counter() - started
            for drive, frame in zip(going, frames):
                if isinstance(frame, BaseException):
                    why = str(frame) if isinstance(frame, UserCodeError) else error_line(frame)  # a user world's line
                    drive.fail("world", f"the {world.name} world failed at step {step}: {why}")
                    del drive.actions[-1], drive.plans[-1], drive.policy_s[-1]
                    continue
                drive.advance(frame)
                left = drive.spec.scenario.left_scene(drive.reached())
                if left is not None:
                    drive.end(f"{left} at step {step}")
            if progress is not None:
                progress(step + 1)
    finally:
        close_drives(world, drives, policy_timeout_s)
    return drives


def _plan_all(drives: list[Drive], step: int, timeout_s: float, history: int, line: CallLine) -> None:
    """Ask every drive's policy for its plan at once; each answer is checked and goes to the drive's vehicle."""
    calls = [(drive, UserCall(f"policy {drive.spec.policy}", f"plan at step {step}", _timed_plan, drive.policy,
                              handed(drive.observation(history)), line=line if drive.gil_bound else None))
             for drive in drives]
    line.drain(timeout_s)
    for drive, call in calls:
        try:
            plan, seconds, problem = call.result(timeout_s)
        except UserCodeError as err:
            drive.fail("policy", str(err))
            continue
        try:
            if problem is not None:
                raise problem
            action = drive.action_for(plan)
        except Exception as err:  # noqa: BLE001
            drive.fail("policy", f"policy {drive.spec.policy} returned a bad plan at step {step}: {error_line(err)}")
            continue
        drive.command(plan, action, seconds)


def _timed_plan(policy: Policy, observation: Observation) -> tuple[Plan | None, float, Exception | None]:
    """The policy's plan, read (:func:`as_plan`) on the policy's own thread, under its deadline."""
    start = time.perf_counter()
    value = policy.plan(observation)
    seconds = time.perf_counter() - start
    try:
        return as_plan(value), seconds, None
    except Exception as err:  # noqa: BLE001  (worded by the loop: "returned a bad plan")
        return None, seconds, TerraInputError(f"{error_line(err)} (it returned a {type(value).__name__})")


def close_drives(world: World, drives: Sequence[Drive], policy_timeout_s: float = 30.0) -> None:
    """Free the drives' sessions and policies; the policies' closes run at once, each within ``policy_timeout_s``."""
    calls = []
    references = getattr(world, "reference_frames", None)
    truths = getattr(world, "true_renders", None)
    route_told = getattr(world, "route_told", None)
    for drive in drives:
        with contextlib.suppress(Exception):  # the world's session is gone either way
            if drive.handle is not None:
                if route_told is not None:
                    drive.route_told = route_told(drive.handle)
                if references is not None and drive.ok:
                    drive.references = references(drive.handle)
                if truths is not None and drive.ok:
                    drive.truths = truths(drive.handle)
                world.close(drive.handle)
        if drive.policy is not None:
            calls.append((drive, UserCall(f"policy {drive.spec.policy}", "close",
                                          lambda policy=drive.policy: policy.close())))
        drive.handle = drive.policy = None
    for drive, call in calls:
        try:
            call.result(policy_timeout_s)
        except UserCodeError as err:
            drive.warnings.append(str(err))

