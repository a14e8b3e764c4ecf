"""The driving loop: many drives (scenario x policy) at once in one world, step by step.

Each step, every drive still going gets an :class:`~terra.closedloop.plans.Observation` (its newest frames, ego
status, route), its policy plans (each on a thread of its own, with a deadline), and the plan goes to the drive's
vehicle (terra/closedloop/motion.py, the run's ``vehicle``: a tracking controller on a kinematic bicycle, or the
plan followed exactly): the next frame's action is the vehicle's forecast of the next 3 s, and the car moves to the
vehicle's pose 0.1 s on. Then the world generates the next frame of every drive together at the pose each car
reached (terra/closedloop/worlds.py: on the world model one batched engine, sessions sharing it). A policy that
raises, overruns its deadline or returns a plan that is not finite or of the wrong shape ends its own drive with
one recorded reason; the other drives go on.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from terra.closedloop.motion import Vehicle, action_of, make_vehicle
from terra.closedloop.plans import EgoStatus, Observation, Plan, Policy, as_plan
from terra.closedloop.scenarios import Scenario, command_of
from terra.closedloop.worlds import World
from terra.core.errors import error_line
from terra.generation.actions import ACTION_TIMES, FRAME_RATE_HZ
from terra.inputs.ego_motion import compose, to_ego

DT_S = 1.0 / FRAME_RATE_HZ


def drive_id(scenario_id: str, policy: str) -> str:
    """The id of a drive: its scenario's and its policy's (terra/closedloop/record.py names its files by it)."""
    return f"{scenario_id}__{policy}"


@dataclass(frozen=True)
class DriveSpec:
    """One drive to make: a scenario, a policy (built fresh for the drive) and the world model's seed."""

    scenario: Scenario
    policy: str  # the policy's name in records
    make_policy: Callable[[], Policy]
    seed: int = 0

    @property
    def id(self) -> str:
        return drive_id(self.scenario.id, self.policy)


def drive_specs(scenarios: Sequence[Scenario], policies: dict[str, Callable[[], Policy]], seed: int = 0,
                indices: Sequence[int] | None = None) -> list[DriveSpec]:
    """Every scenario x policy, scenario by scenario; the drives of scenario ``i`` (``indices[i]``, its index in
    the run's scenarios, when given) sample the world model with seed ``seed + i``."""
    indices = range(len(scenarios)) if indices is None else indices
    return [DriveSpec(scenario, name, factory, seed=seed + index)
            for scenario, index in zip(scenarios, indices) for name, factory in policies.items()]


@dataclass
class LoopTimings:
    """Where the loop's wall time went, in seconds (the world's own split: its ``generate_s`` and ``decode_s``)."""

    setup_s: float = 0.0  # policies built, drives opened (context frames encoded and decoded)
    policies_s: float = 0.0  # the plans: the policies of all drives plan at once, the vehicles follow them
    world_s: float = 0.0  # the world's steps (the world model's generation and decoding, or the renderer)
    record_s: float = 0.0  # the drives' files written (terra/closedloop/run.py)

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
    plans: list[Plan] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)  # actions[k] conditioned generated frame k
    poses: list[np.ndarray] = field(default_factory=list)  # [3] per frame from the last context frame, ego frame
    speeds: list[float] = field(default_factory=list)  # m/s at each pose
    policy_s: list[float] = field(default_factory=list)
    stage: str | None = None  # where it failed: setup | policy | world
    error: str | None = None
    policy: Any = None
    handle: Any = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def steps(self) -> int:
        return len(self.actions)

    def world_poses(self) -> np.ndarray:
        """``[steps + 1, 3]`` world poses (the scenario's start pose composed with the drive's own)."""
        return compose(np.asarray(self.spec.scenario.start_pose, dtype=np.float64), np.stack(self.poses))

    def command(self, plan: Plan, seconds: float = 0.0) -> None:
        """Hand the plan to the vehicle: record it and the next frame's action, the vehicle's forecast at the
        action times (the world model is shown what the car will do), and move the car to the next frame's pose.
        A plan the vehicle cannot read changes nothing (its error is raised)."""
        action = action_of(self.vehicle.forecast(plan, ACTION_TIMES))
        self.vehicle.step(plan, DT_S)
        self.plans.append(plan)
        self.actions.append(action)
        self.policy_s.append(seconds)

    def reached(self) -> np.ndarray:
        """The world pose the car reached with the last command: the next frame's."""
        return compose(np.asarray(self.spec.scenario.start_pose, dtype=np.float64), self.vehicle.pose)

    def advance(self, frame: np.ndarray) -> None:
        """Record the next frame at the pose and speed the car reached."""
        self.frames.append(np.asarray(frame))
        self.poses.append(self.vehicle.pose)
        self.speeds.append(self.vehicle.speed)

    def fail(self, stage: str, message: str) -> None:
        if self.error is None:
            self.stage, self.error = stage, message

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
        route = self.spec.scenario.route(self.world_poses()[-1])
        ego = EgoStatus(statuses[-1].speed_mps, statuses[-1].yaw_rate, statuses[-1].accel_mps2, command_of(route))
        relative = np.concatenate([to_ego(poses[:, :2], now), (poses[:, 2:] - now[2])], axis=-1)
        frames = tuple(self.frames[-history:])
        return Observation(self.steps, self.steps * DT_S, frames, ego, tuple(statuses[:-1]) + (ego,), relative, route,
                           now.copy())


def start_drive(world: World, spec: DriveSpec, num_steps: int, vehicle: str = "bicycle") -> Drive:
    """Build the drive's policy and its ``vehicle`` (a name of terra/closedloop/motion.py's ``VEHICLES``, at the
    scenario's speed) and open the drive in ``world``; a failure is recorded on the drive (stage setup)."""
    drive = Drive(spec, world.name, make_vehicle(vehicle, spec.scenario.speed_kmh / 3.6))
    try:
        drive.policy = spec.make_policy()
        drive.policy.reset(spec.scenario)
        drive.handle = world.open(spec.scenario, spec.seed, num_steps)
        context = world.context_frames(drive.handle)
    except Exception as err:  # noqa: BLE001  (a bad scenario or policy ends its drive only)
        drive.fail("setup", error_line(err))
        return drive
    drive.frames, drive.num_context = list(context), len(context)
    drive.poses, drive.speeds = [drive.vehicle.pose], [drive.vehicle.speed]
    return drive


def run_drives(world: World, specs: Sequence[DriveSpec], num_steps: int, policy_timeout_s: float = 30.0,
               history: int = 16, progress: Callable[[int], None] | None = None,
               timings: LoopTimings | None = None, vehicle: str = "bicycle") -> list[Drive]:
    """Drive every spec for ``num_steps`` frames in ``world`` (all at once, in lockstep), each car a ``vehicle``
    (terra/closedloop/motion.py); return the drives. ``progress`` gets the steps done so far; ``timings`` (when
    given) gains where the time went."""
    timings = LoopTimings() if timings is None else timings
    started = time.perf_counter()
    drives = [start_drive(world, spec, num_steps, vehicle) for spec in specs]
    timings.setup_s += time.perf_counter() - started
    try:
        for step in range(num_steps):
            going = [d for d in drives if d.ok]
            if not going:
                break
            started = time.perf_counter()
            _plan_all(going, step, policy_timeout_s, history)
            going = [d for d in going if d.ok]
            timings.policies_s += time.perf_counter() - started
            started = time.perf_counter()
            frames = world.step([d.handle for d in going], [d.actions[-1] for d in going],
                                [d.reached() for d in going]) if going else []
            timings.world_s += time.perf_counter() - started
            for drive, frame in zip(going, frames):
                if isinstance(frame, BaseException):
                    drive.fail("world", f"the {world.name} world failed at step {step}: {error_line(frame)}")
                    del drive.actions[-1], drive.plans[-1], drive.policy_s[-1]
                    continue
                drive.advance(frame)
            if progress is not None:
                progress(step + 1)
    finally:
        for drive in drives:
            close_drive(world, drive)
    return drives


def _in_thread(function: Callable, *args: Any) -> Future:
    """``function(*args)`` on a daemon thread of its own: a policy that never returns cannot keep the process
    from exiting (a pool's threads are joined at exit)."""
    future: Future = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(function(*args))
            except BaseException as err:  # noqa: BLE001  (handed to the caller)
                future.set_exception(err)

    threading.Thread(target=run, name="terra-policy", daemon=True).start()
    return future


def _plan_all(drives: list[Drive], step: int, timeout_s: float, history: int) -> None:
    """Ask every drive's policy for its plan at once; each answer is checked and goes to the drive's vehicle."""
    started = time.perf_counter()
    calls = [(drive, _in_thread(_timed_plan, drive.policy, drive.observation(history))) for drive in drives]
    deadline = started + timeout_s
    for drive, call in calls:
        name = drive.spec.policy
        try:
            value, seconds = call.result(timeout=max(0.0, deadline - time.perf_counter()))
        except FuturesTimeout:
            drive.fail("policy", f"policy {name} timed out after {timeout_s:g} s at step {step}")
            continue
        except Exception as err:  # noqa: BLE001
            drive.fail("policy", f"policy {name} failed at step {step}: {error_line(err)}")
            continue
        try:
            drive.command(as_plan(value), seconds)
        except Exception as err:  # noqa: BLE001
            drive.fail("policy", f"policy {name} returned a bad plan at step {step}: {error_line(err)}")


def _timed_plan(policy: Policy, observation: Observation) -> tuple[Any, float]:
    start = time.perf_counter()
    value = policy.plan(observation)
    return value, time.perf_counter() - start


def close_drive(world: World, drive: Drive) -> None:
    """Free the drive's session and policy; a failure here is recorded only when the drive had none."""
    for what, close in (("world", lambda: world.close(drive.handle) if drive.handle is not None else None),
                        ("policy", lambda: drive.policy.close() if drive.policy is not None else None)):
        try:
            close()
        except Exception as err:  # noqa: BLE001
            if what == "policy":
                drive.fail("policy", f"policy {drive.spec.policy} failed to close: {error_line(err)}")
    drive.handle = drive.policy = None

