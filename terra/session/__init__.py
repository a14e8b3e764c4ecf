"""Closed-loop sessions: drive the world model frame by frame, choosing each action after seeing the last frame.

:class:`SessionHost` opens :class:`Session`\\ s on a pipeline; ``session.step(action)`` returns the next
:class:`Frame` (codes and RGB); ``fork``, ``reset`` and ``close`` manage it. Many sessions advance together on
one backend through :class:`SessionEngine` (terra/generation/session_engine.py, the floor sessions stand on, which
the closed loop's model world shares). Actions: terra/session/controls.py.
``terra-serve`` (terra/serve/) puts sessions behind HTTP and WebSocket.
"""

from terra.generation.session_engine import SessionEngine, StepResult
from terra.session.controls import KeyDriver, drive_action, parse_action
from terra.session.session import Frame, Session, SessionHost

__all__ = ["Frame", "KeyDriver", "Session", "SessionEngine", "SessionHost", "StepResult", "drive_action",
           "parse_action"]
