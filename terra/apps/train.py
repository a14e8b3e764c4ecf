"""``terra-train``: train a world model, or fine-tune Terra (full or LoRA) on tokenized driving logs, on one process
or under ``torchrun``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task

PROG = "terra-train"  # the console script, named in error lines (under torchrun: -m terra.apps.train)


@hydra.main(config_path=CONFIG_PATH, config_name="train_world_model", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """(1) the settings, checked once; (2) train, checkpoint and export."""
    check_added_settings(PROG, cfg=cfg)
    from terra.training.settings import train_spec

    spec = train_spec(cfg)  # no torch yet: a bad setting is one line in about a second
    from terra.training.run import train  # torch and the model

    train(spec)


main = console_script(_main, PROG)


if __name__ == "__main__":
    main()
