"""Where speculative decoding's guesses past a pass come from (``sampling.guesses``): one guess per image position
of the frame, made once when the frame starts, and for ``transitions`` a memory of the frame's own passes.

terra/generation/speculative.py verifies the guesses; whatever they are, the committed codes are sequential
decoding's, so a source decides only how many passes a frame takes. The sources (scripts/benchmark_guesses.py
measures them):

* ``previous``: the code of the same position in the previous frame.
* ``warp``: the previous frame warped by the ego motion the frame's action implies, through the front camera
  (terra/sim/camera.py): each position takes the code of the previous frame's position its ground point (below
  the horizon) or its bearing (above) came from. On the token grid that is a per-position source index.
* ``transitions``: ``previous``, and each refilled guess replaced by the draw an earlier pass of the frame made at
  that position after the same token (:class:`Transitions`): where a pass corrected the token before a position,
  the draw made after that very token is a better guess than one made after the old one.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from terra.generation.actions import FRAME_RATE_HZ
from terra.sim.camera import FrontCamera

CAMERA_ASPECT = 16 / 9  # the frames' width over height (terra/sim/camera.py renders and Terra's clips are 16:9)
MEMORY_SLOTS = 4  # per position: the most recent distinct tokens before it whose draws Transitions keeps


def frame_grid(image_tokens: int) -> tuple[int, int]:
    """The token grid ``(rows, columns)`` of a frame of ``image_tokens`` codes: the factorisation nearest the
    camera's aspect (144: 9 x 16, Terra's 576: 18 x 32)."""
    pairs = [(r, image_tokens // r) for r in range(1, image_tokens + 1) if image_tokens % r == 0]
    return min(pairs, key=lambda rc: abs(math.log(rc[1] / rc[0] / CAMERA_ASPECT)))


def frame_motion(action: np.ndarray) -> tuple[float, float, float]:
    """The ego motion over one frame ``(forward m, left m, yaw rad)`` that an action ``[6, 3]`` (points ``[y, x,
    time]`` of the path ahead, terra/generation/actions.py) implies: the path to its first point taken as a
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
    ground = rays.fwd > 0
    # A ground point in this frame's ego frame, seen from the previous frame's: rotate by yaw, add the motion.
    fwd_before = cos * rays.fwd - sin * rays.left + forward
    left_before = sin * rays.fwd + cos * rays.left + left
    u_ground, v_ground, depth = camera.project(fwd_before, left_before, np.zeros_like(fwd_before))
    # A direction this frame sees at ``atan(across)`` right of the axis was ``yaw`` further right before.
    right_before = np.clip(np.arctan(rays.across) - yaw, -1.5, 1.5)
    u_sky = np.broadcast_to(camera.cx + camera.focal * np.tan(right_before), (rows, columns))
    v_sky = np.broadcast_to((np.arange(rows) + 0.5)[:, None], (rows, columns))
    on_ground = ground & (depth > 0)
    u = np.where(on_ground, u_ground, u_sky)
    v = np.where(on_ground, v_ground, v_sky)
    row = np.clip(np.floor(v), 0, rows - 1).astype(np.int64)
    column = np.clip(np.floor(u), 0, columns - 1).astype(np.int64)
    return (row * columns + column).reshape(-1)


def first_guesses(source: str, previous: np.ndarray, action: np.ndarray) -> np.ndarray:
    """The guesses ``[P]`` for a frame whose previous frame's codes are ``previous [P]`` and whose conditioning
    action (the previous frame's) is ``action [6, 3]``."""
    if source != "warp":
        return previous
    rows, columns = frame_grid(len(previous))
    return previous[warp_index(rows, columns, frame_motion(action))]


class Transitions:
    """Per position of a frame, the token each pass drew there after a given token before it (the last
    :data:`MEMORY_SLOTS` distinct ones): :meth:`recall` turns a refilled guess into the draw made after the token
    the next pass will feed before it, where some pass fed that token."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.before = torch.full((size, MEMORY_SLOTS), -1, dtype=torch.long, device=device)
        self.drawn = torch.full((size, MEMORY_SLOTS), -1, dtype=torch.long, device=device)
        self.next_slot = torch.zeros(size, dtype=torch.long, device=device)

    def record(self, positions: torch.Tensor, before: torch.Tensor, drawn: torch.Tensor) -> None:
        """A pass drew ``drawn [n]`` at ``positions [n]`` after ``before [n]`` (distinct positions)."""
        same = self.before[positions] == before[:, None]
        known = same.any(dim=1)
        slot = torch.where(known, same.to(torch.int8).argmax(dim=1), self.next_slot[positions])
        self.before[positions, slot] = before
        self.drawn[positions, slot] = drawn
        self.next_slot[positions] = torch.where(known, self.next_slot[positions],
                                                (self.next_slot[positions] + 1) % MEMORY_SLOTS)

    def recall(self, positions: torch.Tensor, before: torch.Tensor, guesses: torch.Tensor) -> torch.Tensor:
        """``guesses [n]`` for ``positions [n]``, each replaced by the draw made there after ``before [n]`` where
        one was."""
        same = self.before[positions] == before[:, None]
        drawn = self.drawn[positions].gather(1, same.to(torch.int8).argmax(dim=1, keepdim=True))[:, 0]
        return torch.where(same.any(dim=1), drawn, guesses)
