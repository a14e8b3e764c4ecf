"""What a rollout is, how its windows advance, and the interface every generation backend implements."""

from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from terra.config.sampling import SamplingConfig
from terra.contract.actions import NUM_ACTION_TOKENS, RULE
from terra.contract.layout import DEFAULT_OVERLAP, TokenLayout, Window, plan_windows
from terra.contract.routes import ROUTE_POINT_VALUES, check_route_shape, no_route, route_slot_values, slot_routes
from terra.core.errors import TerraInputError
from terra.core.progress import Progress
from terra.generation.pass_stats import PassStats

log = logging.getLogger("terra.generation")


@dataclass
class RolloutRequest:
    """One rollout: generate ``num_frames`` frames after ``context`` under ``actions`` (and ``routes``).

    Args:
        context: ``[n_ctx, h, w]`` or ``[n_ctx, P]`` image codes.
        actions: ``[>= n_ctx + num_frames - 1, 6, 3]``; ``actions[t]`` conditions frame ``t + 1``.
        routes: ``[>= n_ctx + num_frames, K, 3]`` ``[x, y, s]`` in each frame's ego frame (x forward, y left),
            the lane ahead of its pose; None: no route.
        seed: makes sampling reproducible per rollout, independent of batching.
    """

    context: np.ndarray
    actions: np.ndarray
    num_frames: int
    seed: int | None = None
    overlap: int = DEFAULT_OVERLAP
    routes: np.ndarray | None = None


def _sized_actions(actions: np.ndarray, needed: int) -> np.ndarray:
    """``actions`` as float32 if shaped ``[>= needed, 6, 3]`` (a shape check only)."""
    arr = np.asarray(actions, dtype=np.float32)
    if arr.ndim != 3 or arr.shape[1:] != (NUM_ACTION_TOKENS, 3):
        raise TerraInputError(f"actions must have shape [frames, {NUM_ACTION_TOKENS}, 3], got {list(arr.shape)}")
    if len(arr) < needed:
        raise TerraInputError(f"actions cover {len(arr)} frames but the rollout needs actions for {needed} ({RULE}); "
                              "give a longer trajectory or generate fewer frames")
    return arr


def _slot_routes(routes: np.ndarray | None, rows: int, needed: int, route_tokens: int) -> np.ndarray:
    """The route slots' values ``[rows, K, 3]`` of ``routes`` ``[>= needed, K, 3]`` ``[x, y, s]`` (None: no route)."""
    if routes is None:
        return no_route(rows, route_tokens)
    arr = np.asarray(routes, dtype=np.float32)
    check_route_shape(arr.shape, route_tokens, "the rollout's routes", needed, (ROUTE_POINT_VALUES,))
    return slot_routes(arr, rows)


class RolloutState:
    """Progress of one rollout through its windows."""

    def __init__(self, request: RolloutRequest, layout: TokenLayout, seed: int | None = None) -> None:
        context = np.asarray(request.context, dtype=np.int64).reshape(len(request.context), -1)
        if context.shape[1] != layout.image_tokens:
            raise TerraInputError(
                f"context frames have {context.shape[1]} codes each but the world model expects "
                f"{layout.image_tokens}; use the tokenizer that matches the world model"
            )
        layout.validate_codes(context, "context codes")
        self.windows: list[Window] = plan_windows(len(context), request.num_frames, layout.max_frames, request.overlap)
        needed = len(context) + request.num_frames - 1
        actions = _sized_actions(request.actions, needed)
        routes = _slot_routes(request.routes, len(actions), needed + 1, layout.route_tokens)
        # each frame's slot values, [frames, A + K, 3]: its action points, then its route points; actions and
        # routes are views of it, so the backends read one array (``conditions``) whatever the model's slots
        self.conditions = np.concatenate([actions, routes], axis=1)
        self.layout = layout
        self.actions, self.route_slots = self._views()
        self.request = request
        self.frames: list[np.ndarray] = list(context)
        self.num_context = len(context)
        self.window_index = 0
        self.seed = request.seed if seed is None else seed
        self.cache: Any = None
        self.passes: list[int] = []  # forward passes that produced each generated frame

    def _views(self) -> tuple[np.ndarray, np.ndarray]:
        """``actions`` ``[T, A, 3]`` and ``route_slots`` ``[T, K, 3]`` (``[y, x, s]``): views of :attr:`conditions`."""
        return self.conditions[:, : self.layout.action_tokens], self.conditions[:, self.layout.action_tokens :]

    @property
    def window(self) -> Window:
        return self.windows[self.window_index]

    @property
    def finished(self) -> bool:
        return len(self.frames) >= self.num_context + self.request.num_frames

    @property
    def num_generated(self) -> int:
        """Frames generated so far (context excluded)."""
        return len(self.frames) - self.num_context

    @property
    def next_frame(self) -> int:
        """Absolute index of the frame to generate next."""
        return len(self.frames)

    @property
    def window_starts(self) -> bool:
        """True when the next frame is the first one generated in the current window (a fresh prompt)."""
        return self.next_frame == self.window.start + self.window.num_context

    def prompt(self) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Prompt for the next frame: ids, slot values ``[n, A + K, 3]`` of the window's frames so far, positions."""
        start = self.window.start
        frames = np.stack(self.frames[start:])
        ids = self.layout.prompt_ids(frames)
        return ids, self.conditions[start : start + len(frames)], np.arange(len(ids))

    def add_frame(self, codes: np.ndarray, passes: int | None = None) -> None:
        """Record a generated frame ``[P]`` that took ``passes`` forward passes (None: one per token, as sequential
        decoding does) and move to the next window when this one is complete."""
        codes = np.asarray(codes, dtype=np.int64).reshape(-1)
        if codes.shape != (self.layout.image_tokens,):
            raise ValueError(f"a generated frame must have {self.layout.image_tokens} codes, got {codes.shape}")
        self.frames.append(codes)
        self.passes.append(self.layout.image_tokens if passes is None else passes)
        if len(self.frames) == self.window.end and self.window_index + 1 < len(self.windows):
            self.window_index += 1

    def set_next_actions(self, actions: np.ndarray) -> None:
        """Set the actions ``[n, 6, 3]`` (checked) that condition the next ``n`` frames."""
        self._set_next(self.actions, actions)

    def set_next_routes(self, routes: Sequence[np.ndarray | None]) -> None:
        """Set the routes of the next ``n`` frames (each ``[K, 3]`` ``[x, y, s]`` or None: no route)."""
        none = np.full(self.route_slots.shape[1:], np.nan, dtype=self.route_slots.dtype)
        self._set_next(self.route_slots, route_slot_values([none if route is None else route for route in routes]))

    def _set_next(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` into the rows of ``rows`` (a view of :attr:`conditions`) from the newest frame on; the row
        after them repeats the last, for speculative decoding's first guesses only."""
        start = self.next_frame - 1
        end = min(start + len(values), len(rows))
        rows[start:end] = values[: end - start]
        if end < len(rows):
            rows[end] = values[-1]

    def generated(self) -> np.ndarray:
        """The generated frames ``[num_frames, P]`` (context excluded, overlap frames once)."""
        return np.stack(self.frames[self.num_context :])

    def copy(self) -> "RolloutState":
        """An independent state at the same point (frames shared, they are never changed); ``cache`` not copied."""
        twin = copy.copy(self)
        twin.frames, twin.conditions, twin.cache = list(self.frames), self.conditions.copy(), None
        twin.actions, twin.route_slots = twin._views()
        twin.passes = list(self.passes)
        return twin

    def pass_stats(self) -> PassStats:
        return PassStats(len(self.passes), sum(self.passes), self.layout.image_tokens)


@dataclass
class _Submission:
    """Frames left of a state's submission and of its engine request in flight, and their sampling."""

    frames: int
    in_request: int
    sampling: SamplingConfig


@dataclass
class FrameDone:
    """A frame :meth:`WorldModelBackend.poll` finished; it is already added to ``state``."""

    state: RolloutState
    codes: np.ndarray  # [P]
    prompt_tokens: int  # tokens of the frame's prompt (the window so far)
    cached_tokens: int  # of those, served from a cache instead of being computed
    window_start: bool  # the first frame of a window (a fresh prompt)
    last: bool = True  # the last frame of its submission


FrameCallback = Callable[[int, int, np.ndarray], None]
"""``on_frame(request_index, frame_index, codes)``: called as soon as a frame is generated."""


class WorldModelBackend(ABC):
    """A world model that advances rollouts frame by frame; implemented by the Transformers and vLLM backends."""

    layout: TokenLayout
    _told_no_route = False  # a rollout without a route was announced (:meth:`start`)
    decoding: str = "sequential"  # what sampling.decoding=auto runs as, set when the backend is built

    def as_run(self, sampling: SamplingConfig) -> SamplingConfig:
        """``sampling`` with ``decoding=auto`` replaced by the run's choice (:attr:`decoding`)."""
        return sampling if sampling.decoding != "auto" else sampling.replace(decoding=self.decoding)

    def capacity(self, window_frames: int) -> int | None:
        """How many rollouts of ``window_frames`` frames the engine holds at once (None: no fixed bound)."""
        return None

    def start(self, request: RolloutRequest, index: int = 0) -> RolloutState:
        """A state for ``request`` (checked against the layout); ``index`` numbers rollouts without a seed."""
        state = RolloutState(request, self.layout, self.default_seed(request, index))
        if self.layout.route_model and request.routes is None and not self._told_no_route:
            self._told_no_route = True
            log.warning("the world model takes a route (%d route slots) but a rollout has none: it runs with the "
                        "learned 'no route' embedding (docs/generate.md, \"Routes\")", self.layout.route_tokens)
        return state

    def default_seed(self, request: RolloutRequest, index: int) -> int | None:
        """The seed of a rollout whose request has none (None: the backend draws one)."""
        return request.seed

    def submit(self, state: RolloutState, sampling: SamplingConfig, frames: int = 1) -> None:
        """Queue the next ``frames`` frames of ``state`` (their actions set; not already queued)."""
        frames = min(frames, state.request.num_frames - state.num_generated)
        self._left[id(state)] = _Submission(frames, self._request(state, sampling, frames), sampling)

    def poll(self) -> list[FrameDone]:
        """Advance the queued frames; return those that finished (added to their states), possibly none."""
        finished = self._poll()
        for done in finished:
            submission = self._left[id(done.state)]
            submission.frames -= 1
            submission.in_request -= 1
            done.last = not submission.frames
            if done.last:
                del self._left[id(done.state)]
            elif not submission.in_request:  # the request ended before the submission: the next window's request
                submission.in_request = self._request(done.state, submission.sampling, submission.frames)
        return finished

    @property
    def _left(self) -> dict[int, "_Submission"]:
        """The queued states' submissions, by state."""
        return self.__dict__.setdefault("_submissions", {})

    @abstractmethod
    def _request(self, state: RolloutState, sampling: SamplingConfig, frames: int) -> int:
        """Start generating up to ``frames`` next frames of ``state`` as one engine request; the frames it covers."""

    @abstractmethod
    def _poll(self) -> list[FrameDone]:
        """Advance the requests; the frames that finished, added to their states."""

    @property
    @abstractmethod
    def num_queued(self) -> int:
        """Requests submitted and not yet finished."""

    def cancel(self, states: Sequence[RolloutState]) -> None:
        """Drop the queued frames of ``states``; their states stay as they were."""
        for state in states:
            self._left.pop(id(state), None)
        self._cancel(states)

    def _cancel(self, states: Sequence[RolloutState]) -> None:
        """Abort the engine requests of ``states``."""

    def fork(self, state: RolloutState) -> RolloutState:
        """A second rollout continuing from ``state``'s point, sharing its past (not while a frame is queued)."""
        return state.copy()

    def release(self, state: RolloutState) -> None:
        """Free what the backend keeps for ``state`` (it is not advanced again)."""
        state.cache = None

    def record(self, done: FrameDone, rollout: int) -> None:
        """Hook for per-frame statistics of :meth:`generate` (``rollout``: index of the request)."""

    def generate(
        self,
        requests: Sequence[RolloutRequest],
        sampling: SamplingConfig,
        progress: bool = True,
        on_frame: FrameCallback | None = None,
    ) -> list[np.ndarray]:
        """Run every request to completion; return each one's generated codes ``[num_frames, P]`` in order."""
        return [s.generated() for s in self.run_rollouts(requests, sampling, progress, on_frame)]

    def run_rollouts(
        self,
        requests: Sequence[RolloutRequest],
        sampling: SamplingConfig,
        progress: bool = True,
        on_frame: FrameCallback | None = None,
    ) -> list[RolloutState]:
        """Run every request to completion; return their finished states in order (codes, forward passes)."""
        sampling = self.as_run(sampling)
        states = [self.start(r, i) for i, r in enumerate(requests)]
        index = {id(s): i for i, s in enumerate(states)}
        total = sum(r.num_frames for r in requests)
        try:
            with Progress(total, f"generating ({self.name})", "frame", enabled=progress) as bar:
                for state in states:
                    self.submit(state, sampling, frames=state.request.num_frames)
                while self.num_queued:
                    for done in self.poll():
                        state = done.state
                        self.record(done, index[id(state)])
                        bar.update(1)
                        if on_frame is not None:
                            on_frame(index[id(state)], state.next_frame - 1 - state.num_context, done.codes)
                        if state.finished:
                            self.release(state)
        except BaseException:
            self.cancel(states)
            raise
        finally:
            for state in states:
                self.release(state)
        return states

    @property
    def name(self) -> str:
        return type(self).__name__

    def close(self) -> None:
        """Release the engine and its memory; the backend is unusable afterwards."""

    def __enter__(self) -> "WorldModelBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
