"""``terra-train-tokenizer``: train an image tokenizer (LFQ or VQ-16) on a folder of images or on the synthetic
world."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task

PROG = "terra-train-tokenizer"  # the console script, named in error lines


@hydra.main(config_path=CONFIG_PATH, config_name="train_tokenizer", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """(1) the settings, checked once; (2) train (or resume) until the step or time budget, then export."""
    check_added_settings(PROG, cfg=cfg)
    from terra.training.tokenizer_settings import tokenizer_train_spec

    spec = tokenizer_train_spec(cfg)  # no torch yet: a bad setting is one line in about a second
    from terra.training.tokenizer_run import train  # torch and the tokenizer

    train(spec)


main = console_script(_main, PROG)


if __name__ == "__main__":
    main()
