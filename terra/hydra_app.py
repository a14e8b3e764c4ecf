"""What the Hydra apps share: ``terra-generate`` (:mod:`terra.cli`), ``scripts/rollout.py``, ``scripts/evaluate.py``.

* The configs: the repository's ``conf/`` folder is installed as the package ``terra.conf`` (``pyproject.toml``
  maps it; a wheel holds it as ``terra/conf/``), so ``@hydra.main(config_path=CONFIG_PATH, ...)`` finds the same
  files in an editable install, where they are ``conf/`` itself, and in a wheel install.
* The resolvers, registered on import: ``${terra_asset:NAME}``, a path under ``terra/assets/`` (the demo
  checkpoints named by ``conf/model/demo.yaml`` and ``conf/tokenizer/demo.yaml``), and
  ``${terra_snapshot:FOLDER}``, a folder of the downloaded Terra snapshot ``terra_root`` (:mod:`terra.snapshot`).
* :func:`run_app`: Hydra's and OmegaConf's errors (an unknown setting, a malformed override) as one line on
  stderr and exit code 2, like every other user mistake.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

import terra.conf
from terra.snapshot import snapshot_folder

CONFIG_PATH = "pkg://terra.conf"
CONF_DIR = str(Path(terra.conf.__file__).resolve().parent)  # the same configs as a folder (initialize_config_dir)
ASSETS = Path(__file__).resolve().parent / "assets"

OmegaConf.register_new_resolver("terra_asset", lambda name: str(ASSETS / name), replace=True)
OmegaConf.register_new_resolver("terra_snapshot", snapshot_folder, replace=True)


def one_line(err: BaseException) -> str:
    """Hydra's / OmegaConf's multi-line message on one line, without the config search path and key details."""
    message, previous_item = "", False
    for line in str(err).splitlines():
        text = line.strip()
        if text.startswith("Config search path"):
            break
        if not text or text.startswith(("full_key:", "object_type=", "reference_type=")):
            continue
        item = line[:1].isspace()  # Hydra lists options as indented lines
        message = f"{message}{', ' if item and previous_item else ' '}{text}" if message else text
        previous_item = item
    return message or type(err).__name__


def run_app(app: Callable[[], None], prog: str, command: str | None = None) -> None:
    """Run the ``@hydra.main`` function ``app``; a bad override or config value prints one line on stderr,
    ``<prog>: error: ...``, and exits with code 2. ``command`` is how users start the app (default ``prog``);
    the line points to its ``--help``. ``HYDRA_FULL_ERROR=1`` keeps Hydra's traceback."""
    command = command or prog
    user_wants_traces = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises config errors instead of printing them and exiting 1
    try:
        app()
    except (HydraException, OmegaConfBaseException) as err:
        if user_wants_traces:
            raise
        message = one_line(err)
        unknown = re.match(r"Could not override '([^']+)'", message)
        if unknown and isinstance(err.__cause__, (ConfigKeyError, ConfigAttributeError)):
            message = f"unknown setting {unknown.group(1)!r} (`{command} --cfg job` lists the settings)"
        print(f"{prog}: error: {message}; see {command} --help", file=sys.stderr)
        sys.exit(2)
