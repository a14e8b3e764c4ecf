"""Helpers the closed-loop tests share: a real gRPC server on loopback (:func:`grpc_server`), an egodriver driver
behind it that records what it received and misbehaves as told (:class:`LoopbackDriver`), modules of user code
written for a test (:func:`importable_modules`), and terra-drive's settings made in process
(:func:`drive_settings_of`)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import grpc
import numpy as np
from carla_driver_interface.protocol import (
    DriveResponse,
    EgodriverServiceServicer,
    Empty,
    SessionRequestStatus,
    VersionId,
    add_EgodriverServiceServicer_to_server,
)
from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
from terra.closedloop.loop import DriveSpec
from terra.closedloop.plans import Plan
from terra.closedloop.recording.files import claim_drive_folder
from terra.closedloop.recording.run import LocalDrives, RunResult, RunSettings, record_run
from terra.closedloop.worlds import World
from terra.closedloop.study.settings import terra_drive_settings
from terra.inputs.ego_motion import compose as compose_poses, to_ego

EGODRIVER_METHODS = ("get_version", "start_session", "close_session", "submit_image_observation",
                     "submit_egomotion_observation", "submit_route", "submit_recording_ground_truth", "drive")


class LaneCentre:
    """An oracle policy: plans the true lane centre ahead, poses ``spacing_m`` apart at 10 Hz over 4 s (0.8 m: 8 m/s;
    past the road's end the poses stay at its end, so the car stops there)."""

    name, spacing_m = "lane_centre", 0.8

    def reset(self, scenario):
        self.scenario = scenario

    def plan(self, obs):
        scene = self.scenario.scene
        pose = compose_poses(self.scenario.start_pose, obs.pose)
        s, _ = scene.road_coords(pose[:1], pose[1:2])
        ahead = scene.lane_pose(s[0] + self.spacing_m * np.arange(1, 41))
        return Plan.trajectory(np.c_[to_ego(ahead[:, :2], pose), ahead[:, 2] - pose[2]], dt=0.1)

    def close(self):
        pass


def _recorded(method: str, answer: Callable[[], object]) -> Callable:
    """A servicer method that records its request (``LoopbackDriver._receive``) and answers ``answer()``."""

    def handle(self, request, context):
        self._receive(method, request)
        return answer()

    return handle


class LoopbackDriver(EgodriverServiceServicer):
    """An egodriver server that keeps every request in ``received`` (``(method, request)`` in the order they came),
    answers ``drive`` with ``poses`` (x, y, z, qx, qy, qz, qw) at 0.1 s steps from the time asked (by default 8 m/s
    straight ahead), and ``hang`` names a method that waits until ``release`` is set."""

    def __init__(self, release: threading.Event | None = None, hang: str = "", poses=None) -> None:
        self.release, self.hang = release or threading.Event(), hang
        self.poses = [(0.8 * (k + 1), 0, 0, 0, 0, 0, 1) for k in range(10)] if poses is None else poses
        self.received: list[tuple[str, object]] = []
        self._lock = threading.Lock()

    def _receive(self, method: str, request) -> None:
        with self._lock:
            self.received.append((method, request))
        if method == self.hang:
            self.release.wait()

    def requests(self, method: str) -> list:
        """The requests of ``method`` received so far, in order."""
        with self._lock:
            return [request for name, request in self.received if name == method]

    get_version = _recorded("get_version", lambda: VersionId(version_id="loopback"))
    start_session = _recorded("start_session", SessionRequestStatus)
    close_session = _recorded("close_session", Empty)
    submit_image_observation = _recorded("submit_image_observation", Empty)
    submit_egomotion_observation = _recorded("submit_egomotion_observation", Empty)
    submit_route = _recorded("submit_route", Empty)
    submit_recording_ground_truth = _recorded("submit_recording_ground_truth", Empty)

    def drive(self, request, context):
        self._receive("drive", request)
        answer = DriveResponse()
        for k, (x, y, z, qx, qy, qz, qw) in enumerate(self.poses):
            entry = answer.trajectory.poses.add(timestamp_us=request.time_now_us + 100_000 * (k + 1))
            entry.pose.vec.x, entry.pose.vec.y, entry.pose.vec.z = x, y, z
            entry.pose.quat.x, entry.pose.quat.y, entry.pose.quat.z, entry.pose.quat.w = qx, qy, qz, qw
        return answer


@contextmanager
def grpc_server(servicer=None, garbage: bool = False):
    """A real gRPC server on loopback for the block, serving ``servicer``, or answering every egodriver method with
    bytes that do not parse; yields ``host:port``."""
    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    if garbage:
        raw = grpc.unary_unary_rpc_method_handler(lambda request, context: b"\xff\x01not a protobuf")
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "egodriver.EgodriverService", {name: raw for name in EGODRIVER_METHODS})])
    else:
        add_EgodriverServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=0)


def importable_modules(folder: Path, texts: dict[str, str], monkeypatch) -> Path:
    """``folder`` holding a module ``NAME.py`` per entry of ``texts``, importable for the test (on ``sys.path``)."""
    folder.mkdir()
    for name, text in texts.items():
        (folder / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def drive_settings_of(out: Path, *overrides: str):
    """terra-drive's settings of ``overrides`` on the true world (the app's edge, in process)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("drive", overrides=["world=truth", *overrides])
    return terra_drive_settings(cfg, out)


def drive_and_record(world: World, specs: list[DriveSpec], settings: RunSettings,
                     model_settings: dict | None = None, plan_following=None,
                     output=None) -> RunResult:
    """Drive every spec not already complete in the run folder and record it; return the run's records."""
    ids = [spec.id for spec in specs]
    if output is None:
        output = claim_drive_folder(settings.output_dir, ids, settings.videos, settings.manifest,
                                    inputs=[item for spec in specs for item in spec.scenario.reads])
    runner = LocalDrives({world.name: world}, specs, model_settings or {}, plan_following)
    return record_run(runner, world.name, ids, settings, output)
