"""The token layout of a Terra window and the plan of windows for long rollouts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from terra.core.errors import TerraInputError

DEFAULT_OVERLAP = 3  # frames carried into the next window (Terra: 3): a later window's context


@dataclass(frozen=True)
class TokenLayout:
    """Sizes that fix where every token of a window sits."""

    image_tokens: int  # P: image tokens per frame (Terra: 576)
    action_tokens: int  # A: action slots per frame (Terra: 6)
    max_frames: int  # frames per window (Terra: 25)
    codebook_size: int  # image codes are [0, codebook_size)
    slot_token_id: int  # placeholder id of every slot (action or route), >= codebook_size, < vocab_size
    action_dim: int = 3
    route_tokens: int = 0  # K: route slots per frame, after its action slots (Terra: 0)

    @classmethod
    def from_config(cls, config) -> "TokenLayout":
        """Read the layout from a :class:`LlamaActionConfig`."""
        return cls(
            image_tokens=config.num_image_patches,
            action_tokens=config.num_action_tokens,
            max_frames=config.num_temporal_embeddings,
            codebook_size=config.codebook_size,
            slot_token_id=config.action_token_id,  # the config's key, as checkpoints store it
            action_dim=config.action_dim,
            route_tokens=config.num_route_tokens,
        )

    @property
    def route_model(self) -> bool:
        """Whether the model takes a route: it has route slots (K > 0; Terra's layout has none)."""
        return self.route_tokens > 0

    @property
    def slot_tokens(self) -> int:
        """Placeholder slots of a frame: its action slots, then its route slots."""
        return self.action_tokens + self.route_tokens

    @property
    def frame_span(self) -> int:
        """S: positions one frame occupies (image tokens + its slots)."""
        return self.image_tokens + self.slot_tokens

    @property
    def window_positions(self) -> int:
        """Positions of a full window; the last frame's slots are never filled."""
        return self.max_frames * self.frame_span - self.slot_tokens

    def prompt_ids(self, frame_codes: np.ndarray) -> list[int]:
        """Token ids for complete frames: each frame's image codes followed by its slots' placeholders."""
        codes = np.asarray(frame_codes).reshape(len(frame_codes), -1)
        if codes.shape[1] != self.image_tokens:
            raise TerraInputError(
                f"frame codes have {codes.shape[1]} tokens per frame but the world model expects "
                f"{self.image_tokens}; use a tokenizer whose grid matches num_image_patches"
            )
        ids = np.full((len(codes), self.frame_span), self.slot_token_id, dtype=np.int64)
        ids[:, : self.image_tokens] = codes
        return ids.reshape(-1).tolist()

    def validate_codes(self, codes: np.ndarray, what: str = "codes") -> None:
        """Raise if any code lies outside the image codebook."""
        codes = np.asarray(codes)
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise TerraInputError(
                f"{what} hold ids in [{codes.min()}, {codes.max()}] but the image codebook is "
                f"[0, {self.codebook_size}); encode the frames with the tokenizer that matches the world model"
            )


@dataclass(frozen=True)
class Window:
    """One window of a rollout: absolute frames ``[start, start + num_context + num_new)``."""

    start: int  # absolute index of the window's first frame
    num_context: int  # frames given as tokens (initial context or overlap from the previous window)
    num_new: int  # frames generated in this window

    @property
    def end(self) -> int:
        return self.start + self.num_context + self.num_new


def check_window(window: int, num_context: int, overlap: int | None = None,
                 overlap_name: str = "model.overlap") -> None:
    """Raise, naming the setting, when ``num_context`` (or ``overlap``) leaves no room to generate in a ``window`` of
    frames."""
    if num_context >= window:
        raise TerraInputError(f"num_context={num_context} does not fit a window of {window} frames; "
                              f"use at most {window - 1}")
    if overlap is not None and overlap >= window:
        raise TerraInputError(f"{overlap_name}={overlap} does not fit a window of {window} frames; "
                              f"use at most {window - 1} (Terra: 3)")


def plan_windows(num_context: int, num_generate: int, max_frames: int, overlap: int) -> list[Window]:
    """Split a rollout of ``num_context`` given + ``num_generate`` new frames into windows."""
    if num_context < 1:
        raise TerraInputError("a rollout needs at least one context frame; pass one or more context images")
    if num_context >= max_frames:
        raise TerraInputError(
            f"{num_context} context frames leave no room in a window of {max_frames} frames; "
            f"pass at most {max_frames - 1} context frames"
        )
    if num_generate < 1:
        raise TerraInputError(f"num_frames must be at least 1 (got {num_generate})")
    if not 1 <= overlap < max_frames:
        raise TerraInputError(f"window overlap must be in [1, {max_frames - 1}] (got {overlap})")
    windows = [Window(0, num_context, min(num_generate, max_frames - num_context))]
    remaining = num_generate - windows[0].num_new
    while remaining > 0:
        start = windows[-1].end - overlap
        new = min(remaining, max_frames - overlap)
        windows.append(Window(start, overlap, new))
        remaining -= new
    return windows
