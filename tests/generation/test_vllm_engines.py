"""Two vLLM engines on one device behind one streaming backend (``backend.options.engines``), on vLLM's CPU engine.

The module's backend runs the session engines' model and settings (conftest.py) as two engines; the per-frame
backend of the session is the reference: the same seeds must give the same codes wherever a rollout runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from terra.config.checks import TerraInputError
from terra.generation.backends import create_backend
from tests.conftest import VLLM_BLOCK_SIZE, VLLM_ENGINE
from tests.generation.test_vllm_streaming import GREEDY, SAMPLED, drain, finish_one_by_one, requests_of_lengths

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def two_engines(vllm_model_dir):
    from terra.generation.vllm_streaming import StreamingVLLMBackend
    from terra.vllm import compat

    if not compat.has_streaming_input():
        pytest.skip(f"vLLM {compat.VLLM_VERSION} has no streaming-input requests")
    backend = StreamingVLLMBackend(vllm_model_dir, engines=2, **VLLM_ENGINE)
    yield backend
    backend.close()
    assert not backend.engines and not backend._thread.is_alive()


def test_each_engine_gets_an_even_share(two_engines):
    configs = two_engines.engine_configs()
    assert len(configs) == 2 and two_engines.engine_seqs == 4
    for config in configs:  # VLLM_ENGINE's totals: max_num_seqs 8, 10 % of memory, a 64 MiB KV cache
        assert config.scheduler_config.max_num_seqs == 4
        assert config.cache_config.gpu_memory_utilization == pytest.approx(0.05)
        assert config.cache_config.kv_cache_memory_bytes == 32 << 20
        assert config.scheduler_config.stream_interval == two_engines.layout.image_tokens


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_rollouts_spread_over_the_engines_give_the_per_frame_codes(vllm_backend, two_engines, sampling):
    """Four rollouts of different lengths, the longest past two window rollovers, alternately on the two engines."""
    requests = requests_of_lengths(two_engines.layout, [8, 2, 5, 3], seed=6)
    want = vllm_backend.generate(requests, sampling, progress=False)
    states = [two_engines.start(r, i) for i, r in enumerate(requests)]
    for state in states:
        two_engines.submit(state, sampling)
    assert [state.cache.engine for state in states] == [0, 1, 0, 1]  # each new rollout to the emptier engine
    assert [len(streams) for streams in two_engines._open] == [2, 2]
    drain(two_engines)
    homes = [state.cache.engine for state in states]
    while any(not s.finished for s in states):  # every rollout stays home, across its window rollovers too
        for state in states:
            if not state.finished:
                two_engines.submit(state, sampling)
        drain(two_engines)
        assert [s.cache.engine for s in states] == homes
    for state, expected in zip(states, want):
        two_engines.release(state)
        np.testing.assert_array_equal(state.generated(), expected)
    assert not any(two_engines._open)
    assert [len(w) for w in two_engines.generate(requests, sampling, progress=False)] == [8, 2, 5, 3]


def test_a_fork_runs_on_its_parents_engine_from_its_prefix_cache(vllm_backend, two_engines):
    """A fork has no stream; its first frame opens one on the engine that holds the shared past."""
    requests = requests_of_lengths(two_engines.layout, [4, 4], seed=7)
    want = vllm_backend.generate(requests, SAMPLED, progress=False)[1]
    states = [two_engines.start(r, i) for i, r in enumerate(requests)]
    for _ in range(2):  # two frames each: the first rollout on engine 0, the second on engine 1
        for state in states:
            two_engines.submit(state, SAMPLED)
        drain(two_engines)
    parent = states[1]
    twin = two_engines.fork(parent)
    two_engines.submit(twin, SAMPLED)
    assert twin.cache.engine == parent.cache.engine == 1  # home with its parent, not on the emptier engine
    done = []
    while two_engines.num_queued:
        done += two_engines.poll()
    (first,) = done
    assert first.prompt_tokens - first.cached_tokens <= VLLM_BLOCK_SIZE + two_engines.layout.action_tokens
    finish_one_by_one(two_engines, [twin, *states])
    np.testing.assert_array_equal(twin.generated(), want)
    np.testing.assert_array_equal(parent.generated(), want)
    assert not any(two_engines._open)


def test_several_engines_need_streaming_requests(vllm_model_dir, monkeypatch):
    from terra.config.backend import check_backend
    from terra.vllm import compat

    with pytest.raises(TerraInputError, match="requests=streaming"):
        check_backend("vllm", {"engines": 2, "requests": "per_frame"})
    with pytest.raises(TerraInputError, match="engines must be a whole number from 1 to 16"):
        check_backend("vllm", {"engines": 0, "requests": "streaming"})
    monkeypatch.setattr(compat, "has_streaming_input", lambda: False)  # requests=auto on a vLLM without it
    with pytest.raises(TerraInputError, match="set engines=1"):
        create_backend("vllm", vllm_model_dir, "cpu", engines=2, requests="auto")
