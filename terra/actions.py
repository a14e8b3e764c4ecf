"""Moved: terra.inputs.actions (the action contract: terra.generation.actions).

This alias keeps old imports working for one release (README, "Moved names")."""

import warnings

from terra.generation.actions import *  # noqa: F401,F403
from terra.inputs.actions import *  # noqa: F401,F403

warnings.warn("terra.actions moved to terra.inputs.actions (the action contract: terra.generation.actions); import from there",
              DeprecationWarning, stacklevel=2)
