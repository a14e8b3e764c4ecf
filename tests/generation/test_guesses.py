"""Speculative decoding's guess sources (``sampling.guesses``, terra/generation/guesses.py): every source gives
sequential decoding's codes, and the transitions' memory recalls the draw made after the same token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from terra.config.sampling import GUESSES, SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.guesses import MEMORY_SLOTS, Transitions
from terra.generation.backends import model_backend
from terra.generation.hf_backend import HFBackend
from terra.generation.rollout import RolloutRequest
from terra.generation.sampling import gumbel_noise
from terra.generation.speculative import SpeculativeFrame
from terra.generation.vllm_backend import VLLMBackend
from tests.conftest import tiny_model

SAMPLED = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95, decoding="sequential")


@pytest.fixture(scope="module")
def backend(single_thread) -> HFBackend:
    return model_backend(tiny_model())


def rollout() -> RolloutRequest:
    """2 + 9 frames: the tiny model's 6-frame windows roll over twice."""
    rng = np.random.default_rng(3)
    return RolloutRequest(rng.integers(0, 512, (2, 64)), rng.normal(size=(11, 6, 3)).astype(np.float32), 9, seed=3)


def test_every_source_gives_the_sequential_codes(backend):
    request = rollout()
    [sequential] = backend.run_rollouts([request], SAMPLED, progress=False)
    for source in GUESSES:
        for draft_tokens in (5, 64, 100):
            sampling = SAMPLED.replace(decoding="speculative", draft_tokens=draft_tokens, guesses=source)
            [state] = backend.run_rollouts([request], sampling, progress=False)
            np.testing.assert_array_equal(state.generated(), sequential.generated(), err_msg=source)
            assert all(1 <= p < 64 for p in state.passes)


def handovers(backend, request, sampling) -> tuple[np.ndarray, list[tuple[int, torch.Tensor]]]:
    """A rollout's codes and, per frame that handed guesses on, its index and the guesses."""
    handed, original = [], SpeculativeFrame.handover

    def handover(frame):
        following, guesses, noise = original(frame)
        handed.append((frame.frame, guesses.clone()))
        return following, guesses, noise

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SpeculativeFrame, "handover", handover)
        [state] = backend.run_rollouts([request], sampling, progress=False)
    return state.generated(), handed


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lookahead_hands_the_next_frame_the_models_own_draw(backend, temperature):
    """A block wider than a frame runs every pass into the next frame, so the frame's last pass draws the next
    frame's position 0 after the whole frame and its action slots, with that position's noise: its first guess
    there is its code. A row taken one off, or the frame's own noise, would not be (the codes are right anyway)."""
    request, sampling = rollout(), SAMPLED.replace(temperature=temperature, decoding="speculative", draft_tokens=100,
                                                   guesses="lookahead")
    codes, handed = handovers(backend, request, sampling)
    first = 2  # context frames
    assert len(handed) == 6  # 9 frames in windows of 4 + 4 + 1 new: no lookahead past a window's last frame
    for frame, guesses in handed:
        assert guesses[0] == codes[frame + 1 - first][0], frame
    assert sum(int((g == torch.as_tensor(codes[f + 1 - first])).sum()) for f, g in handed) > 6 * 64 // 4


def test_a_frame_decoded_another_way_between_lookaheads_keeps_the_codes(backend):
    """A session may change its decoding between steps: what a lookahead hands on is for the frame right after it,
    so a frame decoded sequentially in between leaves the next speculative frame to its own guesses and noise."""
    request = rollout()
    [sequential] = backend.run_rollouts([request], SAMPLED, progress=False)
    lookahead = SAMPLED.replace(decoding="speculative", draft_tokens=100, guesses="lookahead")
    state = backend.start(request)
    for step in range(request.num_frames):
        backend.submit(state, SAMPLED if step % 3 == 1 else lookahead)
        frames = state.num_generated
        for _ in range(10 * 64):  # at most a pass per token of the frame
            if backend.poll():
                break
        assert state.num_generated == frames + 1
    np.testing.assert_array_equal(state.generated(), sequential.generated())


def test_lookahead_with_the_wrong_noise_is_caught(backend, monkeypatch):
    """The check above rejects a lookahead that draws the next frame with this frame's noise."""
    def own_noise(frame, rows):
        return gumbel_noise(frame.seed, frame.frame, range(rows), frame.codebook_size)

    monkeypatch.setattr(SpeculativeFrame, "_ahead_rows", own_noise)
    sampling = SAMPLED.replace(decoding="speculative", draft_tokens=100, guesses="lookahead")
    codes, handed = handovers(backend, rollout(), sampling)
    assert any(guesses[0] != codes[frame - 1][0] for frame, guesses in handed)


def test_transitions_recall_the_draw_after_the_same_token():
    memory = Transitions(6, torch.device("cpu"))
    memory.record(torch.tensor([2, 3]), torch.tensor([7, 8]), torch.tensor([1, 2]))
    memory.record(torch.tensor([3]), torch.tensor([9]), torch.tensor([4]))  # position 3 drawn after another token
    guesses = torch.tensor([5, 5, 5])
    recalled = memory.recall(torch.tensor([2, 3, 4]), torch.tensor([7, 8, 7]), guesses)
    assert recalled.tolist() == [1, 2, 5]  # position 4 was never drawn: its guess stays
    assert memory.recall(torch.tensor([3]), torch.tensor([9]), guesses[:1]).tolist() == [4]
    memory.record(torch.tensor([3]), torch.tensor([8]), torch.tensor([6]))  # a later draw after the same token
    assert memory.recall(torch.tensor([3]), torch.tensor([8]), guesses[:1]).tolist() == [6]


def test_transitions_forget_the_oldest_tokens():
    memory = Transitions(1, torch.device("cpu"))
    for token in range(MEMORY_SLOTS + 1):
        memory.record(torch.tensor([0]), torch.tensor([token]), torch.tensor([100 + token]))

    def recall(token: int) -> int:
        return memory.recall(torch.tensor([0]), torch.tensor([token]), torch.tensor([-1])).item()

    assert recall(0) == -1 and recall(MEMORY_SLOTS) == 100 + MEMORY_SLOTS and recall(1) == 101


def test_the_setting_names_a_source_and_leaves_the_codes_alone():
    assert SamplingConfig().guesses == "auto"  # the default: what the backend runs (lookahead on Transformers)
    assert SamplingConfig.from_mapping({"guesses": "previous"}).guesses == "previous"
    assert "guesses" not in SamplingConfig(guesses="transitions").draw_settings()  # a run's fingerprint
    with pytest.raises(TerraInputError, match="unknown sampling.guesses 'warp'; choose one of: auto, previous, "
                                              "transitions, lookahead"):
        SamplingConfig(guesses="warp")


def test_vllm_engines_guess_the_previous_frame():
    """vLLM's sampler guesses the previous frame's codes (terra/vllm/jacobi_state.py): a run says so, and other
    guesses asked of a speculative engine are one line (a sequential engine uses none)."""
    engine = VLLMBackend.__new__(VLLMBackend)
    engine.draft_tokens = 24
    assert engine.as_run(SAMPLED).guesses == engine.as_run(SAMPLED.replace(guesses="previous")).guesses == "previous"
    with pytest.raises(TerraInputError, match="sampling.guesses=transitions: vLLM's engine guesses the previous"):
        engine.as_run(SAMPLED.replace(guesses="transitions"))
    engine.draft_tokens = 0
    assert engine.as_run(SAMPLED.replace(guesses="lookahead")).guesses == "previous"
