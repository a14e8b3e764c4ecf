"""Sessions of a route model: a built-in session is told the road of its scene at every step's pose, as a batch
rollout given those routes is; a session from codes (no road known) runs with "no route"."""

from __future__ import annotations

import numpy as np
import pytest

from terra.config.sampling import SamplingConfig
from terra.contract.routes import TOLD, route_slot_values
from terra.core.errors import TerraInputError
from terra.generation.backends import model_backend
from terra.generation.rollout import RolloutRequest
from terra.inputs.ego_motion import advance_pose, compose
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.session import SessionHost
from terra.tokenizer.lfq import LFQTokenizer
from tests.conftest import TINY_ROUTES, tiny_route_model

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def host(single_thread):
    pipeline = WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), model_backend(tiny_route_model(), max_batch_size=4))
    host = SessionHost(pipeline, GREEDY, max_frames=8, num_context=2)
    yield host
    host.close()


def test_a_builtin_session_is_told_the_road_at_each_step(host):
    session = host.open(builtin={"manoeuvre": "curve_left", "scene": 3, "speed_kmh": 40.0}, seed=5)
    context = session.context
    assert context.scene is not None and context.poses.shape == (2, 3)
    rng = np.random.default_rng(0)
    actions = [np.asarray(context.actions[-1]) + rng.normal(0, 0.2, (6, 3)).astype(np.float32) for _ in range(7)]
    actions = [np.concatenate([a[:, :2], context.actions[-1][:, 2:]], axis=1) for a in actions]  # times kept
    codes = np.stack([session.step(a, decode=False).codes for a in actions])
    # where each frame was drawn, in the world, and the road ahead of it there
    pose, world = (0.0, 0.0, 0.0), [context.poses[0], context.poses[1]]
    for a in actions:
        pose = advance_pose(pose, a)
        world.append(compose(context.poses[-1], np.asarray(pose)))
    routes = context.scene.route(np.stack(world), TINY_ROUTES)
    state = session.rollout.state
    np.testing.assert_allclose(state.route_slots[: len(world) - 1], route_slot_values(routes[1:]), atol=1e-5)
    request = RolloutRequest(context.codes, np.concatenate([context.actions, np.stack(actions)]), 7, seed=5,
                             routes=routes)
    batch = host.backend.generate([request], GREEDY, progress=False)[0]
    np.testing.assert_array_equal(codes.reshape(7, -1), batch)


def test_a_session_from_codes_has_no_route(host):
    codes = np.random.default_rng(1).integers(0, 512, (2, 8, 8))
    session = host.open(codes=codes, seed=1)
    session.step([[0.0, 4.0, 0.45]] * 6, decode=False)
    assert np.isnan(session.rollout.state.route_slots).all()


def test_a_step_that_fails_leaves_no_route_verdict_behind(host):
    """Each frame's verdict is its own: a step past the session's last frame adds none."""
    session = host.open(builtin={"manoeuvre": "straight", "scene": 3, "speed_kmh": 40.0}, seed=5)
    action = np.asarray(session.context.actions[-1])
    frames = []
    with pytest.raises(TerraInputError, match="reached its limit"):
        for _ in range(host.max_frames + 1):
            frames.append(session.step(action, decode=False))
    assert [frame.route_told for frame in frames] == session.route_told == [TOLD] * len(session.poses)
    assert frames
