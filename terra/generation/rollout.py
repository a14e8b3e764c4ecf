"""What a rollout is, how its windows advance, and the interface every generation backend implements.

A :class:`RolloutRequest` holds context frame codes, actions and the number of frames to generate. A
:class:`RolloutState` walks it through its windows (docs/ARCHITECTURE.md, "Token layout" and "Windows"): it says which frames and actions form
the current window's prompt and records each generated frame. Backends (Transformers, vLLM) implement
:class:`WorldModelBackend` on top of it, so they agree on layout and windowing by construction and the
pipeline never needs to know which one it holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from terra.actions import validate_actions
from terra.errors import TerraInputError
from terra.generation.layout import TokenLayout, Window, plan_windows
from terra.generation.sampling import SamplingConfig

DEFAULT_OVERLAP = 3  # frames carried into the next window (Terra: 3)


@dataclass
class RolloutRequest:
    """One rollout: generate ``num_frames`` frames after ``context`` under ``actions``.

    ``context`` is ``[n_ctx, h, w]`` or ``[n_ctx, P]`` image codes. ``actions[t]`` (``[6, 3]``) conditions
    frame ``t + 1``, counting context frames first, so ``actions`` needs ``n_ctx + num_frames - 1`` rows
    (more are ignored). ``seed`` makes sampling reproducible per rollout, independent of batching.
    """

    context: np.ndarray
    actions: np.ndarray
    num_frames: int
    seed: int | None = None
    overlap: int = DEFAULT_OVERLAP


class RolloutState:
    """Progress of one rollout through its windows."""

    def __init__(self, request: RolloutRequest, layout: TokenLayout) -> None:
        context = np.asarray(request.context, dtype=np.int64).reshape(len(request.context), -1)
        if context.shape[1] != layout.image_tokens:
            raise TerraInputError(
                f"context frames have {context.shape[1]} codes each but the world model expects "
                f"{layout.image_tokens}; use the tokenizer that matches the world model"
            )
        layout.validate_codes(context, "context codes")
        self.windows: list[Window] = plan_windows(len(context), request.num_frames, layout.max_frames, request.overlap)
        self.actions = validate_actions(request.actions, "actions", len(context) + request.num_frames - 1)
        self.layout = layout
        self.request = request
        self.frames: list[np.ndarray] = list(context)
        self.num_context = len(context)
        self.window_index = 0

    @property
    def window(self) -> Window:
        return self.windows[self.window_index]

    @property
    def finished(self) -> bool:
        return len(self.frames) >= self.num_context + self.request.num_frames

    @property
    def next_frame(self) -> int:
        """Absolute index of the frame to generate next."""
        return len(self.frames)

    @property
    def window_starts(self) -> bool:
        """True when the next frame is the first one generated in the current window (a fresh prompt)."""
        return self.next_frame == self.window.start + self.window.num_context

    def prompt(self) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Prompt for the next frame: ids, actions ``[n, A, 3]`` of the window's frames so far, positions.

        The ids cover every frame of the current window up to the next one, each followed by its action
        slots; positions restart at 0 in each window.
        """
        start = self.window.start
        frames = np.stack(self.frames[start:])
        ids = self.layout.prompt_ids(frames)
        return ids, self.actions[start : start + len(frames)], np.arange(len(ids))

    def add_frame(self, codes: np.ndarray) -> None:
        """Record a generated frame ``[P]`` and move to the next window when this one is complete."""
        codes = np.asarray(codes, dtype=np.int64).reshape(-1)
        if codes.shape != (self.layout.image_tokens,):
            raise ValueError(f"a generated frame must have {self.layout.image_tokens} codes, got {codes.shape}")
        self.frames.append(codes)
        if len(self.frames) == self.window.end and self.window_index + 1 < len(self.windows):
            self.window_index += 1

    def generated(self) -> np.ndarray:
        """The generated frames ``[num_frames, P]`` (context excluded, overlap frames once)."""
        return np.stack(self.frames[self.num_context :])


FrameCallback = Callable[[int, int, np.ndarray], None]
"""``on_frame(request_index, frame_index, codes)``: called as soon as a frame is generated."""


class WorldModelBackend(ABC):
    """A world model that generates rollouts; implemented by the Transformers and vLLM backends."""

    layout: TokenLayout

    @abstractmethod
    def generate(
        self,
        requests: Sequence[RolloutRequest],
        sampling: SamplingConfig,
        progress: bool = True,
        on_frame: FrameCallback | None = None,
    ) -> list[np.ndarray]:
        """Run every request to completion; return each one's generated codes ``[num_frames, P]`` in order."""

    def close(self) -> None:
        """Release the engine and its memory; the backend is unusable afterwards."""

    def __enter__(self) -> "WorldModelBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
