"""A driver served over AlpaSim's egodriver contract (real gRPC on loopback, and the in-process channel) drives a
world model through the loop; the frames equal a direct session (terra/session/) of the same actions and seed, and
both channels give the same plans."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("carla_driver_interface")
from carla_driver_interface.server import serving  # noqa: E402

from terra.closedloop.egodriver import EgodriverPolicy, in_process, reference_driver  # noqa: E402
from terra.closedloop.loop import DriveSpec, run_drives  # noqa: E402
from terra.closedloop.scenarios import synthetic_scenarios  # noqa: E402
from terra.closedloop.worlds import ModelWorld  # noqa: E402
from terra.config.sampling import SamplingConfig  # noqa: E402
from terra.generation.hf_backend import HFBackend  # noqa: E402
from terra.models.presets import TINY_TOKENIZER  # noqa: E402
from terra.pipeline import WorldModelPipeline  # noqa: E402
from terra.session import SessionHost  # noqa: E402
from terra.session.context import SessionContext  # noqa: E402
from terra.tokenizer.lfq import LFQTokenizer  # noqa: E402
from tests.conftest import tiny_model  # noqa: E402

STEPS = 5  # 3 context frames + 5: past the tiny model's 6-frame window


SAMPLING = SamplingConfig(temperature=1.0, top_k=50)


@pytest.fixture(scope="module")
def pipeline(single_thread):
    return WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), HFBackend(tiny_model(), max_batch_size=4))


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
