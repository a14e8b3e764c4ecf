"""Route slots on vLLM's engine (the CPU build in CI) against the Transformers backend: the same greedy codes with
routes and without, across a window rollover; each frame's slots item carries its route, so prefix caching still
serves the frames already seen, also when the newest frame's route is set step by step as a session sets it.

One engine of a route model serves this module (``vllm_route_backend`` in conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from terra.config.sampling import SamplingConfig
from terra.generation.rollout import RolloutRequest
from terra.contract.routes import routes_from_xy
from tests.conftest import VLLM_BLOCK_SIZE

pytestmark = pytest.mark.vllm

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def hf_backend(vllm_route_backend):
    from terra.generation.backends import model_backend

    return model_backend(vllm_route_backend.model_path, dtype=torch.float32)


def requests(layout, num_context: int, num_frames: int, seed: int, with_routes=(True, True, False)):
    """Rollouts from one context with their own actions; routes per rollout as ``with_routes`` says."""
    rng = np.random.default_rng(seed)
    context = rng.integers(0, layout.codebook_size, (num_context, layout.image_tokens))
    frames = num_context + num_frames
    out = []
    for i, routed in enumerate(with_routes):
        routes = routes_from_xy(rng.normal(0, 20, (frames, layout.route_tokens, 2))) if routed else None
        out.append(RolloutRequest(context, rng.normal(0, 2, (frames - 1, layout.action_tokens, 3)).astype(np.float32),
                                  num_frames, seed=i, routes=routes))
    return out


def test_greedy_codes_equal_the_transformers_backend_with_and_without_routes(vllm_route_backend, hf_backend):
    layout = vllm_route_backend.layout
    assert layout.route_tokens == 4 and layout.frame_span == 74
    batch = requests(layout, num_context=2, num_frames=6, seed=0)  # 2 + 6 frames in windows of 6: a rollover
    start = len(vllm_route_backend.frame_stats)
    ours = vllm_route_backend.generate(batch, GREEDY, progress=False)
    reference = hf_backend.generate(batch, GREEDY, progress=False)
    for got, want in zip(ours, reference):
        np.testing.assert_array_equal(got, want)
    assert all(int(o.max()) < layout.codebook_size for o in ours)
    for s in vllm_route_backend.frame_stats[start:]:
        if not s.window_start:  # the growing prompt's frames, routes included, come from the prefix cache: all
            assert s.computed_tokens <= VLLM_BLOCK_SIZE + layout.slot_tokens, s  # but its last block and new slots


def test_a_route_set_step_by_step_keeps_the_cache_and_the_codes(vllm_route_backend, hf_backend):
    """A session sets the next frame's route after seeing a frame (``RolloutState.set_next_routes``): the frames
    before keep their items, so their prefix is served from the cache, and the codes are the batch rollout's."""
    layout = vllm_route_backend.layout
    (whole,) = requests(layout, num_context=2, num_frames=3, seed=1, with_routes=(True,))
    stepped = RolloutRequest(whole.context, whole.actions.copy(), 3, seed=whole.seed,
                             routes=np.concatenate([whole.routes[:2], np.full_like(whole.routes[2:], np.nan)]))
    state, done = vllm_route_backend.start(stepped), []
    while not state.finished:
        state.set_next_routes([whole.routes[state.next_frame]])
        vllm_route_backend.submit(state, GREEDY)
        while not (finished := vllm_route_backend.poll()):
            pass
        done += finished
    np.testing.assert_array_equal(state.generated(), hf_backend.generate([whole], GREEDY, progress=False)[0])
    assert len(done) == 3 and done[0].window_start
    room = VLLM_BLOCK_SIZE + layout.slot_tokens  # all but the last block and the new slots come from the cache
    assert all(d.prompt_tokens - d.cached_tokens <= room for d in done[1:]), [(d.cached_tokens, d.prompt_tokens)
                                                                             for d in done]
