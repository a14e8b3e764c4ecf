"""The vLLM backend against the Transformers reference, on vLLM's engine (the CPU build in CI).

One engine serves the whole session (``vllm_backend`` in conftest.py). Its model's raw logits favour the
non-image ids 512/513, so every test also checks that sampling stays inside the image codebook.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from terra.config.sampling import SamplingConfig
from terra.generation.rollout import RolloutRequest, RolloutState
from tests.conftest import VLLM_BLOCK_SIZE

pytestmark = pytest.mark.vllm

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def hf_backend(vllm_backend):
    from terra.generation.backends import model_backend

    return model_backend(vllm_backend.model_path, dtype=torch.float32)


def make_requests(layout, num_rollouts: int, num_context: int, num_frames: int, seed: int = 0) -> list[RolloutRequest]:
    """Rollouts sharing one context, each with its own random actions."""
    rng = np.random.default_rng(seed)
    context = rng.integers(0, layout.codebook_size, (num_context, layout.image_tokens))
    steps = num_context + num_frames - 1
    shape = (steps, layout.action_tokens, 3)
    return [
        RolloutRequest(context, rng.normal(0, 2, shape).astype(np.float32), num_frames, seed=i)
        for i in range(num_rollouts)
    ]


def test_greedy_parity_action_sensitivity_and_codebook(vllm_backend, hf_backend):
    layout = vllm_backend.layout
    requests = make_requests(layout, num_rollouts=3, num_context=2, num_frames=2)
    seen = []
    ours = vllm_backend.generate(requests, GREEDY, progress=False, on_frame=lambda r, f, c: seen.append((r, f)))
    reference = hf_backend.generate(requests, GREEDY, progress=False)
    for got, want in zip(ours, reference):
        assert got.shape == (2, layout.image_tokens)
        np.testing.assert_array_equal(got, want)
    assert sorted(seen) == [(r, f) for r in range(3) for f in range(2)]
    # Same context, different actions: the rollouts diverge.
    assert not np.array_equal(ours[0], ours[1]) and not np.array_equal(ours[1], ours[2])
    # The unrestricted argmax would pick a special id; the backend never does.
    assert all(int(o.max()) < layout.codebook_size for o in ours)


def test_raw_logits_favour_special_ids(hf_backend):
    """Precondition of the codebook check: without the restriction, generation would leave the codebook."""
    model, layout = hf_backend.model, hf_backend.layout
    ids, actions, positions = RolloutState(make_requests(layout, 1, 2, 1)[0], layout).prompt()
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([ids]),
            conditions=torch.from_numpy(actions).reshape(1, -1, 3),
            position_ids=torch.from_numpy(positions)[None],
        ).logits[0]
    assert (logits.argmax(-1) >= layout.codebook_size).float().mean() > 0.9


def test_window_rollover_and_prefix_reuse(vllm_backend, hf_backend):
    layout = vllm_backend.layout  # 6 frames per window, overlap 3
    requests = make_requests(layout, num_rollouts=2, num_context=2, num_frames=7, seed=1)
    start = len(vllm_backend.frame_stats)
    ours = vllm_backend.generate(requests, GREEDY, progress=False)
    reference = hf_backend.generate(requests, GREEDY, progress=False)
    for got, want in zip(ours, reference):
        assert got.shape == (7, layout.image_tokens)
        np.testing.assert_array_equal(got, want)

    stats = vllm_backend.frame_stats[start:]
    assert len(stats) == 14
    assert sum(s.window_start for s in stats) == 4  # two windows per rollout
    for s in stats:
        if not s.window_start:  # a growing prompt: all but its new action slots and last block come from cache
            assert s.hit_rate >= 0.9, s
            assert s.computed_tokens <= VLLM_BLOCK_SIZE + layout.action_tokens, s


def test_greedy_vllm_equals_both_transformers_decodings_across_a_rollover(vllm_backend, hf_backend):
    """The Transformers reference gives vLLM's greedy codes whether it decodes sequentially or speculatively."""
    requests = make_requests(vllm_backend.layout, num_rollouts=2, num_context=2, num_frames=5, seed=3)
    ours = vllm_backend.generate(requests, GREEDY, progress=False)
    for decoding in ("sequential", "speculative"):
        reference = hf_backend.generate(requests, GREEDY.replace(decoding=decoding, draft_tokens=16), progress=False)
        for got, want in zip(ours, reference):
            np.testing.assert_array_equal(got, want)


def test_seeded_sampling_is_independent_of_batching(vllm_backend):
    layout = vllm_backend.layout
    sampling = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95)
    requests = make_requests(layout, num_rollouts=3, num_context=1, num_frames=2, seed=2)
    together = vllm_backend.generate(requests, sampling, progress=False)
    alone = vllm_backend.generate([requests[1]], sampling, progress=False)[0]
    np.testing.assert_array_equal(together[1], alone)
    assert not np.array_equal(together[0], together[1])  # different seeds (and actions) sample differently
    assert all(int(o.max()) < layout.codebook_size and int(o.min()) >= 0 for o in together)


def test_find_slots():
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from terra.vllm.llama_action import find_slots

    ids = [1, 2, 9, 9, 9, 3, 9, 9, 9, 9, 9, 9]
    assert find_slots(ids, 9, 3) == [2, 6, 9]
    with pytest.raises(ValueError, match="whole number of frames"):
        find_slots([1, 9, 9, 2], 9, 3)


def test_prompt_and_items_must_match(vllm_backend):
    from vllm import SamplingParams

    layout = vllm_backend.layout
    ids, actions, _ = RolloutState(make_requests(layout, 1, 2, 1)[0], layout).prompt()
    prompt = {"prompt_token_ids": ids, "multi_modal_data": {"actions": actions[:1]}}
    with pytest.raises(ValueError, match="the prompt has 2 frames of slots but 1 'actions' items"):
        vllm_backend.engine.add_request("mismatch", prompt, SamplingParams(max_tokens=1))


def test_rejects_a_folder_without_a_world_model(tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from terra.generation.vllm_backend import VLLMBackend
    from terra.core.errors import TerraInputError

    with pytest.raises(TerraInputError, match="world model config"):
        VLLMBackend(str(tmp_path))


def test_plugin_entry_point_registers_both_architectures():
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from importlib.metadata import entry_points

    from vllm import ModelRegistry

    (plugin,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "terra"]
    plugin.load()()
    assert {"LlamaActionForCausalLM", "LlamaActionV2ForCausalLM"} <= set(ModelRegistry.get_supported_archs())


def test_identical_actions_in_one_prompt(vllm_backend, hf_backend):
    """A constant manoeuvre gives every frame the same action item (same content hash) in one prompt."""
    layout = vllm_backend.layout
    request = make_requests(layout, num_rollouts=1, num_context=3, num_frames=3, seed=3)[0]
    request.actions = np.broadcast_to(request.actions[:1], request.actions.shape).copy()
    ours = vllm_backend.generate([request], GREEDY, progress=False)
    np.testing.assert_array_equal(ours[0], hf_backend.generate([request], GREEDY, progress=False)[0])


def test_capacity_is_what_the_kv_cache_holds_for_a_window(vllm_backend, hf_backend):
    """The batch's max_concurrent=auto asks the backend (terra/batch/concurrency.py); the real CPU engine reports its
    cache, so the answer is its blocks over one window's blocks, capped by max_num_seqs; Transformers has no bound."""
    from terra.generation.vllm_backend import kv_capacity

    config = vllm_backend.engine.vllm_config
    window = vllm_backend.layout.max_frames
    blocks, block_size = config.cache_config.num_gpu_blocks, config.cache_config.block_size
    assert blocks and block_size  # what capacity() reads is there in this vLLM release
    expected = kv_capacity(blocks, block_size, window * vllm_backend.layout.frame_span,
                           config.scheduler_config.max_num_seqs)
    assert vllm_backend.capacity(window) == expected >= 1
    assert vllm_backend.capacity(1) >= vllm_backend.capacity(window)  # shorter windows: at least as many fit
    assert hf_backend.capacity(window) is None
