"""Moved: terra.apps.generate.

This alias keeps old imports working for one release (README, "Moved names")."""

import warnings

from terra.apps.generate import main, run  # noqa: F401

warnings.warn("terra.cli moved to terra.apps.generate; import from there",
              DeprecationWarning, stacklevel=2)
