"""Closed-loop sessions on vLLM's engine (the CPU build in CI; the session-wide ``vllm_backend`` of conftest.py):
continuous batching across sessions, equality with batch rollouts and the prefix cache serving a fork's past."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from terra.generation.rollout import RolloutRequest
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.session import SessionHost
from terra.tokenizer.lfq import LFQTokenizer
from tests.conftest import VLLM_BLOCK_SIZE
from tests.session.test_sessions import GREEDY, SAMPLED, rollout_inputs

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def host(vllm_backend):
    host = SessionHost(WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), vllm_backend), GREEDY, max_frames=10)
    yield host
    host.close()


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_concurrent_sessions_equal_batch_rollouts(host, vllm_backend, sampling):
    """Three sessions driven from three threads at once (frames through window rollover) against one batch."""
    num_frames = 7
    inputs = [rollout_inputs(vllm_backend.layout, 2, num_frames, seed=20 + i) for i in range(3)]
    sessions = [host.open(codes=c, actions=a[:1], seed=i, sampling=sampling) for i, (c, a) in enumerate(inputs)]
    got: dict[int, np.ndarray] = {}

    def run(i: int) -> None:
        got[i] = np.stack([sessions[i].step(a, decode=False).codes for a in inputs[i][1][1:]])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    requests = [RolloutRequest(c, a, num_frames, seed=i) for i, (c, a) in enumerate(inputs)]
    for i, want in enumerate(vllm_backend.generate(requests, sampling, progress=False)):
        np.testing.assert_array_equal(got[i].reshape(num_frames, -1), want, err_msg=f"session {i}")
    for session in sessions:
        session.close()


def test_fork_reuses_the_cached_past(host, vllm_backend):
    context, actions = rollout_inputs(vllm_backend.layout, 2, 4, seed=30)
    session = host.open(codes=context, actions=actions[:1], seed=0)
    for action in actions[1:3]:
        session.step(action, decode=False)
    twin = session.fork()
    futures = [s.step_async(actions[3]) for s in (session, twin)]
    results = [f.result(timeout=120) for f in futures]
    np.testing.assert_array_equal(results[0].codes, results[1].codes)
    for result in results:  # everything but the new action slots and the last partial block was cached
        assert result.prompt_tokens - result.cached_tokens <= VLLM_BLOCK_SIZE + vllm_backend.layout.action_tokens
    assert host.engine.metrics()["prefix_cache_hit_rate"] > 0.5
