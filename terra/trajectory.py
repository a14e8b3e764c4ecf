"""Moved: terra.inputs.trajectory (the rates: terra.generation.actions).

This alias keeps old imports working for one release (README, "Moved names")."""

import warnings

from terra.generation.actions import FRAME_RATE_HZ, FUTURE_POINTS, FUTURE_RATE_HZ, MAX_SPEED_MPS  # noqa: F401
from terra.inputs.trajectory import *  # noqa: F401,F403

warnings.warn("terra.trajectory moved to terra.inputs.trajectory (the rates: terra.generation.actions); import from there",
              DeprecationWarning, stacklevel=2)
