"""Route slots on the Transformers backend: its cached, batched path feeds each frame's route slots as a full
recomputation does, across window rollovers; speculative decoding gives sequential decoding's codes with routes,
for every guess source; the route changes the frames (the model is told it), a rollout's codes depend on its own
route alone (a trained model's reading of its route: scripts/experiments/route_reading.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from terra.config.sampling import SamplingConfig
from terra.generation.backends import model_backend
from terra.generation.hf_backend import HFBackend
from terra.generation.rollout import RolloutRequest
from terra.contract.routes import route_slot_values, routes_from_xy
from tests.conftest import TINY_ROUTES, tiny_route_model

P, A, K, WINDOW = 64, 6, TINY_ROUTES, 6
S = P + A + K
GREEDY = SamplingConfig(temperature=0, decoding="sequential")
SAMPLED = SamplingConfig(temperature=0.9, decoding="sequential")


@pytest.fixture(scope="module")
def backend(single_thread) -> HFBackend:
    return model_backend(tiny_route_model())


def request(seed: int, num_context: int = 2, num_frames: int = 7, routes: bool = True) -> RolloutRequest:
    rng = np.random.default_rng(seed)
    frames = num_context + num_frames
    return RolloutRequest(rng.integers(0, 512, (num_context, P)),
                          rng.normal(size=(frames - 1, A, 3)).astype(np.float32), num_frames, seed=seed,
                          routes=routes_from_xy(rng.normal(0, 4, (frames, K, 2))) if routes else None)


@torch.no_grad()
def full_recomputation(model, req: RolloutRequest, overlap: int = 3) -> np.ndarray:
    """Greedy codes by a training-style forward over the whole window prefix for every token; frame t's slots
    hold its action and route t + 1."""
    frames = list(req.context)
    start, target = 0, len(req.context) + req.num_frames
    while len(frames) < target:
        if len(frames) - start == WINDOW:
            start = len(frames) - overlap
        window = range(start, len(frames))
        # the new frame's own slots come after its image tokens: any value stands in for them
        actions = np.concatenate([req.actions[start : len(frames)], np.zeros((1, A, 3), np.float32)])
        routes = np.concatenate([route_slot_values(req.routes[start + 1 : len(frames) + 1]),
                                 np.zeros((1, K, 3), np.float32)])
        actions, routes = torch.from_numpy(actions).reshape(1, -1, 3), torch.from_numpy(routes).reshape(1, -1, 3)
        new: list[int] = []
        for _ in range(P):
            codes = np.concatenate([np.stack([frames[i] for i in window]).reshape(-1), new]).astype(np.int64)
            padded = np.concatenate([codes, np.zeros(P - len(new), np.int64)])  # whole frames; the tail is unused
            logits = model(input_ids=torch.from_numpy(padded)[None], actions=actions, routes=routes).logits[0]
            new.append(int(logits[(len(window) - 1) * S + P + A + K - 1 + len(new), :512].argmax()))
        frames.append(np.array(new))
    return np.stack(frames[len(req.context) :])


def test_cached_decoding_feeds_route_slots_as_a_full_recomputation(backend):
    req = request(1, num_frames=5)  # 2 + 5 frames in windows of 6: one rollover
    got = backend.generate([req], GREEDY, progress=False)[0]
    np.testing.assert_array_equal(got, full_recomputation(backend.model, req))


@pytest.mark.parametrize("guesses", ["previous", "transitions", "lookahead"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("draft_tokens", [16, 200])
def test_speculative_decoding_is_exact_with_routes(backend, guesses, sampling, draft_tokens):
    requests = [request(2), request(3, num_context=1, num_frames=6)]
    sequential = backend.generate(requests, sampling, progress=False)
    speculative = sampling.replace(decoding="speculative", draft_tokens=draft_tokens, guesses=guesses)
    for got, want in zip(backend.generate(requests, speculative, progress=False), sequential):
        np.testing.assert_array_equal(got, want)


def test_a_requests_routes_are_x_first_so_a_straight_road_reaches_the_slots_straight_ahead(backend, monkeypatch):
    """``RolloutRequest(routes=)`` rows are ``[x, y, s]`` (x forward, y left); the model's route slots hold ``[y, x,
    s]``: a road straight ahead reaches them as y = 0, x = s, not as a road 10 to 80 m to the car's left."""
    fed = []
    forward = backend.model.forward

    def recording(*args, conditions=None, **kwargs):
        if conditions is not None:
            fed.append(conditions.reshape(len(conditions), -1, A + K, 3)[:, :, A:].float().numpy())
        return forward(*args, conditions=conditions, **kwargs)

    monkeypatch.setattr(backend.model, "forward", recording)
    straight = request(1)
    s = straight.routes[0, :, 2]
    straight.routes = np.broadcast_to(np.stack([s, np.zeros_like(s), s], -1), straight.routes.shape).copy()
    backend.generate([straight], GREEDY, progress=False)
    slots = np.concatenate([f.reshape(-1, K, 3) for f in fed])
    told = slots[np.isfinite(slots).all(axis=(1, 2))]
    assert len(fed) > 1 and len(told) >= straight.num_frames
    np.testing.assert_array_equal(told, np.broadcast_to(np.stack([np.zeros_like(s), s, s], -1), told.shape))


def test_the_route_changes_the_frames_and_only_its_own(backend):
    with_route, other, without = request(4), request(4), request(4, routes=False)
    other.routes = other.routes.copy()
    other.routes[3:] = routes_from_xy(np.random.default_rng(9).normal(0, 30, (len(other.routes) - 3, K, 2)))
    together = backend.generate([with_route, other, without], GREEDY, progress=False)
    alone = backend.generate([with_route], GREEDY, progress=False)[0]
    np.testing.assert_array_equal(together[0], alone)  # batch-mates with other routes do not matter
    np.testing.assert_array_equal(together[0][:1], together[1][:1])  # frame 2 is drawn at route 2: unchanged
    # frames drawn at other routes differ (in this random model mostly the frame's first code, the one the route
    # slots precede), and "no route" is not a route
    assert (together[0][1:] != together[1][1:]).any() and (together[0] != together[2]).any()
