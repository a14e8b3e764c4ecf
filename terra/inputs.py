"""From what a user gives to what a backend runs: context frames + a trajectory → :class:`RolloutRequest`\\ s.

The CLI, batch rollouts and evaluation all come through here, so a trajectory means the same everywhere
and a bad one fails the same way, before any frame is generated. Frame ``t`` of a trajectory is context
frame ``t``; ``actions[t]`` conditions frame ``t + 1`` (docs/ARCHITECTURE.md, "Actions"), so a rollout of
``num_frames`` after ``num_context`` frames needs ``num_context + num_frames - 1`` actions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from terra.actions import actions_for_manoeuvre, actions_from_value, load_actions, validate_actions
from terra.errors import TerraInputError
from terra.generation.layout import TokenLayout
from terra.generation.rollout import RolloutRequest, RolloutState

TRAJECTORY_KEYS = ("actions", "instruction_trajs", "trajectory", "manoeuvre")


def actions_needed(num_context: int, num_frames: int) -> int:
    """Actions a rollout uses: one per frame after the first, up to the last generated one."""
    return num_context + num_frames - 1


def check_window(window: int, num_context: int, overlap: int | None = None, overlap_name: str = "overlap") -> None:
    """Raise when ``num_context`` (or the window ``overlap``) leaves no room to generate in a ``window``."""
    if num_context >= window:
        raise TerraInputError(f"num_context={num_context} does not fit a window of {window} frames; "
                              f"use at most {window - 1}")
    if overlap is not None and overlap >= window:
        raise TerraInputError(f"{overlap_name}={overlap} does not fit a window of {window} frames; "
                              f"use at most {window - 1} (Terra: 3)")


def resolve_path(path: str | os.PathLike, base: Path) -> str:
    """``path`` with ``~`` expanded; a relative one is taken from ``base``."""
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else base / p)


def load_context(
    sources: str | os.PathLike | Sequence[str], image_size: tuple[int, int], num_context: int | None,
    base: Path | None = None, resize: str = "crop",
) -> tuple[torch.Tensor, list[str]]:
    """The last ``num_context`` frames (None: all) of a folder, glob, video or list of images, resized for the
    tokenizer: images ``[N, 3, H, W]`` in [-1, 1] and the sources read.

    With ``base`` (batch samples), ``sources`` are image paths, relative ones taken from ``base``. ``resize``
    is ``crop`` or ``stretch`` (:func:`tokenizer.images.fit_frame`; the tokenizer's config group says which).
    """
    from tokenizer.images import load_images

    if base is not None:
        items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
        sources = [resolve_path(s, base) for s in items]
    elif isinstance(sources, (str, os.PathLike)):
        sources = str(sources)
    else:
        sources = [str(s) for s in sources]
    images = load_images(sources, image_size, last_n=num_context, resize=resize)
    return images, [sources] if isinstance(sources, str) else sources


def builtin_context(
    manoeuvre: str, num_frames: int, image_size: tuple[int, int], seed: int, params: dict
) -> tuple[torch.Tensor, np.ndarray]:
    """Frames the synthetic world renders driving ``manoeuvre``, in [-1, 1], with their exact actions."""
    from terra.sim import Scene, make_clip

    clip = make_clip(Scene.generate(seed), manoeuvre, num_frames, image_size[0], image_size[1], **params)
    images = torch.from_numpy(clip.frames).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return images, clip.actions


def manoeuvre_actions(name: str, num_context: int, num_frames: int, **params: float) -> np.ndarray:
    """Actions of a named manoeuvre for a rollout (``params`` as :func:`terra.trajectory.manoeuvre_trajectory`)."""
    return actions_for_manoeuvre(name, actions_needed(num_context, num_frames) + 1, **params)


def trajectory_actions(
    trajectory: Any, num_context: int, num_frames: int, source: str = "trajectory",
    base: Path | None = None, skip: int = 0,
) -> np.ndarray:
    """Actions for a rollout from any accepted trajectory: a file (.json/.csv/.npy, relative to ``base``), a
    mapping with one of :data:`TRAJECTORY_KEYS`, or an array (see :func:`terra.actions.actions_from_value`).

    ``skip`` drops the trajectory's first frames: they belong to context frames that are not used (ACT-Bench
    samples give actions from their first context frame on).
    """
    need = actions_needed(num_context, num_frames)
    if isinstance(trajectory, (str, os.PathLike)):
        path = resolve_path(trajectory, base) if base is not None else str(trajectory)
        return load_actions(path, num_frames=need)
    actions = actions_from_value(trajectory, source, need + skip)[skip:]
    return validate_actions(actions, source, need)


def rollout_requests(
    codes: np.ndarray, actions: np.ndarray, num_frames: int, seeds: Sequence[int], overlap: int, layout: TokenLayout
) -> list[RolloutRequest]:
    """One request per seed over the same encoded context and actions, checked against the model's layout now
    (codes, windows and action count), so a bad one fails before any generation starts."""
    requests = [RolloutRequest(codes, actions, num_frames, seed=seed, overlap=overlap) for seed in seeds]
    for request in requests[:1]:  # they differ only in the seed
        RolloutState(request, layout)
    return requests
