"""``terra-score``: ACT-Bench's score of a folder of generated videos, with the ACT-Estimator, in one command."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.scoring.settings import scoring_settings

PROG = "terra-score"  # the console script, named in error lines


@hydra.main(config_path=CONFIG_PATH, config_name="score_actbench", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """Check the settings, score, print the summary."""
    check_added_settings(PROG, cfg=cfg)
    settings = scoring_settings(cfg)  # no torch yet: a bad setting is one line in about a second
    if settings.dry_run:  # samples, videos and the estimator folder; no weights loaded, nothing written
        from terra.core.errors import TerraInputError
        from terra.scoring.check import dry_run

        report = dry_run(settings)
        print(report.text())
        if not report.ready:
            raise TerraInputError(f"the dry run found {len(report.problems)} problem(s), listed above")
        return
    from terra.scoring.run import score  # torch and the estimator

    print(score(settings).text)


main = console_script(_main, PROG)


if __name__ == "__main__":
    main()
