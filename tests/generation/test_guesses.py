"""Speculative decoding's guess sources (``sampling.guesses``, terra/generation/guesses.py): every source gives
sequential decoding's codes, and the transitions' memory recalls the draw made after the same token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from terra.config.sampling import GUESSES, SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.guesses import MEMORY_SLOTS, Transitions
from terra.generation.hf_backend import HFBackend
from terra.generation.rollout import RolloutRequest
from terra.generation.vllm_backend import VLLMBackend
from tests.conftest import tiny_model

SAMPLED = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95, decoding="sequential")


@pytest.fixture(scope="module")
def backend(single_thread) -> HFBackend:
    return HFBackend(tiny_model())


def test_every_source_gives_the_sequential_codes(backend):
    rng = np.random.default_rng(3)
    request = RolloutRequest(rng.integers(0, 512, (2, 64)), rng.normal(size=(11, 6, 3)).astype(np.float32), 9,
                             seed=3)  # 2 + 9 frames: the tiny model's 6-frame windows roll over twice
    [sequential] = backend.run_rollouts([request], SAMPLED, progress=False)
    for source in GUESSES:
        for draft_tokens in (5, 64):
            sampling = SAMPLED.replace(decoding="speculative", draft_tokens=draft_tokens, guesses=source)
            [state] = backend.run_rollouts([request], sampling, progress=False)
            np.testing.assert_array_equal(state.generated(), sequential.generated(), err_msg=source)
            assert all(1 <= p < 64 for p in state.passes)


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
    assert SamplingConfig().guesses == "transitions"  # the default: scripts/benchmark_guesses.py
    assert SamplingConfig.from_mapping({"guesses": "previous"}).guesses == "previous"
    assert "guesses" not in SamplingConfig(guesses="transitions").draw_settings()  # a run's fingerprint
    with pytest.raises(TerraInputError, match="unknown sampling.guesses 'warp'; choose one of: previous, transitions"):
        SamplingConfig(guesses="warp")


def test_vllm_engines_guess_the_previous_frame():
    """vLLM's sampler guesses the previous frame's codes (terra/vllm/jacobi_state.py): a run says so."""
    engine = VLLMBackend.__new__(VLLMBackend)
    engine.draft_tokens = 24
    assert engine.as_run(SAMPLED.replace(guesses="transitions")).guesses == "previous"
