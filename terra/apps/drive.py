"""``terra-drive``: driving policies in the loop with the world model."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task


DEFAULT_OUTPUT_DIR = "outputs/drives/%Y-%m-%d/%H-%M-%S"  # output_dir=null; made only once held
# A driver's failure is one line of its drive: gRPC's C core logs nothing (read when grpc loads).
os.environ.setdefault("GRPC_VERBOSITY", "NONE")


@hydra.main(config_path=CONFIG_PATH, config_name="drive", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    from terra.closedloop.study.settings import terra_drive_settings

    # free-form mappings: an engine's options, Ray's runtime_env, a NAVSIM agent's keyword arguments
    check_added_settings("terra-drive", allowed=("backend.options.", "ray.runtime_env.", "navsim_args."), cfg=cfg)
    logging.getLogger("carla_driver_interface").setLevel(logging.WARNING)  # one line per gRPC session otherwise
    logging.getLogger("grpc").setLevel(logging.CRITICAL)  # its logged traceback of an answer that does not parse
    out_dir = Path(str(cfg.output_dir)).expanduser() if cfg.output_dir else Path(time.strftime(DEFAULT_OUTPUT_DIR))
    # no model yet: a bad setting is one line; study=gpu needs a GPU whatever the settings after it say
    settings = terra_drive_settings(cfg, out_dir, sys.argv[1:], HydraConfig.get().runtime.choices.get("study"))

    from terra.closedloop.study.drives import terra_drive

    outcome = terra_drive(settings)
    for line in outcome.lines:
        print(line)
    sys.exit(outcome.exit_code)


main = console_script(_main, "terra-drive", extras=("closedloop",))


if __name__ == "__main__":
    main()
