"""Closed-loop sessions: drive the world model frame by frame, choosing each action after seeing the last frame.

:class:`SessionHost` opens :class:`Session`\\ s on a pipeline; ``session.step(action)`` returns the next
:class:`Frame` (codes and RGB); ``fork``, ``reset`` and ``close`` manage it. Many sessions advance together on
one backend through :class:`SessionEngine` (terra/generation/session_engine.py, the floor sessions stand on, which
the closed loop's model world shares). Actions from what a driver gives: terra/session/driver_input.py (its old path
``terra.session.controls`` still imports until 0.2.0: terra/core/lazy.py). ``terra-serve``
(terra/serve/) puts sessions behind HTTP and WebSocket.
"""

from terra.core.lazy import moved_modules
from terra.generation.session_engine import SessionEngine, StepResult
from terra.session.driver_input import KeyDriver, drive_action, parse_action
from terra.session.session import Frame, Session, SessionHost

MOVED_MODULES = moved_modules(__name__, {"controls": "driver_input"})  # "controls": the fidelity study's word
__all__ = ["Frame", "KeyDriver", "Session", "SessionEngine", "SessionHost", "StepResult", "drive_action",
           "parse_action"]
