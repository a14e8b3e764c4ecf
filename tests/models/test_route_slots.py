"""Route slots (docs/ARCHITECTURE.md, "Routes"): the layout with K route slots after each frame's action slots, the
embedding rule written out independently, the three input styles giving one set of logits, "no route", and a
model without route slots keeping Terra's layout exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache
from tests.conftest import TINY, TINY_ROUTES, tiny_model, tiny_route_model

from terra.core.errors import TerraInputError
from terra.contract.layout import TokenLayout
from terra.generation.rollout import RolloutRequest, RolloutState
from terra.contract.routes import no_route, route_slot_values, routes_from_xy
from terra.models import LlamaActionConfig

P, A, K, WINDOW = 64, 6, TINY_ROUTES, 6
S = P + A + K
PLACEHOLDER = 512


def route_frames(frames: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes ``[frames, P]``, actions ``[frames - 1, A, 3]`` and per-frame routes ``[frames, K, 3]``."""
    rng = np.random.default_rng(seed)
    routes = routes_from_xy(rng.normal(0, 5, (frames, K, 2)))
    return rng.integers(0, 512, (frames, P)), rng.normal(size=(frames - 1, A, 3)).astype(np.float32), routes


def layout() -> TokenLayout:
    return TokenLayout(image_tokens=P, action_tokens=A, max_frames=WINDOW, codebook_size=512, slot_token_id=512,
                       route_tokens=K)


def test_route_layout_positions():
    lay = layout()
    assert lay.slot_tokens == A + K and lay.frame_span == S and lay.window_positions == WINDOW * S - A - K
    codes = np.arange(2 * P).reshape(2, P) % 512
    ids = lay.prompt_ids(codes)
    assert ids == codes[0].tolist() + [PLACEHOLDER] * (A + K) + codes[1].tolist() + [PLACEHOLDER] * (A + K)


def test_config_counts_route_slots_in_the_frame():
    with pytest.raises(Exception, match="num_route_tokens"):
        LlamaActionConfig(**{**TINY, "num_route_tokens": 4})  # num_spatio_embeddings still P + A
    with pytest.raises(Exception, match="action_dim 3"):
        LlamaActionConfig(**{**TINY, "num_route_tokens": 4, "num_spatio_embeddings": 74, "action_dim": 2,
                             "max_position_embeddings": 444})


def test_a_model_without_route_slots_has_terra_tensors_only():
    names = set(tiny_model().state_dict())
    assert not any("route" in name for name in names)
    route_names = set(tiny_route_model().state_dict()) - names
    assert route_names == {"route_projection.weight", "route_projection.bias", "no_route_embedding"}


@torch.no_grad()
def reference_embeddings(model, codes: np.ndarray, actions: np.ndarray, routes: np.ndarray | None) -> torch.Tensor:
    """Input embeddings of whole frames written out position by position (frame t's route slots hold route t + 1 as
    ``[y, x, s]``, NaN or absent: the "no route" row of the slot)."""
    rows = []
    for t, frame in enumerate(codes):
        for p in range(S):
            position = t * S + p
            if p < P:
                e = model.model.embed_tokens.weight[int(frame[p])]
            elif p < P + A:
                e = model.action_projection(torch.from_numpy(actions[t, p - P]))
            else:
                k = p - P - A
                point = None if routes is None or t + 1 >= len(routes) else routes[t + 1, k]
                if point is None or np.isnan(point).any():
                    e = model.no_route_embedding[k]
                else:
                    e = model.route_projection(torch.from_numpy(point[[1, 0, 2]]))
            table = model.pos_embedding_spatio_temporal
            rows.append(e + table.spatio_embeddings.weight[position % S] + table.temporal_embeddings.weight[t])
    return torch.stack(rows)


@torch.no_grad()
@pytest.mark.parametrize("with_route", [True, False])
def test_embeddings_follow_the_route_slot_rule(with_route):
    model = tiny_route_model()
    codes, actions, routes = route_frames(3, seed=1)
    routes = routes if with_route else None
    state = RolloutState(RolloutRequest(codes[:2], np.concatenate([actions, actions[:1]]), 1, routes=routes),
                         layout())
    state.add_frame(codes[2])
    ids, conditions, positions = state.prompt()
    got = model.embed(torch.tensor([ids]), torch.from_numpy(conditions).reshape(1, -1, 3),
                      torch.from_numpy(positions)[None])[0]
    full_actions = np.concatenate([actions, actions[:1]])
    torch.testing.assert_close(got, reference_embeddings(model, codes, full_actions, routes))


@torch.no_grad()
def test_training_interleaved_and_incremental_calls_agree():
    model = tiny_route_model()
    codes, actions, routes = route_frames(3, seed=2)
    actions = np.concatenate([actions, actions[:1]])
    slot_routes = np.concatenate([routes[1:], no_route(1, K)])  # frame t's route slots: route t + 1
    training = model(input_ids=torch.from_numpy(codes).reshape(1, -1),
                     actions=torch.from_numpy(actions).reshape(1, -1, 3),
                     routes=torch.from_numpy(slot_routes).reshape(1, -1, 3)).logits[0]
    ids, conditions = model.interleave(torch.from_numpy(codes).reshape(1, -1), torch.from_numpy(actions)[None],
                                       torch.from_numpy(slot_routes)[None])
    positions = torch.arange(ids.shape[1])[None]
    interleaved = model(input_ids=ids, conditions=conditions, position_ids=positions).logits[0]
    torch.testing.assert_close(interleaved, training)
    # one token at a time through the KV cache: slot runs split anywhere
    cache, pieces, used = DynamicCache(), [], 0
    flat = conditions.reshape(-1, 3)
    for start in range(0, ids.shape[1], 5):
        piece = ids[:, start : start + 5]
        n = int((piece == PLACEHOLDER).sum())
        out = model(input_ids=piece, conditions=flat[None, used : used + n] if n else None,
                    position_ids=positions[:, start : start + 5], cache=cache, use_cache=True)
        used += n
        pieces.append(out.logits[0])
    torch.testing.assert_close(torch.cat(pieces), training, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_a_route_changes_only_the_frames_after_its_slots():
    model = tiny_route_model()
    codes, actions, routes = route_frames(3, seed=3)
    actions = torch.from_numpy(np.concatenate([actions, actions[:1]]))[None]
    ids = torch.from_numpy(codes).reshape(1, -1)

    def logits(slot_routes):
        return model(input_ids=ids, actions=actions, routes=torch.from_numpy(slot_routes)[None]).logits[0]

    base = np.concatenate([routes[1:], no_route(1, K)])
    bent = base.copy()
    bent[1, :, 0] += 3.0  # frame 1's route slots (the road ahead of frame 2)
    a, b = logits(base), logits(bent)
    first_changed = S + P + A  # the first route slot of frame 1
    torch.testing.assert_close(a[:first_changed], b[:first_changed])
    assert (a[first_changed:] - b[first_changed:]).abs().max() > 1e-3
    # no route: NaN rows and routes=None are the same thing, and differ from a route
    none = model(input_ids=ids, actions=actions).logits[0]
    torch.testing.assert_close(logits(no_route(3, K)), none)
    assert (none[P + A :] - a[P + A :]).abs().max() > 1e-3


def test_rollout_state_carries_routes_shifted_by_one_frame():
    codes, actions, routes = route_frames(4, seed=4)  # 2 context + 2 new frames: 3 actions, 4 routes
    state = RolloutState(RolloutRequest(codes[:2], actions, 2, routes=routes), layout())
    np.testing.assert_array_equal(state.conditions[:, :A], actions)
    slots = route_slot_values(routes)  # [y, x, s]
    np.testing.assert_array_equal(state.conditions[:, A:], slots[1:])
    twin = state.copy()
    twin.set_next_routes([routes[0]])  # the next frame (2) is drawn where route 0 was: frame 1's slots hold it
    twin.set_next_actions(np.ones((1, A, 3), np.float32))
    np.testing.assert_array_equal(twin.route_slots[1], slots[0])
    np.testing.assert_array_equal(twin.route_slots[2], slots[0])  # the frame after: the same, until set (guesses)
    np.testing.assert_array_equal(state.conditions[:, A:], slots[1:])  # the copy is independent
    np.testing.assert_array_equal(state.actions, actions)
    twin.set_next_routes([None])
    assert np.isnan(twin.route_slots[1]).all()
    assert np.isnan(RolloutState(RolloutRequest(codes[:2], actions, 2), layout()).route_slots).all()


def test_routes_that_do_not_fit_are_refused():
    codes, actions, routes = route_frames(3, seed=5)
    with pytest.raises(TerraInputError, match="no route slots"):
        RolloutState(RolloutRequest(codes[:2], actions, 1, routes=routes),
                     TokenLayout(image_tokens=P, action_tokens=A, max_frames=WINDOW, codebook_size=512,
                                 slot_token_id=512))
    with pytest.raises(TerraInputError, match="routes: covers 2 frames but the rollout needs routes for 3"):
        RolloutState(RolloutRequest(codes[:2], actions, 1, routes=routes[:2]), layout())
    RolloutState(RolloutRequest(codes[:2], actions, 1, routes=routes), layout())  # one route a frame: enough
    with pytest.raises(TerraInputError, match=r"shape \[frames, 4, 3\]"):
        RolloutState(RolloutRequest(codes[:2], actions, 1, routes=routes[:, :2]), layout())
