"""Moved: terra.config.checks.

This alias keeps old imports working for one release (README, "Moved names")."""

import warnings

from terra.config.checks import *  # noqa: F401,F403

warnings.warn("terra.errors moved to terra.config.checks; import from there",
              DeprecationWarning, stacklevel=2)
