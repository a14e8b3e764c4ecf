"""Hostile user code in the closed loop, beyond tests/closedloop/test_hostile_closedloop.py:

* what user code is handed is read-only at any depth (terra/closedloop/guard.py, ``handed``): a policy that writes
  into its scenario's synthetic scene or a NAVSIM agent into its ego history fails its own drive in one line, and
  the other drives' frames are those of a run without it; a user world is handed read-only inputs, and what it
  returns is copied;
* a plan is checked once, when it is built (terra/closedloop/plans.py): values finite and within ``MAX_POSITION_M``,
  rotations that are rotations, its arrays read-only copies of the policy's;
* policy targets and user worlds are imported and tried before any drive, within ``policy_timeout_s``: a module or a
  constructor that hangs is one line, not a hang, and nothing is left behind;
* a drive ends when the car leaves the scene sideways.

Everything runs on the true world's frames (the renderer) at a small size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from carla_driver_interface.geometry import Pose
from scipy.spatial.transform import Rotation

from terra.closedloop.study.drives import terra_drive as run_drive_settings
from terra.closedloop.guard import handed
from terra.closedloop.loop import DriveSpec, run_drives
from terra.closedloop.policies.navsim import NavsimPolicy
from terra.closedloop.plans import MAX_POSITION_M, EgoStatus, Observation, Plan
from terra.closedloop.policies.builtin import policy_factories
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.user_world import UserWorld
from terra.closedloop.worlds import TrueWorld
from terra.core.errors import TerraInputError
from terra.sim.renderer import render
from tests.closedloop.conftest import drive_settings_of, importable_modules

SIZE = (36, 64)
STRAIGHT = np.c_[4.0 * np.arange(1, 9), np.zeros((8, 2))]  # 8 m/s straight ahead, NAVSIM's 8 poses at 0.5 s
READ_ONLY = "assignment destination is read-only (what user code is handed is read-only: copy an array"


@pytest.fixture(scope="module")
def scenario():
    return synthetic_scenarios(1, 5, SIZE)[0]


# ---------------------------------------------------------------- read-only at any depth


@dataclass
class _Nested:
    frames: dict
    history: list = field(default_factory=list)
    label: str = "x"


def test_what_user_code_is_handed_is_read_only_at_any_depth_and_the_original_stays_writable():
    frame, pose, speed = np.arange(12, dtype=np.uint8).reshape(2, 2, 3), np.zeros(3), np.ones(2)
    value = _Nested({"cam_f0": [frame, (pose,)]}, [speed, {"deep": [(speed,)]}])
    given = handed(value)
    arrays = [given.frames["cam_f0"][0], given.frames["cam_f0"][1][0], given.history[0], given.history[1]["deep"][0][0]]
    for array in arrays:
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 7
    given.history.append("mine")  # a container user code changes is its own
    given.frames["cam_f0"].clear()
    assert len(value.history) == 2 and len(value.frames["cam_f0"]) == 2 and given.label == "x"
    for original in (frame, pose, speed):
        assert original.flags.writeable  # the loop's own arrays stay its own to write
    np.testing.assert_array_equal(frame, np.arange(12).reshape(2, 2, 3))
    status = EgoStatus(3.0, 0.1, 0.0)  # frozen, nothing to make read-only: shared as it is
    plain = _Nested({}, label="y")  # not frozen: rebuilt, so that user code changing it changes its own
    assert handed(status) is status and handed(plain) is not plain and handed(plain) == plain
    holding = Observation(0, 0.0, (frame,), status, (status,), np.zeros((1, 3)))  # frozen around arrays: rebuilt
    given = handed(holding)
    assert given is not holding and given.ego is status and not given.frames[0].flags.writeable


class SceneWriter:
    """Paints the scenario's synthetic road black in reset: were it not read-only, the true world would render every
    drive of the scenario without asphalt."""

    name = "scene_writer"

    def reset(self, scenario):
        scenario.scene.palette.asphalt[:] = 0.0

    def plan(self, obs):
        return STRAIGHT

    def close(self):
        pass


class Straight(SceneWriter):
    name = "straight"

    def reset(self, scenario):
        pass


@dataclass
class _Trajectory:  # navsim.common.dataclasses.Trajectory, as an agent returns it
    poses: np.ndarray
    trajectory_sampling: object = field(default_factory=lambda: type("Sampling", (), {"interval_length": 0.5})())


class HistoryWriter:
    """A NAVSIM agent that zeroes its ego history in place, as one normalising its inputs carelessly would."""

    def initialize(self):
        pass

    def compute_trajectory(self, agent_input):
        agent_input.ego_statuses[0].ego_pose[:] = 0
        return _Trajectory(STRAIGHT)


def test_writes_into_the_scene_or_an_agent_input_fail_their_drive_and_change_no_other(scenario):
    clean = run_drives(TrueWorld(SIZE), [DriveSpec(scenario, "straight", Straight)], 4)[0]
    specs = [DriveSpec(scenario, "scene_writer", SceneWriter),
             DriveSpec(scenario, "history_writer", lambda: NavsimPolicy(HistoryWriter(), "history_writer")),
             DriveSpec(scenario, "straight", Straight)]
    drives = {d.spec.policy: d for d in run_drives(TrueWorld(SIZE), specs, 4)}
    assert drives["scene_writer"].error == f"policy scene_writer failed in reset: ValueError: {READ_ONLY} before " \
                                           "changing it)"
    assert drives["history_writer"].error.startswith(
        f"policy history_writer failed in plan at step 0: ValueError: {READ_ONLY}"), drives["history_writer"].error
    fine = drives["straight"]
    assert fine.ok and fine.steps == clean.steps == 4 and len(fine.frames) == len(clean.frames)
    for frame, expected in zip(fine.frames, clean.frames):
        np.testing.assert_array_equal(frame, expected)  # the frames of a run without the writers
    assert scenario.scene.palette.asphalt.max() > 0.1


class AroundTheFlag:
    """Writes what it is handed by every way around the read-only flag: through ``.base``, through
    ``torch.from_numpy`` and an in-place op, and by setting the flag back; into the scenario's frames and scene in
    reset, into its camera frames in each plan."""

    name = "around_the_flag"

    @staticmethod
    def blacken(array):
        import torch

        if array.base is not None:
            array.base[...] = 0
        with np.testing.suppress_warnings() as quiet:
            quiet.filter(UserWarning)
            torch.from_numpy(array).zero_()
        if array.flags.owndata:
            array.setflags(write=True)
            array[...] = 0

    def reset(self, scenario):
        self.blacken(scenario.images)
        self.blacken(scenario.scene.palette.asphalt)

    def plan(self, obs):
        for frame in obs.frames:
            self.blacken(frame)
        return STRAIGHT

    def close(self):
        pass


def test_writes_around_the_read_only_flag_reach_nothing_recorded_or_shared(scenario):
    pytest.importorskip("torch")
    clean = run_drives(TrueWorld(SIZE), [DriveSpec(scenario, "straight", Straight)], 4)[0]
    images, asphalt = scenario.images.copy(), scenario.scene.palette.asphalt.copy()
    specs = [DriveSpec(scenario, "around_the_flag", AroundTheFlag), DriveSpec(scenario, "straight", Straight)]
    drives = run_drives(TrueWorld(SIZE), specs, 4)
    assert all(d.ok and d.steps == 4 for d in drives), [d.error for d in drives]
    for drive in drives:  # the writer's own record and the other policy's: the frames of a run without it
        for frame, expected in zip(drive.frames, clean.frames):
            np.testing.assert_array_equal(frame, expected)
    np.testing.assert_array_equal(scenario.images, images)
    np.testing.assert_array_equal(scenario.scene.palette.asphalt, asphalt)
    given = handed([scenario.images, {"x": object()}])
    assert given[0].base is None and not np.shares_memory(given[0], scenario.images)


class BufferWorld:
    """A user world that renders the truth into one buffer of its own and returns it every step, and tries to write
    into what it is handed where ``write`` says (``scenario``, ``action``)."""

    write = ""

    def __init__(self, image_size):
        self.size = image_size
        self.buffer = np.zeros((*image_size, 3), np.uint8)

    def open(self, scenario, seed, max_frames):
        if self.write == "scenario":
            scenario.images[:] = 0
        return scenario

    def context_frames(self, drive):
        return list(drive.images)

    def step(self, drives, actions, poses):
        if self.write == "action":
            actions[0][:] = 0
        self.buffer[:] = render(drives[0].scene, poses[0], *self.size)
        return [self.buffer]

    def close(self, drive):
        pass


@pytest.mark.parametrize("write, stage, call", [("scenario", "setup", "open"), ("action", "world", "step")])
def test_a_user_world_is_handed_read_only_inputs_and_its_frames_are_copied(scenario, write, stage, call):
    images, specs = scenario.images.copy(), [DriveSpec(scenario, "straight", Straight)]
    [drive] = run_drives(UserWorld("my_worlds:Writer", type("Writer", (BufferWorld,), {"write": write}), SIZE, 10),
                         specs, 3)
    assert not drive.ok and drive.stage == stage and "\n" not in drive.error
    assert f"world my_worlds:Writer failed in {call}: ValueError: assignment destination is read-only" in drive.error
    np.testing.assert_array_equal(scenario.images, images)
    [drive] = run_drives(UserWorld("my_worlds:Buffer", BufferWorld, SIZE, 10), specs, 3)
    truth = run_drives(TrueWorld(SIZE), specs, 3)[0]
    assert drive.ok and drive.steps == 3
    for frame, expected in zip(drive.frames, truth.frames):  # each step's own frame, not the buffer's last
        np.testing.assert_array_equal(frame, expected)
    assert not np.array_equal(drive.frames[-1], drive.frames[-2])


# ---------------------------------------------------------------- plans checked once, when built


@pytest.mark.parametrize("build, text", [
    (lambda: Plan.trajectory([[1.0, 0.0], [2.0, float("inf")]]), "plan pose 1 is (2, inf), not finite numbers"),
    (lambda: Plan.trajectory([[2 * MAX_POSITION_M, 0.0, 0.0]]), "plan pose 0 is (2e+07, 0, 0), not finite numbers "
                                                                "within 1e+07 m"),
    (lambda: Plan.trajectory([[1.0, 0.0, -1e300]]), "plan pose 0 is (1, 0, -1e+300)"),
    (lambda: Plan(actions=np.full((6, 3), np.nan)), "plan actions: holds NaN or inf"),
    (lambda: Plan(actions=np.full((6, 3), 1e4)), "plan actions: holds 10000, but points 3 s ahead lie within 600 m"),
    (lambda: Plan.from_quaternions([[1, 0, 0]], [[0, 0, 0, 0]], [0.1], (0, 0, 0)),
     "plan pose 0 has a degenerate rotation (a quaternion of norm 0); give unit quaternions"),
    (lambda: Plan.from_quaternions([[1, 0, 0], [2, 0, 0]], [[0, 0, 0, 1], [0, 0, float("inf"), 1]], [0.1, 0.2],
                                   (0, 0, 0)), "plan pose 1 has a degenerate rotation (a quaternion of norm inf)"),
    (lambda: Plan.from_quaternions([[1, 0, 1e9]], [[0, 0, 0, 1]], [0.1], (0, 0, 0)), "plan pose 0 is (1, 0, 1e+09)"),
    (lambda: Plan.from_quaternions([[1, 0, 0]], [[0, 0, 1]], [0.1], (0, 0, 0)),
     "plan positions [N, 2|3] and quaternions [N, 4] must come in pairs, got [1, 3] and [1, 3]"),
])
def test_a_bad_plan_is_refused_in_one_line_when_built(build, text):
    with pytest.raises(TerraInputError) as caught:
        build()
    assert str(caught.value).startswith(text) and "\n" not in str(caught.value), caught.value


def test_plans_from_quaternions_are_the_contracts_poses_in_the_ego_frame():
    """Against carla_driver_interface's own geometry (the inverse of the car's pose composed with each pose), for
    rotations with roll and pitch too, and quaternions of any length."""
    rng = np.random.default_rng(0)
    positions, origin = rng.normal(0.0, 30.0, (12, 3)), np.array([4.0, -7.0, 2.5])
    quaternions = Rotation.from_euler("ZYX", rng.uniform(-1.5, 1.5, (12, 3))).as_quat() * rng.uniform(0.5, 3, (12, 1))
    plan = Plan.from_quaternions(positions, quaternions, 0.1 * np.arange(1, 13), origin)
    inverse = Pose.from_xyz_yaw(*origin[:2], 0.0, origin[2]).inverse()
    expected = [inverse @ Pose(p, q) for p, q in zip(positions, quaternions)]
    np.testing.assert_allclose(plan.poses, [[*e.position[:2], e.yaw] for e in expected], atol=1e-9)


class Reusing(Straight):
    """Returns one array of its own as every plan and changes it after: the plans recorded stay what it returned."""

    name = "reusing"

    def reset(self, scenario):
        self.poses = STRAIGHT.copy()

    def plan(self, obs):
        self.poses[:, 1] = 0.1 * obs.step
        return self.poses


def test_a_plan_holds_a_read_only_copy_of_what_the_policy_returned(scenario):
    [drive] = run_drives(TrueWorld(SIZE), [DriveSpec(scenario, "reusing", Reusing)], 3)
    assert drive.ok and [float(plan.poses[0, 1]) for plan in drive.plans] == pytest.approx([0.0, 0.1, 0.2])
    assert not drive.plans[0].poses.flags.writeable and not drive.plans[0].times.flags.writeable


# ---------------------------------------------------------------- user code imported and tried before any drive

MODULES = {
    "terra_test_slow_import": "import time\ntime.sleep(8)\n\nclass Agent:\n    pass\n",
    "terra_test_slow_build": "import time\n\nclass Agent:\n    def __init__(self):\n        time.sleep(8)\n\n"
                             "    def initialize(self):\n        pass\n\n"
                             "    def compute_trajectory(self, agent_input):\n        return None\n",
    "terra_test_worlds": "class NeedsArgs:\n    def __init__(self, image_size, renderer):\n        pass\n\n"
                         "class NoSize:\n    def __init__(self):\n        pass\n\n"
                         "class Methods:\n    def open(self, scenario, seed, max_frames):\n        pass\n\n"
                         "    def context_frames(self, drive):\n        pass\n\n"
                         "    def step(self, drives, actions, poses):\n        pass\n\n"
                         "    def close(self, drive):\n        pass\n\n"
                         "class Broken(Methods):\n    def __init__(self, image_size):\n"
                         "        raise RuntimeError('no GPU')\n\n"
                         "class NoStep(Methods):\n    def __init__(self, image_size):\n        pass\n\n"
                         "    step = None\n\n"
                         "class LooksUp(Methods):\n    def __init__(self, image_size):\n        pass\n\n"
                         "    def __getattribute__(self, name):\n        raise KeyError('looked up ' + name)\n\n"
                         "class HangsOnLookUp(type):\n    def __getattr__(cls, name):\n        import time\n"
                         "        time.sleep(8)\n\n"
                         "class Hangs(metaclass=HangsOnLookUp):\n    def __init__(self, image_size):\n        pass\n\n"
                         "def function():\n    pass\n",
    "terra_test_slow_signature": "import time\n\nclass Slow(type):\n    @property\n"
                                 "    def __signature__(cls):\n        time.sleep(8)\n\n"
                                 "class Agent(metaclass=Slow):\n    pass\n",
    "terra_test_worlds_syntax": "class World:\n    def open(:\n        pass\n",
    "terra_test_worlds_raises": "raise RuntimeError('no renderer here')\n",
    "terra_test_worlds_slow": "import time\ntime.sleep(8)\n",
}


@pytest.fixture
def modules(tmp_path, monkeypatch):
    return importable_modules(tmp_path / "modules", MODULES, monkeypatch)


@pytest.mark.parametrize("overrides, text", [
    (["policies=[navsim:terra_test_slow_import:Agent]"],
     "policies: cannot load the NAVSIM agent 'navsim:terra_test_slow_import:Agent': importing terra_test_slow_import "
     "timed out after 1 s in its import; fix the module, or raise policy_timeout_s if its import is slow"),
    (["policies=[navsim:terra_test_slow_build:Agent]"],
     "policies: cannot load the NAVSIM agent 'navsim:terra_test_slow_build:Agent': Agent timed out after 1 s in its "
     "trial build; fix the agent, or raise policy_timeout_s if it builds slowly"),
    (["policies=[navsim:terra_test_slow_signature:Agent]"],
     "policies: cannot load the NAVSIM agent 'navsim:terra_test_slow_signature:Agent': reading Agent timed out after "
     "1 s in its signature; fix the agent class"),
    (["world=terra_test_worlds_slow:World"], "world: cannot load the world 'terra_test_worlds_slow:World': importing "
                                             "terra_test_worlds_slow timed out after 1 s in its import"),
    (["world=terra_test_worlds_syntax:World"], "importing terra_test_worlds_syntax failed: SyntaxError: invalid "
                                               "syntax"),
    (["world=terra_test_worlds_raises:World"], "importing terra_test_worlds_raises failed: RuntimeError: no renderer "
                                               "here; fix the module"),
    (["world=terra_test_worlds:function"], "terra_test_worlds.function is a function, not a class"),
    (["world=terra_test_worlds:NeedsArgs"], "world: cannot load the world 'terra_test_worlds:NeedsArgs': "
                                            "NeedsArgs(image_size=(height, width)) cannot be called (missing a "
                                            "required argument: 'renderer'); a world is built with image_size alone"),
    (["world=both", "controls=[terra_test_worlds:NoSize]"], "controls: cannot load the world "
                                                            "'terra_test_worlds:NoSize': NoSize(image_size=(height, "
                                                            "width)) cannot be called (got an unexpected keyword"),
    (["world=terra_test_worlds:NoStep"], "world: cannot load the world 'terra_test_worlds:NoStep': NoStep has no "
                                         "step(); a world implements open, context_frames, step, close"),
    (["world=terra_test_worlds:Hangs"], "world: cannot load the world 'terra_test_worlds:Hangs': reading Hangs "
                                        "timed out after 1 s in its methods"),
])
def test_user_code_is_imported_and_tried_within_the_deadline_before_any_drive(tmp_path, modules, overrides, text):
    started = time.perf_counter()
    with pytest.raises(TerraInputError) as caught:
        drive_settings_of(tmp_path / "out", "policy_timeout_s=1", *overrides)
    assert text in str(caught.value) and "\n" not in str(caught.value), caught.value
    assert time.perf_counter() - started < 6, "waited for the hung import or build"
    assert not (tmp_path / "out").exists()


def test_a_built_world_whose_lookups_fail_is_one_line_before_any_drive(tmp_path, modules):
    settings = drive_settings_of(tmp_path / "out", "world=terra_test_worlds:LooksUp", "num_scenarios=1",
                                 "num_steps=2", "policies=[lane_follower]", "progress=false")
    with pytest.raises(TerraInputError,
                       match=r"^world terra_test_worlds:LooksUp failed in build: KeyError: 'looked up "):
        run_drive_settings(settings, progress=False)
    assert not (tmp_path / "out").exists()


class Unreadable(Straight):
    """Returns a value whose reading as a plan runs its own code, which fails."""

    name = "unreadable"

    def plan(self, obs):
        class Poses:
            def __array__(self, dtype=None, copy=None):
                raise OSError("the disk is gone")

        return Poses()


class KeepsItsPlan(Straight):
    """Returns a Plan and writes into its arrays afterwards (the flag set back first)."""

    name = "keeps_its_plan"

    def plan(self, obs):
        if getattr(self, "kept", None) is not None:
            self.kept.setflags(write=True)
            self.kept[...] = 99.0
        plan = Plan.trajectory(STRAIGHT)
        self.kept = plan.poses
        return plan


def test_a_policys_answer_is_read_behind_the_boundary_and_kept_as_a_copy(scenario):
    unreadable, keeps = run_drives(TrueWorld(SIZE), [DriveSpec(scenario, "unreadable", Unreadable),
                                                     DriveSpec(scenario, "keeps_its_plan", KeepsItsPlan)], 3)
    assert unreadable.error.startswith("policy unreadable returned a bad plan at step 0: ") and \
        unreadable.error.endswith(" (it returned a Poses)"), unreadable.error
    assert keeps.ok and all(np.array_equal(plan.poses, Plan.trajectory(STRAIGHT).poses) for plan in keeps.plans)


def test_a_user_worlds_constructor_that_fails_is_one_line_before_any_drive_and_leaves_nothing(tmp_path, modules):
    settings = drive_settings_of(tmp_path / "out", "world=terra_test_worlds:Broken", "num_scenarios=1",
                                 "num_steps=2", "policies=[lane_follower]", "progress=false")
    with pytest.raises(TerraInputError, match=r"^world terra_test_worlds:Broken failed in build: RuntimeError: no GPU; "
                                              "fix the world's constructor$"):
        run_drive_settings(settings, progress=False)
    assert not (tmp_path / "out").exists()


def test_the_contracts_reference_policies_call_within_policy_timeout_s():
    factories = policy_factories(["route_follower", "constant_speed"], timeout_s=2.5)
    assert [factories[name]().timeout_s for name in factories] == [2.5, 2.5]


# ---------------------------------------------------------------- a drive ends when the car leaves the scene


class Sideways(Straight):
    """Turns 90 degrees left of where it started and drives off the road that way at 30 m/s, whatever the road
    does."""

    name = "sideways"

    def plan(self, obs):
        ahead = obs.pose[:2] + np.outer(3.0 * np.arange(1, 41), [0.0, 1.0])  # the drive's frame: left of the start
        x, y, yaw = obs.pose
        c, s = np.cos(yaw), np.sin(yaw)
        d = ahead - [x, y]
        ego = np.c_[c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1]]
        return Plan.trajectory(np.c_[ego, np.full(40, np.pi / 2 - yaw)], dt=0.1)


def test_a_car_driving_off_the_road_sideways_ends_its_drive_there(scenario):
    """Scenario seed 5 bends away: past the bend's centre no segment's perpendicular reaches the car, which once
    read as the road's end at step 104, 200 m to its side."""
    started = time.perf_counter()
    [drive] = run_drives(TrueWorld(SIZE), [DriveSpec(scenario, "sideways", Sideways)], 2000)
    took = time.perf_counter() - started
    assert drive.ok and drive.ended is not None, drive.error
    assert drive.ended.startswith("the car left the scene, "), drive.ended
    assert int(drive.ended.rsplit(" ", 1)[1]) == drive.steps and 50 < drive.steps < 300, drive.ended
    assert scenario.left_scene(drive.world_poses()[-1]) is None and took < 30, took
