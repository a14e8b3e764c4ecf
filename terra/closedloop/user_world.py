"""A world of the user's own (``module:Class``), driven and judged as the built-in worlds are.

The class implements :class:`~terra.closedloop.worlds.World` (``open``, ``context_frames``, ``step``, ``close``;
``name`` and the timing counters are optional) and is built as ``Class(image_size=(height, width))``. The setting is
checked before any drive: the module imported and the constructor's signature read (:func:`world_class`); the one
build, before the drives and the world model (terra/closedloop/prepare.py), is one line too when it fails. Every call
into it crosses terra/closedloop/guard.py's boundary under ``policy_timeout_s``, one drive at a time: what it is
handed (the scenario, the actions and poses) is read-only, and every frame it returns is checked here, once (uint8
``[height, width, 3]``), and copied, so that a world that reuses its buffer cannot change frames recorded before. A
world that raises, overruns, exits or returns anything else ends that drive ``failed`` with one line naming the
class and the problem; the other drives go on.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Sequence

import numpy as np

from terra.closedloop.guard import UserCodeError, handed, user_call, user_class
from terra.closedloop.scenarios import Scenario
from terra.core.errors import TerraInputError


def is_world_target(entry: str) -> bool:
    """Whether a ``world`` / ``controls`` entry names a class of the user's (``module:Class``)."""
    return ":" in entry


def world_class(entry: str, setting: str, timeout_s: float) -> type:
    """The world class ``module:Class`` of the setting ``setting``, imported now (within ``timeout_s``) and its
    constructor read: it must take ``image_size`` and need nothing else (one line when it cannot be)."""
    module, _, name = entry.rpartition(":")
    where = f"{setting}: cannot load the world {entry!r}"
    fix = "give package.module:Class of a world (docs/drive.md, \"Your own world\")"
    if not module or not name:
        raise TerraInputError(f"{where}: give package.module:Class")
    cls = user_class(module, name, where, fix, timeout_s)
    try:
        inspect.signature(cls).bind(image_size=(1, 1))
    except TypeError as err:
        raise TerraInputError(f"{where}: {name}(image_size=(height, width)) cannot be called ({err}); a world is "
                              f"built with image_size alone: {fix}") from None
    except ValueError:  # a class whose signature Python cannot tell: its build says
        pass
    return cls


def world_name(entry: str) -> str:
    """The name a user world's drives are recorded under: ``module.Class`` (a folder name)."""
    return entry.replace(":", ".")


class UserWorld:
    """The user's world class ``cls`` (named ``entry``) behind the boundary, making ``image_size`` frames."""

    def __init__(self, entry: str, cls: type, image_size: Sequence[int], timeout_s: float) -> None:
        self.name = world_name(entry)
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.timeout_s = timeout_s
        self.who = f"world {entry}"
        try:
            self.world = user_call(self.who, "build", timeout_s, lambda: cls(image_size=self.image_size))
        except UserCodeError as err:  # before any drive: the run's input to fix
            raise TerraInputError(f"{err}; fix the world's constructor") from None
        self.generate_s = 0.0
        self.decode_s = 0.0

    def _call(self, call: str, function, *args) -> Any:
        return user_call(self.who, call, self.timeout_s, function, *args)

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> Any:
        return self._call("open", self.world.open, handed(scenario), seed, max_frames)

    def context_frames(self, drive) -> np.ndarray:
        frames = self._call("context_frames", self.world.context_frames, drive)
        for k, frame in enumerate(frames):
            self._check(frame, f"context frame {k}")
        return np.stack(frames)

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        """Each drive's next frame from a call of its own, so that one drive's failure is that drive's alone."""
        started = time.perf_counter()
        frames: list[np.ndarray | BaseException] = []
        for drive, action, pose in zip(drives, actions, poses):
            try:
                answer = self._call("step", self.world.step, [drive], [handed(action)], [handed(pose)])
                if not isinstance(answer, (list, tuple)) or len(answer) != 1:
                    raise UserCodeError(f"{self.who} returned {type(answer).__name__} from step, not a list of one "
                                        "frame per drive")
                frame = answer[0]
                if isinstance(frame, BaseException):
                    raise UserCodeError(f"{self.who} failed in step: {type(frame).__name__}: {frame}")
                frames.append(self._check(frame, "step"))
            except UserCodeError as err:
                frames.append(err)
        self.generate_s += time.perf_counter() - started
        return frames

    def close(self, drive) -> None:
        self._call("close", self.world.close, drive)

    def _check(self, frame: Any, call: str) -> np.ndarray:
        """A copy of ``frame`` (the world's buffer stays its own) if it is uint8 ``[height, width, 3]``; otherwise
        one line naming what it is."""
        expected = (*self.image_size, 3)
        if not isinstance(frame, np.ndarray):
            raise UserCodeError(f"{self.who} returned a {type(frame).__name__} from {call}, not a numpy frame")
        if frame.dtype != np.uint8 or frame.shape != expected:
            raise UserCodeError(f"{self.who} returned a {frame.dtype} frame of shape {list(frame.shape)} from {call}; "
                                f"a world returns uint8 frames of shape {list(expected)}")
        return frame.copy()
