"""Speculative decoding on the Transformers backend: greedy codes equal sequential ones, token for token.

The tiny world model (8x8 codes, 6-frame windows), so a rollout of 2 context + 9 frames rolls over twice; block
sizes from one draft to more than a frame. Sampled rollouts keep their own generators (the same codes alone or
in a batch, and after a fork), and every frame records its forward passes.
"""

from __future__ import annotations

import numpy as np
import pytest

from terra.config.checks import TerraInputError
from terra.config.sampling import SamplingConfig
from terra.config.spec import RunSpec
from terra.generation import backends
from terra.generation.hf_backend import HFBackend
from terra.generation.rollout import RolloutRequest
from terra.generation.vllm_backend import VLLMBackend
from tests.conftest import tiny_model

P = 64
GREEDY = SamplingConfig(temperature=0, decoding="sequential")
SAMPLED = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95, decoding="speculative", block_size=16)


@pytest.fixture(scope="module")
def backend(single_thread) -> HFBackend:
    return HFBackend(tiny_model())


def request(seed: int, num_context: int = 2, num_frames: int = 9) -> RolloutRequest:
    rng = np.random.default_rng(seed)
    context = rng.integers(0, 512, (num_context, P))
    return RolloutRequest(context, rng.normal(size=(num_context + num_frames, 6, 3)).astype(np.float32), num_frames,
                          seed=seed)


@pytest.mark.parametrize("block_size", [1, 5, 64, 200])
def test_greedy_speculative_equals_sequential_across_window_rollovers(backend, block_size):
    requests = [request(3), request(4, num_context=1, num_frames=7)]
    [sequential, other] = backend.run_rollouts(requests, GREEDY, progress=False)
    speculative = GREEDY.replace(decoding="speculative", block_size=block_size)
    states = backend.run_rollouts(requests, speculative, progress=False)
    np.testing.assert_array_equal(states[0].generated(), sequential.generated())
    np.testing.assert_array_equal(states[1].generated(), other.generated())
    assert sequential.passes == [P] * 9
    passes = [p for s in states for p in s.passes]
    assert len(passes) == 16 and all(1 <= p <= P for p in passes) and sum(passes) < 16 * P
    stats = states[0].decode_stats()
    assert stats.frames == 9 and stats.passes == sum(states[0].passes)
    assert stats.tokens_per_pass == pytest.approx(9 * P / stats.passes)


def test_sampled_rollouts_do_not_depend_on_batching_or_forks(backend):
    requests = [request(5), request(6), request(5)]
    together = backend.run_rollouts(requests, SAMPLED, progress=False)
    np.testing.assert_array_equal(together[0].generated(), together[2].generated())  # same seed, same frames
    assert not np.array_equal(together[0].generated(), together[1].generated())
    alone = backend.run_rollouts(requests[1:2], SAMPLED, progress=False)[0]
    np.testing.assert_array_equal(alone.generated(), together[1].generated())
    assert sum(together[1].passes) < 9 * P  # several tokens per pass, also when sampling

    short = request(7, num_frames=2)  # a fork mid-rollout continues exactly as the rollout itself does
    state = backend.start(short)
    backend.submit(state, SAMPLED)
    while not backend.poll():
        pass
    twin = backend.fork(state)
    for s in (state, twin):
        backend.submit(s, SAMPLED)
    while backend.num_queued:
        backend.poll()
    np.testing.assert_array_equal(state.generated(), twin.generated())
    np.testing.assert_array_equal(state.generated(), backend.generate([short], SAMPLED, progress=False)[0])


def test_auto_is_speculative_for_few_rollouts_and_sequential_for_many(backend, monkeypatch):
    auto = SamplingConfig(temperature=0.9)
    assert auto.decoding == "auto" and backend.speculative_streams is None  # a CPU: speculative at any count
    assert backend.decoding_for(auto, 10_000).decoding == "speculative"
    monkeypatch.setattr(backend, "speculative_streams", 4)  # what a GPU sets
    assert backend.decoding_for(auto).decoding == "speculative"
    assert backend.decoding_for(auto, 4).decoding == "speculative"
    assert backend.decoding_for(auto, 5).decoding == "sequential"
    assert backend.decoding_for(auto.replace(decoding="sequential"), 1).decoding == "sequential"


def test_bad_decoding_settings_are_one_line(monkeypatch):
    for bad, name in (({"block_size": 0}, "sampling.block_size"), ({"block_size": 2.5}, "sampling.block_size"),
                      ({"decoding": "jacobi"}, "sampling.decoding")):
        with pytest.raises(TerraInputError, match=name) as err:
            SamplingConfig.from_mapping(bad)
        assert "\n" not in str(err.value)
    speculative = SamplingConfig(decoding="speculative")
    vllm = VLLMBackend.__new__(VLLMBackend)  # the class's answer; no engine needed
    with pytest.raises(TerraInputError, match="cannot decode speculatively") as err:
        vllm.decoding_for(speculative)
    assert "\n" not in str(err.value)
    assert vllm.decoding_for(speculative.replace(decoding="auto")).decoding == "sequential"
    monkeypatch.setattr(backends, "vllm_available", lambda: True)  # refused before vLLM would be imported
    spec = RunSpec("wm", "tok", backend="vllm", device="cpu", sampling=speculative)
    with pytest.raises(TerraInputError, match="backend=vllm cannot decode speculatively"):
        backends.resolve_spec(spec)
    assert backends.resolve_spec(spec.replace(backend="hf")).backend == "hf"
