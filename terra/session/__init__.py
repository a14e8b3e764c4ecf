"""Closed-loop sessions: drive the world model frame by frame, choosing each action after seeing the last frame.

:class:`SessionHost` opens :class:`Session`\\ s on a pipeline; ``session.step(action)`` returns the next :class:`Frame`.
"""

from terra.generation.session_engine import SessionEngine, StepResult
from terra.session.driver_input import KeyDriver, drive_action, parse_action
from terra.session.session import Frame, Session, SessionHost

__all__ = ["Frame", "KeyDriver", "Session", "SessionEngine", "SessionHost", "StepResult", "drive_action",
           "parse_action"]
