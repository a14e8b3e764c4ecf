"""A driver served over AlpaSim's egodriver contract (real gRPC on loopback, and the in-process channel) drives a
world model through the loop; the frames equal a direct session (terra/session/) of the same actions and seed, and
both channels give the same plans. The driver is sent what AlpaSim's runtime sends: a seed per drive, the camera
above the rear axle, the context frames and the ego history up to the first decision, each at its time."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("carla_driver_interface")
from carla_driver_interface.driver import BaseDriver, DriveContext, DriveResult  # noqa: E402
from carla_driver_interface.geometry import Pose, Trajectory  # noqa: E402
from carla_driver_interface.server import serving  # noqa: E402

from terra.closedloop.policies.egodriver import (  # noqa: E402
    CAMERA_ID, EgodriverPolicy, in_process, reference_driver,
)
from terra.closedloop.loop import DriveSpec, run_drives  # noqa: E402
from terra.closedloop.plans import policy_seed  # noqa: E402
from terra.closedloop.scenarios import synthetic_scenarios  # noqa: E402
from terra.closedloop.worlds import ModelWorld, TrueWorld  # noqa: E402
from terra.config.sampling import SamplingConfig  # noqa: E402
from terra.generation.backends import model_backend  # noqa: E402
from terra.inputs.ego_motion import compose  # noqa: E402
from terra.models.presets import TINY_TOKENIZER  # noqa: E402
from terra.pipeline import WorldModelPipeline  # noqa: E402
from terra.session import SessionHost  # noqa: E402
from terra.session.context import SessionContext  # noqa: E402
from terra.sim.camera import CAMERA_HEIGHT_M  # noqa: E402
from terra.tokenizer.lfq import LFQTokenizer  # noqa: E402
from tests.closedloop.conftest import LoopbackDriver, grpc_server  # noqa: E402
from tests.conftest import tiny_model  # noqa: E402

STEPS = 5  # 3 context frames + 5: past the tiny model's 6-frame window


SAMPLING = SamplingConfig(temperature=1.0, top_k=50)


@pytest.fixture(scope="module")
def pipeline(single_thread):
    return WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), model_backend(tiny_model(), max_batch_size=4))


@pytest.fixture(scope="module")
def scenarios():
    return synthetic_scenarios(2, 3, TINY_TOKENIZER["image_size"])


class CodesKept(ModelWorld):
    """The model world, keeping each drive's codes when it closes (frames are compared as codes: decoded in a
    batch, the tokenizer may round a pixel differently than decoding one frame)."""

    def __init__(self, pipeline):
        super().__init__(pipeline, SAMPLING)
        self.codes = []

    def close(self, drive):
        self.codes.append(drive.codes())
        super().close(drive)


def drive_with(pipeline, scenarios, make_policy):
    specs = [DriveSpec(s, "route_follower", make_policy, seed=17 + i) for i, s in enumerate(scenarios)]
    world = CodesKept(pipeline)
    try:
        drives = run_drives(world, specs, STEPS)
    finally:
        world.shutdown()  # one engine drives the backend at a time
    assert all(d.ok and d.steps == STEPS for d in drives), [d.error for d in drives]
    for drive, codes in zip(drives, world.codes):
        drive.codes = codes
    return drives


def direct(pipeline, scenario, actions, seed):
    """The same scenario driven straight in a session (terra/session/) with the recorded actions."""
    import torch

    host = SessionHost(pipeline, SAMPLING, max_frames=STEPS)
    try:
        images = torch.from_numpy(scenario.images).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        context = SessionContext(pipeline.encode(images), scenario.actions, scenario.speed_kmh, "direct")
        session = host.open_context(context, seed=seed, max_frames=STEPS)
        frames = [session.step(action) for action in actions]
        codes = session.codes()
        session.close()
    finally:
        host.close()
    return frames, codes


def test_a_driver_over_grpc_matches_a_direct_session_run(pipeline, scenarios):
    with serving(reference_driver("route_follower"), port=0, host="127.0.0.1", mode="alpasim") as port:
        over_tcp = drive_with(pipeline, scenarios, lambda: EgodriverPolicy(f"127.0.0.1:{port}", "route_follower"))
    in_proc = drive_with(pipeline, scenarios, lambda: in_process(reference_driver("route_follower"), "route_follower"))
    for i, (tcp, local) in enumerate(zip(over_tcp, in_proc)):
        for a, b in zip(tcp.plans, local.plans):  # the same bytes on both channels: the same plans
            np.testing.assert_array_equal(a.poses, b.poses)
            np.testing.assert_array_equal(a.times, b.times)
        np.testing.assert_array_equal(tcp.codes, local.codes)
        frames, codes = direct(pipeline, scenarios[i], tcp.actions, seed=17 + i)
        np.testing.assert_array_equal(tcp.codes, codes)
        got, want = np.stack(tcp.frames[tcp.num_context:]).astype(int), np.stack([f.rgb for f in frames]).astype(int)
        assert np.abs(got - want).max() <= 1 and np.mean(got != want) < 1e-3
        assert len(tcp.frames) == 3 + STEPS
        # the route follower tracks the lane centre: its plans head along the route, 8 m/s cruise
        assert tcp.plans[-1].times[0] == pytest.approx(0.1) and len(tcp.plans[-1].times) == 40


# ---------------------------------------------------------------- what a driver is sent, as AlpaSim's runtime does

TRUE_SIZE = (72, 128)
NUM_CONTEXT = 4


def by_session(driver: LoopbackDriver) -> dict[str, list[tuple[str, object]]]:
    """The requests ``driver`` received, per session, in order (``get_version`` names none)."""
    sessions: dict[str, list] = {}
    for method, request in driver.received:
        if method != "get_version":
            sessions.setdefault(request.session_uuid, []).append((method, request))
    return sessions


def decoded(request) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(request.camera_image.image_bytes)).convert("RGB"))


def test_the_driver_gets_the_context_frames_and_history_before_its_first_decision_and_a_seed_per_drive():
    scenarios = synthetic_scenarios(2, 5, TRUE_SIZE, num_context=NUM_CONTEXT)
    driver = LoopbackDriver()
    with grpc_server(driver) as target:
        specs = [DriveSpec(s, name, lambda name=name: EgodriverPolicy(target, name, seed=7))
                 for s in scenarios for name in ("remote", "remote_too")]
        drives = run_drives(TrueWorld(TRUE_SIZE), specs, 3)
    assert all(d.ok and d.steps == 3 for d in drives), [d.error for d in drives]
    sessions = by_session(driver)
    assert len(sessions) == 4 and len(driver.requests("get_version")) == 4
    seeds = {}
    for calls, drive in zip(sessions.values(), drives):
        scenario = drive.spec.scenario
        methods = [method for method, _ in calls]
        per_step = ["submit_egomotion_observation", "submit_route", "drive"]
        assert methods == ["start_session", *["submit_image_observation"] * NUM_CONTEXT, *per_step,
                           *(["submit_image_observation", *per_step] * 2), "close_session"], methods
        start = calls[0][1]
        assert start.debug_info.scene_id == scenario.id
        seeds[start.random_seed] = drive.spec.id
        assert start.random_seed == policy_seed(7, scenario.id, drive.spec.policy) != policy_seed(8, scenario.id,
                                                                                                    drive.spec.policy)
        [camera] = start.rollout_spec.vehicle.available_cameras
        mount = camera.rig_to_camera.vec  # straight above the rig's origin, the rear axle's centre
        assert (mount.x, mount.y, mount.z) == pytest.approx((0.0, 0.0, CAMERA_HEIGHT_M))
        # the context frames, each at its time: the first at 0 us, the first decision at the last one's
        images = [r for m, r in calls if m == "submit_image_observation"]
        stamps = [r.camera_image.frame_end_us for r in images]
        assert stamps == [100_000 * k for k in range(NUM_CONTEXT + 2)]
        assert all(r.camera_image.frame_start_us == r.camera_image.frame_end_us for r in images)
        for request, frame in zip(images, drive.frames):  # PNG: what the world showed, exactly
            np.testing.assert_array_equal(decoded(request), frame)
        decisions = [r for m, r in calls if m == "drive"]
        assert [r.time_now_us for r in decisions] == [100_000 * (NUM_CONTEXT - 1 + k) for k in range(3)]
        assert [r.time_query_us - r.time_now_us for r in decisions] == [100_000] * 3
        # the ego history up to the first decision, then a pose a step, each at the time of its frame
        motions = [r for m, r in calls if m == "submit_egomotion_observation"]
        assert [len(r.trajectory.poses) for r in motions] == [NUM_CONTEXT, 1, 1]
        assert [p.timestamp_us for r in motions for p in r.trajectory.poses] == stamps
        assert [len(r.dynamic_states) for r in motions] == [NUM_CONTEXT, 1, 1]
        poses = np.array([[p.pose.vec.x, p.pose.vec.y, Pose.from_proto(p.pose).yaw]
                          for r in motions for p in r.trajectory.poses])
        np.testing.assert_allclose(poses[NUM_CONTEXT - 1:], np.stack(drive.poses[:3]), atol=1e-6)
        # the history is where the context drove: the lane's centre behind the start, at the scenario's speed
        speed = scenario.speed_kmh / 3.6
        s_now, _ = scenario.scene.road_coords(scenario.start_pose[:1], scenario.start_pose[1:2])
        truth = scenario.scene.lane_pose(s_now[0] - speed * 0.1 * np.arange(NUM_CONTEXT - 1, 0, -1))
        world = compose(scenario.start_pose, poses[:NUM_CONTEXT - 1])
        np.testing.assert_allclose(world[:, :2], truth[:, :2], atol=0.1)
        np.testing.assert_allclose(world[:, 2], truth[:, 2], atol=5e-3)
        states = motions[0].dynamic_states
        assert [s.linear_velocity.x for s in states] == pytest.approx([speed] * NUM_CONTEXT, rel=5e-3)
    assert len(seeds) == 4  # a seed of its own for every drive
    rerun = LoopbackDriver()  # the same drives again: the same seeds
    with grpc_server(rerun) as target:
        run_drives(TrueWorld(TRUE_SIZE), [DriveSpec(scenarios[1], "remote_too", lambda: EgodriverPolicy(
            target, "remote_too", seed=7))], 1)
    assert rerun.requests("start_session")[0].random_seed == policy_seed(7, scenarios[1].id, "remote_too")


class Remembering(BaseDriver):
    """A contract driver that keeps 8 frames and notes, at its first decision, what its session holds."""

    name = "remembering"
    frame_history_length = 8

    def __init__(self):
        self.first = None

    def drive(self, ctx: DriveContext) -> DriveResult:
        session = ctx.session
        if self.first is None:
            self.first = (session.seed, [f.timestamp_us for f in session.frame_history[CAMERA_ID]],
                          list(session.ego_trajectory.timestamps_us), ctx.time_now_us)
        return DriveResult(trajectory_in_rig=Trajectory([ctx.time_now_us + 100_000 * (k + 1) for k in range(8)],
                                                        [Pose.from_xyz_yaw(0.8 * (k + 1), 0, 0, 0) for k in range(8)]))


def test_a_contract_driver_holds_the_context_and_its_history_at_its_first_decision():
    [scenario] = synthetic_scenarios(1, 5, TRUE_SIZE, num_context=NUM_CONTEXT)
    remembering = Remembering()
    with serving(remembering, port=0, host="127.0.0.1", mode="alpasim") as port:
        [drive] = run_drives(TrueWorld(TRUE_SIZE), [DriveSpec(scenario, "mine", lambda: EgodriverPolicy(
            f"127.0.0.1:{port}", "mine", seed=3))], 2)
    assert drive.ok, drive.error
    stamps = [100_000 * k for k in range(NUM_CONTEXT)]
    assert remembering.first == (policy_seed(3, scenario.id, "mine"), stamps, stamps, stamps[-1])
