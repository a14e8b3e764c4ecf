"""Moved: terra.apps.runner.

This alias keeps old imports working for one release (README, "Moved names")."""

import warnings

from terra.apps.runner import *  # noqa: F401,F403
from terra.apps.runner import ASSETS, CONF_DIR, CONFIG_PATH  # noqa: F401

warnings.warn("terra.hydra_app moved to terra.apps.runner; import from there",
              DeprecationWarning, stacklevel=2)
