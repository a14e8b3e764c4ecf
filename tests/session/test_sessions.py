"""Closed-loop sessions on the Transformers backend against batch rollouts of the same actions and seeds.

A tiny world model (6-frame windows, overlap 3) so that window rollover comes after a few frames, and the
tiny LFQ tokenizer whose 8x8 codes fit it (terra/models/presets.py).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.backends import model_backend
from terra.generation.rollout import RolloutRequest
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.session import SessionHost, drive_action
from terra.tokenizer.lfq import LFQTokenizer
from tests.conftest import tiny_model

GREEDY = SamplingConfig(temperature=0)
SAMPLED = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95)


@pytest.fixture(scope="module")
def pipeline(single_thread):
    return WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), model_backend(tiny_model(), max_batch_size=4))


@pytest.fixture
def host(pipeline):
    host = SessionHost(pipeline, GREEDY, max_frames=12)
    yield host
    host.close()


def rollout_inputs(layout, num_context: int, num_frames: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    context = rng.integers(0, layout.codebook_size, (num_context, 8, 8))
    return context, rng.normal(0, 2, (num_context + num_frames - 1, 6, 3)).astype(np.float32)


def batch(pipeline, context, actions, num_frames, seed, sampling) -> np.ndarray:
    request = RolloutRequest(context, actions, num_frames, seed=seed)
    return pipeline.backend.generate([request], sampling, progress=False)[0].reshape(num_frames, 8, 8)


def drive(session, actions: np.ndarray, decode: bool = False) -> np.ndarray:
    """Step ``session`` through ``actions`` (one per frame); the generated codes."""
    return np.stack([session.step(a, decode=decode).codes for a in actions])


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_session_equals_batch_rollout_across_window_rollover(pipeline, host, sampling):
    num_context, num_frames = 2, 9  # windows: frames 0-5, then 3-8 (overlap 3), then 6-11
    context, actions = rollout_inputs(pipeline.backend.layout, num_context, num_frames, seed=1)
    session = host.open(codes=context, actions=actions[: num_context - 1], seed=7, sampling=sampling)
    got = drive(session, actions[num_context - 1 :])
    np.testing.assert_array_equal(got, batch(pipeline, context, actions, num_frames, 7, sampling))
    assert session.num_generated == num_frames
    np.testing.assert_array_equal(session.codes(), np.concatenate([context, got]))


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_speculative_session_equals_sequential_rollout(pipeline, host, sampling):
    num_context, num_frames = 2, 9  # across two window rollovers
    context, actions = rollout_inputs(pipeline.backend.layout, num_context, num_frames, seed=4)
    speculative = sampling.replace(decoding="speculative", draft_tokens=8)
    session = host.open(codes=context, actions=actions[: num_context - 1], seed=3, sampling=speculative)
    frames = [session.step(a, decode=False) for a in actions[num_context - 1 :]]
    expected = batch(pipeline, context, actions, num_frames, 3, sampling.replace(decoding="sequential"))
    np.testing.assert_array_equal(np.stack([f.codes for f in frames]), expected)
    stats = session.pass_stats()
    assert stats.frames == num_frames and stats.passes == sum(f.passes for f in frames) < num_frames * 64
    assert host.engine.metrics()["tokens_per_pass"] > 1
    assert host.open(codes=context, sampling=sampling).sampling.decoding == "speculative"  # auto: one stream


def test_fork_branches_from_the_shared_state_and_reset_replays(pipeline, host):
    context, actions = rollout_inputs(pipeline.backend.layout, 2, 6, seed=2)
    other = np.random.default_rng(3).normal(0, 2, (6, 3)).astype(np.float32)
    session = host.open(codes=context, actions=actions[:1], seed=11, sampling=SAMPLED)
    prefix = drive(session, actions[1:4])  # 3 frames; the fork is taken at the start of the next window
    twin = session.fork()
    same = [s.step(actions[4], decode=False).codes for s in (session, twin)]
    np.testing.assert_array_equal(*same)  # same state, seed and action: the same frame
    mine, theirs = session.step(actions[5], decode=False).codes, twin.step(other, decode=False).codes
    assert not np.array_equal(mine, theirs)
    np.testing.assert_array_equal(np.stack([*prefix, same[0], mine]),
                                  batch(pipeline, context, actions, 5, 11, SAMPLED))
    branched = actions.copy()
    branched[5] = other
    np.testing.assert_array_equal(np.stack([*prefix, same[1], theirs]),
                                  batch(pipeline, context, branched, 5, 11, SAMPLED))
    assert twin.num_generated == session.num_generated == 5

    session.reset()
    assert session.num_generated == 0
    np.testing.assert_array_equal(drive(session, actions[1:4]), prefix)
    twin.close()
    with pytest.raises(TerraInputError, match="closed"):
        twin.step(other)


def test_concurrent_sessions_at_different_points_match_their_solo_runs(pipeline, host):
    """Sessions started at different times share polls with caches of unequal length (padded batches)."""
    inputs = [rollout_inputs(pipeline.backend.layout, 1 + i % 2, 5, seed=10 + i) for i in range(4)]
    sessions = [host.open(codes=c, actions=a[: len(c) - 1], seed=i) for i, (c, a) in enumerate(inputs)]
    results: dict[int, np.ndarray] = {}

    def run(i: int) -> None:
        context, actions = inputs[i]
        results[i] = drive(sessions[i], actions[len(context) - 1 :])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for i, thread in enumerate(threads):
        thread.start()
        if i == 0:  # session 0 gets ahead before the others join
            while sessions[0].num_generated < 2:
                thread.join(0.01)
    for thread in threads:
        thread.join(120)
    assert sorted(results) == [0, 1, 2, 3]
    for i, (context, actions) in enumerate(inputs):
        np.testing.assert_array_equal(results[i], batch(pipeline, context, actions, 5, i, GREEDY), err_msg=f"{i}")
    assert host.engine.metrics()["frames_total"] >= 20


def test_frames_decode_to_rgb_and_poses_follow_the_actions(host):
    session = host.open(codes=np.zeros((1, 8, 8), dtype=np.int64), seed=0)
    left = drive_action(1.0, 36.0)  # 10 m/s on the tightest arc
    frames = [session.step(left) for _ in range(3)]
    assert frames[0].rgb.shape == (64, 64, 3) and frames[0].rgb.dtype == np.uint8
    assert [f.index for f in frames] == [0, 1, 2]
    x, y, yaw = frames[-1].pose
    assert 2.9 < x < 3.0 and 0 < y < 0.5 and 0 < yaw < 0.3  # ~3 m forward, turning left
    assert frames[0].speed_kmh == pytest.approx(36.0, rel=1e-3)
    assert session.video().shape == (4, 64, 64, 3)


def test_limits_and_bad_input(host):
    session = host.open(codes=np.zeros((2, 8, 8), dtype=np.int64), seed=0)
    with pytest.raises(TerraInputError, match=r"shape \[6, 3\]"):
        session.step(np.zeros((5, 3)))
    with pytest.raises(TerraInputError, match="NaN"):
        session.step(np.full((6, 3), np.nan))
    with pytest.raises(TerraInputError, match="steer"):
        session.step({"steer": 3, "speed_kmh": 30})
    for _ in range(12):
        session.step(drive_action(0.0, 30.0), decode=False)
    with pytest.raises(TerraInputError, match="limit of 12 frames"):
        session.step(drive_action(0.0, 30.0), decode=False)
    with pytest.raises(TerraInputError, match="codes per frame"):
        host.open(codes=np.zeros((2, 4, 4), dtype=np.int64))
    with pytest.raises(TerraInputError, match="codebook"):
        host.open(codes=np.full((2, 8, 8), 10_000))
    with pytest.raises(TerraInputError, match="no room"):
        host.open(codes=np.zeros((6, 8, 8), dtype=np.int64))


def test_a_host_over_a_bare_backend_takes_codes(pipeline):
    """No tokenizer (benchmarks, policies on codes): sessions open from codes, frames stay undecoded."""
    from terra.session.context import SessionContext

    host = SessionHost(pipeline.backend, GREEDY, max_frames=3)
    try:
        context = SessionContext(np.zeros((2, 64), dtype=np.int64), np.zeros((1, 6, 3), np.float32), 30.0, "codes")
        frame = host.open_context(context, seed=0).step(drive_action(0.0, 30.0), decode=False)
        assert frame.codes.shape == (64,) and frame.rgb is None
        with pytest.raises(TerraInputError, match="no tokenizer"):
            host.open()
    finally:
        host.close()
