"""``terra-drive``: driving policies in the loop with the world model (Hydra app, ``conf/drive.yaml``).

(1) the settings, checked once before any model loads (terra/closedloop/settings.py: policies named, scenarios
listed, ranges, the output folder claimed apart from every input); (2) the worlds, the scenarios and the drives,
recorded under ``output_dir`` (terra/closedloop/drives.py: a video and JSON per drive, a manifest, resumable, the
folder locked); with ``world=both`` in both worlds and the fidelity report (terra/closedloop/fidelity.py). Exit
codes as conf/drive.yaml says; a user mistake is one line (terra/apps/runner.py).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.config.moved import move_settings


@hydra.main(config_path=CONFIG_PATH, config_name="drive", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    from terra.closedloop.settings import drive_settings

    check_added_settings("terra-drive", allowed=("backend.options.", "ray.runtime_env."))
    move_settings(cfg, "terra-drive")  # old setting names in a user's config file
    logging.getLogger("carla_driver_interface").setLevel(logging.WARNING)  # one line per gRPC session otherwise
    out_dir = Path(str(cfg.output_dir)).expanduser() if cfg.output_dir else Path(HydraConfig.get().runtime.output_dir)
    settings = drive_settings(cfg, out_dir)  # no model yet: a bad setting or output folder is one line

    from terra.closedloop.drives import drive

    outcome = drive(settings)
    for line in outcome.lines:
        print(line)
    sys.exit(outcome.exit_code)


main = console_script(_main, "terra-drive")


if __name__ == "__main__":
    main()
