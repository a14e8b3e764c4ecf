"""A world of the user's own (``module:Class``), driven and judged as the built-in worlds are."""

from __future__ import annotations

import inspect
import time
from typing import Any, Sequence

import numpy as np

from terra.closedloop.guard import UserCall, UserCodeError, handed, reason, user_call, user_class
from terra.closedloop.scenarios import Scenario
from terra.closedloop.worlds import WORLD_METHODS
from terra.core.errors import TerraInputError


def is_world_target(entry: str) -> bool:
    """Whether a ``world`` / ``controls`` entry names a class of the user's (``module:Class``)."""
    return ":" in entry


def world_class(entry: str, setting: str, timeout_s: float) -> type:
    """The world class ``module:Class`` of ``setting``, imported within ``timeout_s``; it must take ``image_size``."""
    module, _, name = entry.rpartition(":")
    where = f"{setting}: cannot load the world {entry!r}"
    fix = "give package.module:Class of a world (docs/drive.md, \"Your own world\")"
    if not module or not name:
        raise TerraInputError(f"{where}: give package.module:Class")
    cls = user_class(module, name, where, fix, timeout_s)
    try:
        problem = UserCall(f"{where}: reading {name}", "its methods", _class_problem, cls, name).returned(timeout_s)
    except (Exception, SystemExit) as err:  # noqa: BLE001  (the class's own code failed: its line, no trace)
        raise TerraInputError(f"{where}: reading {name} failed: {reason(err)}; fix the class") from None
    if problem:
        raise TerraInputError(f"{where}: {problem}: {fix}")
    return cls


def _class_problem(cls: type, name: str) -> str | None:
    """Why ``cls`` cannot be a world (None: it can)."""
    try:
        inspect.signature(cls).bind(image_size=(1, 1))
    except TypeError as err:
        return (f"{name}(image_size=(height, width)) cannot be called ({err}); a world is built with image_size "
                "alone")
    except ValueError:  # a class whose signature Python cannot tell: its build says
        pass
    missing = [f"{method}()" for method in WORLD_METHODS if not callable(getattr(cls, method, None))]
    if missing:
        return f"{name} has no {', '.join(missing)}; a world implements {', '.join(WORLD_METHODS)}"
    return None


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
            missing = user_call(self.who, "build", timeout_s, lambda: [
                f"{method}()" for method in WORLD_METHODS if not callable(getattr(self.world, method, None))])
        except UserCodeError as err:  # before any drive: the run's input to fix
            raise TerraInputError(f"{err}; fix the world's constructor") from None
        if missing:
            raise TerraInputError(f"{self.who}: the world it built has no {', '.join(missing)}; a world implements "
                                  f"{', '.join(WORLD_METHODS)}")
        self.generate_s = self.decode_s = 0.0

    def _call(self, method: str, *args) -> Any:
        """The world's ``method(*args)``, its lookup too behind the boundary (an attribute may run user code)."""
        return user_call(self.who, method, self.timeout_s, lambda: getattr(self.world, method)(*args))

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> Any:
        return self._call("open", handed(scenario), seed, max_frames)

    def context_frames(self, drive) -> np.ndarray:
        frames = self._call("context_frames", drive)
        if isinstance(frames, np.ndarray) and frames.ndim == 4:
            frames = list(frames)
        if type(frames) not in (list, tuple) or not frames:
            raise UserCodeError(f"{self.who} returned a {type(frames).__name__} from context_frames, not a list of "
                                "frames")
        return np.stack([self._check(frame, f"context frame {k}") for k, frame in enumerate(frames)])

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        """Each drive's next frame from a call of its own, so that one drive's failure is that drive's alone."""
        started = time.perf_counter()
        frames: list[np.ndarray | BaseException] = []
        for drive, action, pose in zip(drives, actions, poses):
            try:
                answer = self._call("step", [drive], [handed(action)], [handed(pose)])
                if type(answer) not in (list, tuple) or len(answer) != 1:
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
        self._call("close", drive)

    def _check(self, frame: Any, call: str) -> np.ndarray:
        """A copy of ``frame`` (the world's buffer stays its own) if it is uint8 ``[height, width, 3]``."""
        expected = (*self.image_size, 3)
        if type(frame) is not np.ndarray:  # a subclass's methods are user code
            raise UserCodeError(f"{self.who} returned a {type(frame).__name__} from {call}, not a numpy frame")
        if frame.dtype != np.uint8 or frame.shape != expected:
            raise UserCodeError(f"{self.who} returned a {frame.dtype} frame of shape {list(frame.shape)} from {call}; "
                                f"a world returns uint8 frames of shape {list(expected)}")
        return frame.copy()
