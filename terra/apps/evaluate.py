"""``terra-evaluate``: a world model + tokenizer on held-out clips of the synthetic world → report.json and a table."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.evaluation.settings import evaluate_spec

PROG = "terra-evaluate"  # the console script, named in error lines


@hydra.main(config_path=CONFIG_PATH, config_name="evaluate", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """Check the settings (before torch is imported), evaluate and print the table."""
    check_added_settings(PROG, allowed=("backend.options.",), cfg=cfg)
    spec = evaluate_spec(cfg)
    from terra.evaluation.run import format_table, run  # imports torch

    print(format_table(run(spec, resume_command=resume_command(sys.argv[1:], spec.output.path))))


def resume_command(arguments: list[str], folder: Path) -> str:
    """The command that resumes a run started with ``arguments``: the same, with ``out_dir`` set to the run's folder."""
    given = [arg for arg in arguments if arg.lstrip("+~").partition("=")[0] != "out_dir"]
    path = str(folder)
    if not re.fullmatch(r"[A-Za-z0-9_./+-]+", path):  # Hydra's quotes: a quote, and backslashes before one, escaped
        path = "'" + re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\" + m[2] if m[2] else ""), path) + "'"
    return shlex.join([PROG, *given, f"out_dir={path}"])


main = console_script(_main, PROG, extras=("eval",))


if __name__ == "__main__":
    main()
