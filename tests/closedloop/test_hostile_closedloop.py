"""Hostile inputs to the closed loop (terra-drive, its drivers and agents, the gymnasium envs), by class:

* one output folder, one app: a drive run into a rollout folder and the reverse are refused, nothing written;
* user code (policies, NAVSIM agents, gRPC drivers) behind one boundary: ``sys.exit``, exceptions and hangs in
  build, reset, plan and close fail that drive only, with one line naming the policy and the call; observations
  are read-only, so the recorded video is what the world made;
* deadlines: every gRPC call under ``policy_timeout_s``; a close that hangs after a good drive is a warning; a drive
  ends when the car leaves the scene;
* the gymnasium envs refuse bad scenarios, options, actions and seeds as gymnasium's own do, need ``reset()`` after
  the end, and step all or nothing;
* nonsense refused before any work (exit 2, one line, nothing written, no Hydra folder);
* one line per problem on stderr: no gRPC traceback or C-core lines, no argparse usage, no RuntimeWarning.

Everything runs on the true world's frames (``world=truth``: the renderer, fast) and tiny drives; a hang
test uses a small ``policy_timeout_s`` and bounds how long the drive took.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import imageio.v3 as iio
import numpy as np
import pytest

from terra.batch.config import APP as ROLLOUT
from terra.closedloop.study.drives import terra_drive as run_drive_settings
from terra.closedloop.policies.egodriver import EgodriverPolicy
from terra.closedloop.loop import DriveSpec, run_drives
from terra.closedloop.policies.navsim import CAMERAS, NavsimPolicy
from terra.closedloop.policies.builtin import reference_policy
from terra.closedloop.recording.run import RunSettings
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.worlds import TrueWorld
from terra.config.manifest import Manifest, read_manifest
from terra.config.output_dir import claim_output_dir
from terra.config.ray_settings import check_executor
from terra.core.atomic import MARKER, owner
from terra.core.errors import TerraInputError
from tests.closedloop.conftest import (LaneCentre, LoopbackDriver, drive_and_record, drive_settings_of, grpc_server,
                                       importable_modules)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)
TRUTH = ["num_scenarios=1", "num_steps=2", "policies=[constant_speed]", "progress=false"]  # on world=truth


def app(module: str, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"terra.apps.{module}", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=ENV)


def refused(result: subprocess.CompletedProcess, prog: str, text: str) -> str:
    """The one line of a run refused before any work (exit 2, nothing on stdout)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and text in lines[0], result.stderr
    assert not result.stdout.strip(), result.stdout
    return lines[0]


# ---------------------------------------------------------------- one output folder, one app


def test_drives_and_rollouts_never_share_a_folder(tmp_path):
    rollout, legacy = tmp_path / "rollout", tmp_path / "legacy"
    claim_output_dir(rollout, "output.dir", files=["manifest.jsonl"], app=ROLLOUT).record()
    legacy.mkdir()  # a rollout folder from before owners were recorded: its manifest says whose it is
    (legacy / MARKER).write_text(json.dumps({"written_by": "terra-world-model", "names": ["manifest.jsonl"]}))
    for folder in (rollout, legacy):
        manifest = Manifest(folder / "manifest.jsonl")
        manifest.add({"sample_id": "a", "status": "ok"})
        manifest.close()
        before = sorted(p.name for p in folder.iterdir()), (folder / "manifest.jsonl").read_bytes()
        with pytest.raises(TerraInputError, match=f"^output_dir={folder} holds the outputs of terra-rollout, which "
                                                  "terra-drive would write over or mix with"):
            drive_settings_of(folder, *TRUTH)
        assert (sorted(p.name for p in folder.iterdir()), (folder / "manifest.jsonl").read_bytes()) == before
    drives = tmp_path / "drives"
    assert run_drive_settings(drive_settings_of(drives, *TRUTH), progress=False).exit_code == 0
    assert owner(drives) == "terra-drive"
    (tmp_path / "s.jsonl").write_text('{"sample_id": "a", "context": "ctx", "manoeuvre": "straight"}\n')
    before = sorted(p.name for p in drives.iterdir())
    result = app("rollout", "samples=s.jsonl", f"output.dir={drives}", cwd=tmp_path)
    refused(result, "terra-rollout", f"output.dir={drives} holds the outputs of terra-drive")
    assert sorted(p.name for p in drives.iterdir()) == before


# ---------------------------------------------------------------- user code behind one boundary

SIZE = (72, 128)
STRAIGHT = np.c_[4.0 * np.arange(1, 9), np.zeros((8, 2))]  # 8 m/s straight ahead, NAVSIM's 8 poses at 0.5 s


class Straight:
    """Plans straight ahead at 30 m/s whatever the road does: it leaves a synthetic road's 600 m in some 200 steps."""

    name = "straight"

    def reset(self, scenario):
        pass

    def plan(self, obs):
        return np.c_[15.0 * np.arange(1, 9), np.zeros((8, 2))]

    def close(self):
        pass


class Hostile:
    """A policy that misbehaves in one call (``build``, ``reset``, ``plan``, ``close``) as told: ``exit``
    (sys.exit(3)), ``raise``, ``hang`` (until released), ``interrupt`` (KeyboardInterrupt) or ``write`` (writes
    into its camera frame)."""

    def __init__(self, call: str, how: str, release: threading.Event) -> None:
        self.name, self.call, self.how, self.release = f"{call}_{how}", call, how, release
        self.misbehave("build")

    def misbehave(self, call: str) -> None:
        if call != self.call:
            return
        if self.how == "exit":
            sys.exit(3)
        if self.how == "raise":
            raise RuntimeError("boom")
        if self.how == "interrupt":
            raise KeyboardInterrupt
        if self.how == "hang":
            self.release.wait()

    def reset(self, scenario) -> None:
        if self.how == "write" and self.call == "reset":
            scenario.images[:] = 0
        self.misbehave("reset")

    def plan(self, observation):
        if self.how == "write" and self.call == "plan":
            observation.frame[:] = 0
        self.misbehave("plan")
        return STRAIGHT

    def close(self) -> None:
        self.misbehave("close")


@pytest.fixture
def release():
    event = threading.Event()
    yield event
    event.set()  # hung policies' threads end with the test


def hostile_specs(scenario, cases, release):
    return [DriveSpec(scenario, f"{call}_{how}", lambda call=call, how=how: Hostile(call, how, release))
            for call, how in cases]


def test_user_code_that_exits_raises_or_hangs_fails_its_own_drive_only(release):
    scenario = synthetic_scenarios(1, 2, SIZE)[0]
    cases = [(call, how) for call in ("build", "reset", "plan") for how in ("exit", "raise", "hang")]
    specs = [*hostile_specs(scenario, cases, release), DriveSpec(scenario, "fine", Straight)]
    started = time.perf_counter()
    drives = {d.spec.policy: d for d in run_drives(TrueWorld(SIZE), specs, 3, policy_timeout_s=2.0)}
    took = time.perf_counter() - started
    assert drives["fine"].ok and drives["fine"].steps == 3
    for call, how in cases:
        drive = drives[f"{call}_{how}"]
        where = "plan at step 0" if call == "plan" else call
        expected = {"exit": f"failed in {where}: it called sys.exit(3)",
                    "raise": f"failed in {where}: RuntimeError: boom", "hang": f"timed out after 2 s in {where}"}
        assert not drive.ok and drive.error == f"policy {call}_{how} {expected[how]}", drive.error
        assert drive.stage == ("policy" if call == "plan" else "setup") and drive.steps == 0
    assert took < 3 * 2.0 + 20, took  # three hangs of 2 s each, not a fixed 30 s per call


def test_a_policy_that_fails_to_close_after_a_good_drive_leaves_a_warning(release, tmp_path):
    scenario = synthetic_scenarios(1, 2, SIZE)[0]
    specs = hostile_specs(scenario, [("close", "exit"), ("close", "raise"), ("close", "hang")], release)
    result = drive_and_record(TrueWorld(SIZE), specs, RunSettings(tmp_path / "run", num_steps=2, progress=False,
                                                                  policy_timeout_s=2.0))
    assert result.counts == {"ok": 3, "failed": 0, "skipped": 0}
    for spec, text in zip(specs, ("failed in close: it called sys.exit(3)", "failed in close: RuntimeError: boom",
                                  "timed out after 2 s in close")):
        record = json.loads((tmp_path / "run" / f"{spec.id}.json").read_text())
        assert record["status"] == "ok" and record["complete"] and record["steps"] == 2
        assert record["warnings"] == [f"policy {spec.policy} {text}"]


def test_ctrl_c_raised_by_a_policy_stops_the_run(release):
    scenario = synthetic_scenarios(1, 2, SIZE)[0]
    with pytest.raises(KeyboardInterrupt):
        run_drives(TrueWorld(SIZE), hostile_specs(scenario, [("plan", "interrupt")], release), 2)


@dataclass
class _Trajectory:  # navsim.common.dataclasses.Trajectory, as an agent returns it
    poses: np.ndarray
    trajectory_sampling: Any = field(default_factory=lambda: type("Sampling", (), {"interval_length": 0.5})())


class ExitingAgent:
    """A NAVSIM agent that ends the process on its second plan."""

    def initialize(self) -> None:
        self.calls = 0

    def compute_trajectory(self, agent_input):
        self.calls += 1
        if self.calls == 2:
            sys.exit(3)
        return _Trajectory(STRAIGHT)


class PaintingAgent(ExitingAgent):
    """A NAVSIM agent that paints its newest camera frame black in place."""

    def compute_trajectory(self, agent_input):
        agent_input.cameras[-1].cam_f0.image[:] = 0
        return _Trajectory(STRAIGHT)


def test_an_agent_that_exits_or_paints_its_frames_fails_its_drive_and_changes_nothing_recorded(tmp_path, release):
    scenarios = synthetic_scenarios(2, 2, SIZE)
    clean = [s.images.copy() for s in scenarios]
    specs = [DriveSpec(s, name, factory) for s in scenarios for name, factory in (
        ("exits", lambda: NavsimPolicy(ExitingAgent(), "exits")),
        ("paints", lambda: NavsimPolicy(PaintingAgent(), "paints")),
        ("reset_write", lambda: Hostile("reset", "write", release)),
        ("plan_write", lambda: Hostile("plan", "write", release)),
        ("fine", reference_policy("constant_speed")))]
    result = drive_and_record(TrueWorld(SIZE), specs, RunSettings(tmp_path / "run", num_steps=3, progress=False))
    assert result.counts == {"ok": 2, "failed": 8, "skipped": 0}
    records = {r["drive"]: r for r in read_manifest(tmp_path / "run" / "manifest.jsonl")}
    assert len(records) == 10
    read_only = "assignment destination is read-only (what user code is handed is read-only: copy an array"
    for scenario, images in zip(scenarios, clean):
        np.testing.assert_array_equal(scenario.images, images)  # no drive changed a scenario
        expected = {"exits": "policy exits failed in plan at step 1: it called sys.exit(3)",
                    "paints": f"policy paints failed in plan at step 0: ValueError: {read_only}",
                    "reset_write": f"policy reset_write failed in reset: ValueError: {read_only}",
                    "plan_write": f"policy plan_write failed in plan at step 0: ValueError: {read_only}"}
        for name, error in expected.items():
            assert records[f"{scenario.id}__{name}"]["error"].startswith(error), records[f"{scenario.id}__{name}"]
        video = iio.imread(tmp_path / "run" / f"{scenario.id}__exits.mp4")
        assert len(video) == 3 + 1 and video[:3].mean() > 50  # the context and one frame, as the world made them


# ---------------------------------------------------------------- gRPC drivers: deadlines and answers


def driven(target: str, timeout_s: float, steps: int = 2):
    """One drive of the driver at ``target`` on the true world, and how long it took."""
    scenario = synthetic_scenarios(1, 2, SIZE)[0]
    spec = DriveSpec(scenario, "remote", lambda: EgodriverPolicy(target, "remote", timeout_s))
    started = time.perf_counter()
    [drive] = run_drives(TrueWorld(SIZE), [spec], steps, policy_timeout_s=timeout_s)
    return drive, time.perf_counter() - started


def overran(line: str, call: str) -> bool:
    """Whether ``line`` is the one line of a driver call that overran its 2 s in ``call``: the boundary's own
    (terra/closedloop/guard.py) or, when gRPC's deadline of the same 2 s fires first, gRPC's."""
    return re.fullmatch(rf"policy remote (timed out after 2 s in {call}|failed in {call}: driver at \S+: "
                        r"DEADLINE_EXCEEDED: Deadline Exceeded)", line) is not None


@pytest.mark.parametrize("hang, call", [("get_version", "reset"), ("start_session", "reset"),
                                        ("drive", "plan at step 0")])
def test_a_driver_that_never_answers_costs_its_drive_the_deadline_and_no_more(release, hang, call):
    with grpc_server(LoopbackDriver(release, hang=hang)) as target:
        drive, took = driven(target, 2.0)
    assert not drive.ok and overran(drive.error, call), drive.error
    assert took < 10, took  # the hung call's deadline and a prompt close, not 30 s each


def test_a_drive_that_went_fine_stays_ok_when_close_session_hangs(release, tmp_path):
    with grpc_server(LoopbackDriver(release, hang="close_session")) as target:
        drive, took = driven(target, 2.0)
    assert drive.ok and drive.steps == 2 and took < 10, (drive.error, took)
    assert len(drive.warnings) == 1 and overran(drive.warnings[0], "close"), drive.warnings


def test_drivers_that_never_answer_close_session_cost_the_run_one_deadline(release):
    """Four drives whose driver hangs in close_session: the closes run at once, 2 s in all, not 2 s a drive."""
    scenario = synthetic_scenarios(1, 2, SIZE)[0]
    with grpc_server(LoopbackDriver(release, hang="close_session")) as target:
        specs = [DriveSpec(scenario, f"remote{k}", lambda: EgodriverPolicy(target, "remote", 2.0)) for k in range(4)]
        started = time.perf_counter()
        drives = run_drives(TrueWorld(SIZE), specs, 1, policy_timeout_s=2.0)
        took = time.perf_counter() - started
    assert all(d.ok and len(d.warnings) == 1 and "close" in d.warnings[0] for d in drives), [d.warnings for d in drives]
    assert took < 6.0, took  # one deadline (and the drives' step), not four


@pytest.mark.parametrize("poses, text", [
    ([(0.8, 0, 0, 0, 0, 0, 0)] * 3, "pose 0 has a degenerate rotation (a quaternion of norm 0)"),
    ([(0.8, 0, 0, float("nan"), 0, 0, 1)], "pose 0 has a degenerate rotation (a quaternion of norm nan)"),
    ([(0.8, 0, 0, 0, 0, 0, 1), (float("inf"), 0, 0, 0, 0, 0, 1)], "pose 1 is (inf, 0, 0), not finite numbers"),
    ([(1e20, 0, 0, 1e20, 1e20, 0, 0)], "pose 0 is (1e+20, 0, 0), not finite numbers within 1e+07 m"),
])
def test_a_driver_plan_of_degenerate_poses_fails_its_drive(release, poses, text):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning from the geometry either
        with grpc_server(LoopbackDriver(release, poses=poses)) as target:
            drive, _ = driven(target, 5.0)
    assert not drive.ok and drive.steps == 0
    assert drive.error.startswith(f"policy remote failed in plan at step 0: driver at {target} answered a bad plan: "
                                  f"plan {text}"), drive.error


def test_driver_errors_are_one_line_without_rpc_reprs():
    with grpc_server(garbage=True) as target:
        drive, _ = driven(target, 5.0)
    assert drive.error == f"policy remote failed in reset: driver at {target}: INTERNAL: Exception deserializing " \
                          "response!", drive.error
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    drive, _ = driven(f"127.0.0.1:{port}", 5.0)
    assert drive.error.startswith(f"policy remote failed in reset: driver at 127.0.0.1:{port}: UNAVAILABLE: ")
    assert "_InactiveRpcError" not in drive.error and "\n" not in drive.error and "<" not in drive.error


# ---------------------------------------------------------------- a drive ends when the car leaves the scene


class FastLane(LaneCentre):
    """The lane centre at 30 m/s, as a route follower plans it: it stops where the road ends."""

    name, spacing_m = "fast_lane", 3.0


def test_a_drive_ends_when_the_car_leaves_the_scene(tmp_path):
    scenario = synthetic_scenarios(1, 2, (36, 64))[0]
    spec = DriveSpec(scenario, "fast_lane", FastLane)
    started = time.perf_counter()
    result = drive_and_record(TrueWorld((36, 64)), [spec], RunSettings(tmp_path / "run", num_steps=10_000,
                                                                       progress=False, videos=False))
    took = time.perf_counter() - started
    record = json.loads((tmp_path / "run" / f"{spec.id}.json").read_text())
    assert result.counts["ok"] == 1 and record["status"] == "ok" and record["complete"]
    assert record["ended"].startswith("the car reached an end of the scene's 600 m road at step "), record["ended"]
    assert 100 < record["steps"] < 250 and int(record["ended"].rsplit(" ", 1)[1]) == record["steps"]
    assert scenario.left_scene(record["world_poses"][-1]) is None  # the step that left is not kept
    assert len(record["world_poses"]) == record["steps"] + 1 and took < 120, took
    [line] = read_manifest(tmp_path / "run" / "manifest.jsonl")
    assert line["status"] == "ok" and line["ended"] == record["ended"]
    # beside the road, as far as the world draws and no farther
    start = np.asarray(scenario.start_pose)
    side = np.array([-np.sin(start[2]), np.cos(start[2]), 0.0])
    assert scenario.left_scene(start + 200 * side) is None
    assert scenario.left_scene(start + 300 * side).startswith("the car left the scene, 298 m from the road")


# ---------------------------------------------------------------- nonsense refused before any work

AGENT = ("    def initialize(self):\n        pass\n\n"
         "    def compute_trajectory(self, agent_input):\n        return None\n\n")
AGENTS = {  # modules of NAVSIM agents, hostile at import or as classes
    "terra_test_agents_ok": "class Agent:\n    def __init__(self, checkpoint='none'):\n        pass\n\n" + AGENT +
                            "def make_agent():\n    return Agent()\n\n"
                            "class NeedsArgs:\n    def __init__(self, checkpoint, *, lr):\n        self.lr = lr\n\n"
                            + AGENT,
    "terra_test_agents_navsim": "from dataclasses import dataclass\n\n"  # TransFuser's sensors; a privileged agent
                                "@dataclass\nclass SensorConfig:\n" + "".join(
                                    f"    {name}: object = False\n" for name in (*CAMERAS, "lidar_pc")) + "\n"
                                "class ThreeCameras:\n    def __init__(self, trajectory_sampling, latent=False):\n"
                                "        self.latent = latent\n\n" + AGENT +
                                "    def get_sensor_config(self):\n        return SensorConfig(cam_f0=[3], cam_l0=[3], "
                                "cam_r0=[3], lidar_pc=[] if self.latent else [3])\n\n"
                                "class Privileged:\n    requires_scene = True\n\n" + AGENT,
    "terra_test_agents_syntax": "class Agent:\n    def broken(:\n        pass\n",
    "terra_test_agents_raises": "raise RuntimeError('no GPU here')\n",
    "terra_test_agents_exits": "import sys\nsys.exit(4)\n",
}


@pytest.fixture
def agents(tmp_path, monkeypatch) -> Path:
    return importable_modules(tmp_path / "agents", AGENTS, monkeypatch)


@pytest.mark.parametrize("entry, text", [
    ("grpc:", "'grpc:' is not grpc:HOST:PORT with a port from 1 to 65535"),
    ("grpc:localhost", "'grpc:localhost' is not grpc:HOST:PORT"),
    ("grpc:localhost:99999", "'grpc:localhost:99999' is not grpc:HOST:PORT with a port from 1 to 65535"),
    ("grpc:localhost:0", "'grpc:localhost:0' is not grpc:HOST:PORT"),
    ("grpc::50051", "'grpc::50051' is not grpc:HOST:PORT"),
    ("grpc:::1:50051", "'grpc:::1:50051' is not grpc:HOST:PORT with a port from 1 to 65535; e.g. "
                       "grpc:127.0.0.1:50051 (grpc:[::1]:50051 for IPv6)"),
    ("grpc:my host:50051", "'grpc:my host:50051' is not grpc:HOST:PORT"),
    ("unix:", "'unix:' names no Unix socket path of at most 107 bytes"),
    ("unix://", "'unix://' names no Unix socket path"),
    (f"unix:///{'a' * 200}.sock", "names no Unix socket path of at most 107 bytes"),
    ("navsim:terra_test_agents_ok:make_agent", "terra_test_agents_ok.make_agent is a function, not a class"),
    ("navsim:terra_test_agents_ok:Missing", "terra_test_agents_ok.Missing is nothing, not a class"),
    ("navsim:terra_test_agents_ok:NeedsArgs", "NeedsArgs() needs checkpoint, lr; give them in navsim_args.NeedsArgs "
                                              "(e.g. +navsim_args.NeedsArgs.checkpoint=VALUE)"),
    ("navsim:terra_test_agents_syntax:Agent", "importing terra_test_agents_syntax failed: SyntaxError: invalid syntax"),
    ("navsim:terra_test_agents_raises:Agent", "importing terra_test_agents_raises failed: RuntimeError: no GPU here"),
    ("navsim:terra_test_agents_exits:Agent", "importing terra_test_agents_exits failed: it called sys.exit(4)"),
    ("navsim:Agent", "cannot load the NAVSIM agent 'navsim:Agent': give navsim:package.module:Class"),
    ("navsim:terra_test_agents_navsim:ThreeCameras",
     "ThreeCameras asks for sensors this world does not render: cam_l0, cam_r0, lidar_pc (it renders the front camera, "
     "cam_f0, alone)"),
    ("navsim:terra_test_agents_navsim:Privileged", "Privileged has requires_scene=True: it plans from NAVSIM's logged "
                                                   "Scene"),
])
def test_policy_targets_are_parsed_and_imported_once_before_any_drive(tmp_path, agents, entry, text):
    with pytest.raises(TerraInputError) as caught:
        drive_settings_of(tmp_path / "out", f"policies=[{entry!r}]")
    assert text in str(caught.value) and str(caught.value).startswith("policies: "), caught.value
    assert not (tmp_path / "out").exists()


def test_good_targets_pass_and_executor_ray_needs_ray(tmp_path, agents, monkeypatch):
    settings = drive_settings_of(tmp_path / "out", "policies=['grpc:[::1]:50051',unix:///tmp/d.sock,"
                                                   "unix:d.sock,navsim:terra_test_agents_ok:Agent]")
    assert list(settings.policies) == ["grpc:[::1]:50051", "unix:///tmp/d.sock", "unix:d.sock",
                                       "navsim:terra_test_agents_ok:Agent"]
    settings = drive_settings_of(tmp_path / "out", "policies=[navsim:terra_test_agents_ok:NeedsArgs]",
                                 "navsim_args={NeedsArgs: {checkpoint: /ckpt/a.pth, lr: 0.01}}")
    assert settings.policies["navsim:terra_test_agents_ok:NeedsArgs"]().agent.lr == 0.01  # built with its arguments
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    for check in (lambda: drive_settings_of(tmp_path / "out", "executor=ray"), lambda: check_executor("ray")):
        with pytest.raises(TerraInputError, match=r"^executor=ray needs Ray, which is not installed here: pip install"):
            check()
    for frames in (0, -2, 1.5):
        with pytest.raises(TerraInputError, match="num_history_frames must be a whole number of at least 1"):
            NavsimPolicy(ExitingAgent(), num_history_frames=frames)


@pytest.mark.parametrize("overrides, text", [
    (["navsim_args={NeedsArgs: {checkpoint: a, lr: 1, momentum: 0.9}}"],
     "cannot load the NAVSIM agent 'navsim:terra_test_agents_ok:NeedsArgs': NeedsArgs() takes no argument 'momentum' "
     "(it takes checkpoint, lr); fix navsim_args.NeedsArgs"),
    (["+navsim_args.NeedsArgs.lr=1"], "NeedsArgs() needs checkpoint; give them in navsim_args.NeedsArgs"),
    (["+navsim_args.Agent.checkpoint=a"], "navsim_args.Agent names no NAVSIM agent class in policies (its agents: "
                                          "NeedsArgs); key each agent's arguments by its class name"),
    (["navsim_args={NeedsArgs: 3}"], "navsim_args.NeedsArgs must be the keyword arguments of NeedsArgs() (got 3)"),
    (["navsim_args=[1]"], "navsim_args must map NAVSIM agent class names to their keyword arguments (got [1])"),
    (["policies=[navsim:terra_test_agents_navsim:ThreeCameras]", "+navsim_args.ThreeCameras.latent=true"],
     "ThreeCameras asks for sensors this world does not render: cam_l0, cam_r0 (it renders"),
    (["policies=[navsim:terra_test_agents_navsim:ThreeCameras]",
      "+navsim_args.ThreeCameras.trajectory_sampling.num_poses=8"],
     "'navsim:terra_test_agents_navsim:ThreeCameras': navsim_args.ThreeCameras.trajectory_sampling: give two of "
     "num_poses, time_horizon and interval_length (got {'num_poses': 8})"),
])
def test_navsim_args_are_checked_against_the_agent_before_any_drive(tmp_path, agents, overrides, text):
    with pytest.raises(TerraInputError) as caught:
        drive_settings_of(tmp_path / "out", "policies=[navsim:terra_test_agents_ok:NeedsArgs]", *overrides)
    assert text in str(caught.value), caught.value
    assert not (tmp_path / "out").exists()


def test_the_app_refuses_in_one_line_and_leaves_nothing_behind(tmp_path, agents):
    (tmp_path / "run").mkdir()
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(agents), ENV.get("PYTHONPATH", "")])}
    for args, text in ((["num_steps=-3"], "num_steps must be a whole number from 1 to 10000 (got -3)"),
                       (["policies=[grpc:]"], "policies: 'grpc:' is not grpc:HOST:PORT"),
                       (["policies=[navsim:terra_test_agents_syntax:Agent]"], "failed: SyntaxError: invalid syntax"),
                       (["policies=[navsim:terra_test_agents_ok:NeedsArgs]"], "NeedsArgs() needs checkpoint, lr"),
                       (["policies=[navsim:terra_test_agents_navsim:ThreeCameras]"],
                        "ThreeCameras asks for sensors this world does not render: cam_l0, cam_r0, lidar_pc")):
        result = subprocess.run([sys.executable, "-m", "terra.apps.drive", "world=truth", *args], capture_output=True,
                                text=True, timeout=300, cwd=tmp_path / "run", env=env)
        refused(result, "terra-drive", text)
        assert not any((tmp_path / "run").iterdir()), list((tmp_path / "run").iterdir())  # no outputs/drives/...
    result = subprocess.run([sys.executable, "-m", "terra.apps.drive", "world=truth", *TRUTH, "output_dir=out"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path / "run", env=env)
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["out"]  # and no outputs/drives/... beside it


# ---------------------------------------------------------------- one line per problem on stderr


@pytest.mark.parametrize("module, prog, args, text", [
    ("drive", "terra-drive", ["--bogus"], "unknown option '--bogus'; settings are given as KEY=VALUE"),
    ("drive", "terra-drive", ["world=truth", "-x"], "unknown option '-x'"),
    ("generate", "terra-generate", ["--cfg", "everything"], "argument --cfg/-c: invalid choice: 'everything'"),
])
def test_a_mistyped_flag_is_one_line_without_usage(tmp_path, module, prog, args, text):
    result = app(module, *args, cwd=tmp_path)
    line = refused(result, prog, text)
    assert "usage:" not in line and not any(tmp_path.iterdir())


def test_a_driver_answering_garbage_is_one_line_of_its_drive_and_nothing_else(tmp_path):
    with grpc_server(garbage=True) as target:
        result = app("drive", "world=truth", *TRUTH[:2], f"policies=['grpc:{target}']", "progress=false",
                     "output_dir=out", cwd=tmp_path)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr and "deserializ" not in result.stdout, result.stdout
    failures = [line for line in result.stderr.splitlines() if "failed" in line]
    assert len(failures) == 1 and "INTERNAL: Exception deserializing response!" in failures[0], result.stderr
    assert not [line for line in result.stderr.splitlines() if re.match(r"^[EWI]\d{4} ", line)]  # no C-core lines


def test_executor_ray_with_a_ray_that_does_not_import_is_one_line(tmp_path):
    """A partial Ray install (found, but failing on import) stops terra-drive with exit 2 and the fix, not exit 1."""
    broken = tmp_path / "site" / "ray"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ModuleNotFoundError('No module named ray._raylet')\n")
    script = Path(sys.executable).with_name("terra-drive")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    result = subprocess.run([str(script), "executor=ray", "world=truth", "num_scenarios=1", "num_steps=1",
                             "policies=[lane_follower]", f"output_dir={tmp_path / 'out'}"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "terra-drive: error: executor=ray needs Ray, which does not import here (ModuleNotFoundError: No module named "
        "ray._raylet): pip install 'terra-world-model[ray]' on this machine and every node, or use executor=local"]
    assert not (tmp_path / "out").exists()
