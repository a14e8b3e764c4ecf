"""Speculative decoding on the Transformers backend gives sequential decoding's codes, greedy and sampled.

The tiny world model (8x8 codes, 6-frame windows), so a rollout of 2 context + 9 frames rolls over twice;
``draft_tokens`` from one guess to more than a frame; sampling with temperature, top-k and top-p. A rollout's codes
depend on its seed alone: not on its batch, a fork, or the decoding. Every frame records its forward passes.
"""

from __future__ import annotations

import numpy as np
import pytest

from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.decoding import resolve_decoding
from terra.generation.backends import model_backend
from terra.generation.hf_backend import HFBackend
from terra.generation.rollout import RolloutRequest
from terra.generation.vllm_backend import VLLMBackend
from tests.conftest import tiny_model

P = 64
GREEDY = SamplingConfig(temperature=0, decoding="sequential")
SAMPLED = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95, decoding="sequential")


@pytest.fixture(scope="module")
def backend(single_thread) -> HFBackend:
    return model_backend(tiny_model())


def request(seed: int, num_context: int = 2, num_frames: int = 9) -> RolloutRequest:
    rng = np.random.default_rng(seed)
    context = rng.integers(0, 512, (num_context, P))
    return RolloutRequest(context, rng.normal(size=(num_context + num_frames, 6, 3)).astype(np.float32), num_frames,
                          seed=seed)


@pytest.fixture(scope="module")
def sequential(backend) -> dict[str, list[np.ndarray]]:
    """Sequential codes of two rollouts (2 + 9 and 1 + 7 frames: two and one window rollovers), both samplings."""
    requests = [request(3), request(4, num_context=1, num_frames=7)]
    runs = {name: backend.run_rollouts(requests, sampling, progress=False)
            for name, sampling in (("greedy", GREEDY), ("sampled", SAMPLED))}
    for states in runs.values():
        assert [s.passes for s in states] == [[P] * 9, [P] * 7]
    return {name: [s.generated() for s in states] for name, states in runs.items()}


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("draft_tokens", [1, 5, 64, 200, "auto"])
def test_speculative_equals_sequential_across_window_rollovers(backend, sequential, sampling, draft_tokens):
    requests = [request(3), request(4, num_context=1, num_frames=7)]
    speculative = sampling.replace(decoding="speculative", draft_tokens=draft_tokens)
    states = backend.run_rollouts(requests, speculative, progress=False)
    name = "greedy" if sampling.greedy else "sampled"
    for state, codes in zip(states, sequential[name]):
        np.testing.assert_array_equal(state.generated(), codes)
    passes = [p for s in states for p in s.passes]
    assert len(passes) == 16 and all(1 <= p <= P for p in passes) and sum(passes) < 16 * P
    stats = states[0].pass_stats()
    assert stats.frames == 9 and stats.passes == sum(states[0].passes)
    assert stats.tokens_per_pass == pytest.approx(9 * P / stats.passes)


def test_rollouts_of_other_blocks_guesses_and_samplings_stepped_together_keep_their_codes(backend, sequential):
    """A step is one pass of every rollout in flight, their draws, acceptance and refill taken together
    (terra/generation/speculative.py, ``advance_frames``): rollouts of other blocks (one past the frame: lookahead),
    guesses and samplings, each frame in its own pass, keep sequential decoding's codes."""
    speculative = SAMPLED.replace(decoding="speculative")
    runs = [(request(3), speculative.replace(draft_tokens=5, guesses="transitions"), "sampled", 0),
            (request(3), GREEDY.replace(decoding="speculative", draft_tokens=200), "greedy", 0),
            (request(4, num_context=1, num_frames=7), speculative.replace(draft_tokens=64), "sampled", 1),
            (request(3), speculative.replace(draft_tokens=16, guesses="previous"), "sampled", 0)]
    states = [backend.start(r) for r, *_ in runs]
    samplings = {id(state): sampling for state, (_, sampling, _, _) in zip(states, runs)}
    for state in states:
        backend.submit(state, samplings[id(state)])
    steps = 0
    while backend.num_queued:
        steps += 1
        for done in backend.poll():
            if done.state.finished:
                backend.release(done.state)
            else:
                backend.submit(done.state, samplings[id(done.state)])
    for state, (_, _, name, index) in zip(states, runs):
        np.testing.assert_array_equal(state.generated(), sequential[name][index])
    assert steps == max(sum(state.passes) for state in states)  # every rollout in flight took a pass each step


@pytest.mark.parametrize("guesses", ["auto", "previous", "transitions"])
def test_a_frame_cancelled_mid_way_and_forks_leave_the_codes_sequential(backend, sequential, guesses):
    """A rollout's window cache (terra/generation/kv.py) is written on in place by its next frames: a frame cancelled
    after some passes leaves positions written past the kept ones, which its resubmission overwrites; a fork's frames
    write into a copy, the parent's on into its own. Every frame stays sequential decoding's."""
    speculative = SAMPLED.replace(decoding="speculative", draft_tokens=8, guesses=guesses)
    state = backend.start(request(3))
    for frame in range(9):
        if frame in (1, 4):  # three passes, then the frame is dropped and asked for again
            backend.submit(state, speculative)
            for _ in range(3):
                assert not backend.poll()
            backend.cancel([state])
            assert state.num_generated == frame and not backend.num_queued
        if frame == 5:  # a fork here: it and its parent run on, each as the rollout itself
            twin = backend.fork(state)
        backend.submit(state, speculative)
        while not backend.poll():
            pass
    np.testing.assert_array_equal(state.generated(), sequential["sampled"][0])
    for _ in range(4):
        backend.submit(twin, speculative)
        while not backend.poll():
            pass
    np.testing.assert_array_equal(twin.generated(), sequential["sampled"][0])


def test_sampled_rollouts_depend_on_their_seed_alone(backend, sequential):
    speculative = SAMPLED.replace(decoding="speculative", draft_tokens=16)
    requests = [request(5), request(3), request(5)]
    together = backend.run_rollouts(requests, speculative, progress=False)
    np.testing.assert_array_equal(together[0].generated(), together[2].generated())  # same seed, same frames
    assert not np.array_equal(together[0].generated(), together[1].generated())
    np.testing.assert_array_equal(together[1].generated(), sequential["sampled"][0])  # batch-mates do not matter
    batched = backend.run_rollouts(requests, SAMPLED, progress=False)  # nor does sequential batching
    np.testing.assert_array_equal(batched[1].generated(), sequential["sampled"][0])

    short = request(7, num_frames=2)  # a fork mid-rollout continues exactly as the rollout itself does
    state = backend.start(short)
    backend.submit(state, speculative)
    while not backend.poll():
        pass
    twin = backend.fork(state)
    for s, sampling in ((state, speculative), (twin, SAMPLED)):
        backend.submit(s, sampling)
    while backend.num_queued:
        backend.poll()
    np.testing.assert_array_equal(state.generated(), twin.generated())
    np.testing.assert_array_equal(state.generated(), backend.generate([short], SAMPLED, progress=False)[0])


def test_bad_decoding_settings_are_one_line():
    for bad, name in (({"draft_tokens": 0}, "sampling.draft_tokens"), ({"draft_tokens": 2.5}, "sampling.draft_tokens"),
                      ({"draft_tokens": "frame"}, "sampling.draft_tokens must be auto or"),
                      ({"decoding": "jacobi"}, "sampling.decoding"), ({"guesses": "best"}, "sampling.guesses")):
        with pytest.raises(TerraInputError, match=name) as err:
            SamplingConfig.from_mapping(bad)
        assert "\n" not in str(err.value)
    speculative = SamplingConfig(decoding="speculative", draft_tokens=16)
    with pytest.raises(TerraInputError, match="vLLM decodes speculatively only on a GPU") as err:
        resolve_decoding(speculative, "vllm", "cpu")  # refused before vLLM would be imported
    assert "\n" not in str(err.value)
    assert resolve_decoding(speculative.replace(decoding="auto"), "vllm", "cpu").decoding == (
        "sequential")  # auto on vLLM's CPU engine
    assert resolve_decoding(speculative, "hf", "cpu") == speculative.replace(guesses="lookahead")


def test_vllm_decodes_as_its_engine_was_started():
    """A vLLM engine's draft slots are fixed when it starts: every request gets its decoding (no engine needed)."""
    engine = VLLMBackend.__new__(VLLMBackend)
    engine.draft_tokens = 0
    for asked in ("auto", "sequential", "speculative"):
        assert engine.as_run(SAMPLED.replace(decoding=asked)).decoding == "sequential"
    engine.draft_tokens = 24
    ran = engine.as_run(SAMPLED.replace(decoding="sequential", draft_tokens=8))
    assert (ran.decoding, ran.draft_tokens, ran.temperature) == ("speculative", 24, SAMPLED.temperature)
