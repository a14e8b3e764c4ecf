"""``terra-train``: train a world model, or fine-tune Terra (full or LoRA) on tokenized
driving logs, on one process or under ``torchrun`` (docs/train.md).

    terra-train data.tokens=data/tokens.safetensors output_dir=runs/wm
    terra-train model=terra_v1 terra_root=/data/Terra data.tokens=shards/ finetune=lora
    torchrun --nproc_per_node=8 -m terra.apps.train init=/data/Terra/world_model data.tokens=shards/

A thin Hydra wrapper (conf/train_world_model.yaml) around :mod:`terra.training`, which documents the data, the
objective, the checkpoints and the export. It ends as every Hydra app does (terra/apps/runner.py): a bad setting
is one line and exit code 2, found before torch is imported; SIGTERM checkpoints and stops (rerun to resume).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task

PROG = "terra-train"  # the console script, named in error lines (under torchrun: -m terra.apps.train)


@hydra.main(config_path=CONFIG_PATH, config_name="train_world_model", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """(1) the settings, checked once; (2) train, checkpoint and export (terra/training/run.py)."""
    check_added_settings(PROG, cfg=cfg)
    from terra.training.settings import train_spec

    spec = train_spec(cfg)  # no torch yet: a bad setting is one line in about a second
    from terra.training.run import train  # torch and the model

    train(spec)


main = console_script(_main, PROG)


if __name__ == "__main__":
    main()
