"""Experimental first guesses for speculative decoding, measured by scripts/bench/benchmark_guesses.py beside the ones
``sampling.guesses`` names: the previous frame warped by the ego motion (through the synthetic world's front
camera, terra/sim/camera.py) and an oracle that knows a share of each frame's true codes (a ceiling for any source
of first guesses). They replace, for the Transformers backend, the previous frame's codes that a speculative
frame starts from (terra/generation/speculative.py)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch

from terra.contract.actions import FRAME_RATE_HZ
from terra.generation import speculative
from terra.generation.rollout import RolloutState
from terra.sim.camera import FrontCamera

CAMERA_ASPECT = 16 / 9  # the frames' width over height (the synthetic world's and Terra's clips)


@contextmanager
def first_guesses(guess: Callable[[RolloutState], np.ndarray]) -> Iterator[None]:
    """Every speculative frame the Transformers backend starts takes ``guess(state)`` ``[P]`` as its guesses past
    a pass (``state``: the rollout, its next frame not yet generated)."""
    original = speculative.SpeculativeRows.add

    def add(rows: speculative.SpeculativeRows, state: RolloutState, sampling) -> None:
        original(rows, state, sampling)
        frame = rows._frames[-1].frame
        frame.later = torch.as_tensor(guess(state), device=frame.later.device)
        frame.guesses = frame._later(0, frame.draft_tokens).clone()  # refilled in place

    speculative.SpeculativeRows.add = add
    try:
        yield
    finally:
        speculative.SpeculativeRows.add = original


def warped(state: RolloutState) -> np.ndarray:
    """The previous frame's codes moved by the ego motion its action implies (:func:`warp_index`)."""
    previous = state.frames[-1]
    rows, columns = frame_grid(len(previous))
    return previous[warp_index(rows, columns, frame_motion(state.actions[state.next_frame - 1]))]


def oracle(truth: dict[int, np.ndarray], share: float) -> Callable[[RolloutState], np.ndarray]:
    """Guesses that are the frame's true codes (``truth[id(request)]``: a rollout's generated frames from
    sequential decoding) at a random ``share`` of positions, the previous frame's codes elsewhere."""
    def guess(state: RolloutState) -> np.ndarray:
        previous = state.frames[-1]
        true = truth[id(state.request)][state.next_frame - state.num_context]
        rng = np.random.default_rng([state.seed, state.next_frame])
        return np.where(rng.random(len(previous)) < share, true, previous)
    return guess


def frame_grid(image_tokens: int) -> tuple[int, int]:
    """The token grid ``(rows, columns)`` of a frame of ``image_tokens`` codes: the factorisation nearest the
    camera's aspect (144: 9 x 16, Terra's 576: 18 x 32)."""
    pairs = [(r, image_tokens // r) for r in range(1, image_tokens + 1) if image_tokens % r == 0]
    return min(pairs, key=lambda rc: abs(math.log(rc[1] / rc[0] / CAMERA_ASPECT)))


def frame_motion(action: np.ndarray) -> tuple[float, float, float]:
    """The ego motion over one frame ``(forward m, left m, yaw rad)`` that an action ``[6, 3]`` (points ``[y, x,
    time]`` of the path ahead, terra/contract/actions.py) implies: the path to its first point taken as a
    circular arc (its heading change twice the chord's bearing), scaled to one frame's time."""
    left, forward, seconds = (float(v) for v in action[0])
    share = 1.0 / FRAME_RATE_HZ / max(seconds, 1e-3)
    yaw = 2.0 * math.atan2(left, forward) * share if abs(forward) + abs(left) > 1e-6 else 0.0
    step = math.hypot(forward, left) * share
    return step * math.cos(yaw / 2), step * math.sin(yaw / 2), yaw


def warp_index(rows: int, columns: int, motion: tuple[float, float, float]) -> np.ndarray:
    """For each position of a ``rows x columns`` token grid, the previous frame's position it came from ``[P]``
    after the ego ``motion`` (:func:`frame_motion`): ground cells through the road plane, the rest by yaw alone."""
    camera = FrontCamera(rows, columns)  # in token units: a pinhole scales with the image
    rays = camera.rays()
    forward, left, yaw = motion
    cos, sin = math.cos(yaw), math.sin(yaw)
    # A ground point in this frame's ego frame, seen from the previous frame's: rotate by yaw, add the motion.
    fwd_before = cos * rays.fwd - sin * rays.left + forward
    left_before = sin * rays.fwd + cos * rays.left + left
    u_ground, v_ground, depth = camera.project(fwd_before, left_before, np.zeros_like(fwd_before))
    # A direction this frame sees at ``atan(across)`` right of the axis was ``yaw`` further right before.
    right_before = np.clip(np.arctan(rays.across) - yaw, -1.5, 1.5)
    u_sky = np.broadcast_to(camera.cx + camera.focal * np.tan(right_before), (rows, columns))
    v_sky = np.broadcast_to((np.arange(rows) + 0.5)[:, None], (rows, columns))
    on_ground = (rays.fwd > 0) & (depth > 0)
    u = np.where(on_ground, u_ground, u_sky)
    v = np.where(on_ground, v_ground, v_sky)
    row = np.clip(np.floor(v), 0, rows - 1).astype(np.int64)
    column = np.clip(np.floor(u), 0, columns - 1).astype(np.int64)
    return (row * columns + column).reshape(-1)
