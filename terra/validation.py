"""Moved: terra.config (checks, files, outputs, backend, sampling).

This alias keeps old imports working for one release (README, "Moved names")."""

import warnings

from terra.config.backend import *  # noqa: F401,F403
from terra.config.checks import *  # noqa: F401,F403
from terra.config.files import *  # noqa: F401,F403
from terra.config.outputs import *  # noqa: F401,F403
from terra.config.sampling import SAMPLING  # noqa: F401

warnings.warn("terra.validation moved to terra.config (checks, files, outputs, backend, sampling); import from there",
              DeprecationWarning, stacklevel=2)
