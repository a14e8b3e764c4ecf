"""``terra-evaluate``: a world model + tokenizer on held-out clips of the synthetic world → report.json and a table
(terra/evaluation/, which documents the measurements).

    terra-evaluate                                       # the shipped demo models, Transformers backend
    terra-evaluate quality.num_clips=32 adherence.num_cases=20 out_dir=outputs/eval/demo

It ends as every Hydra app does (terra/apps/runner.py): a bad setting is one line and exit code 2, found before
torch is imported or any model loads.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.config.moved import move_settings
from terra.evaluation.settings import evaluate_spec

PROG = "terra-evaluate"  # the console script, named in error lines


@hydra.main(config_path=CONFIG_PATH, config_name="evaluate", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """Check the settings (before torch is imported), evaluate and print the table."""
    check_added_settings(PROG, allowed=("backend.options.",), cfg=cfg)
    move_settings(cfg, PROG)  # old setting names in a user's config file
    spec = evaluate_spec(cfg)
    from terra.evaluation.run import format_table, run  # imports torch

    print(format_table(run(spec)))


main = console_script(_main, PROG, extras=("eval",))


if __name__ == "__main__":
    main()
