"""``terra-score``: ACT-Bench's score of a folder of generated videos, with the ACT-Estimator, in one command.

    terra-score videos=generated_videos/terra samples=act_bench.jsonl \
        estimator=ACT-Estimator output_dir=results/terra [batch_size=16 num_workers=8 device=auto]

→ ``<output_dir>/summary.json`` (ACT-Bench's keys), ``results.jsonl`` (one row per sample, ACT-Bench's columns),
``confusion_matrix.png`` and a one-screen summary on stdout. ``dry_run=true`` checks the samples, the videos and the
estimator folder without loading weights and reports what is missing (terra/scoring/check.py). A thin Hydra wrapper
(conf/score_actbench.yaml) around :mod:`terra.scoring`, which documents the matching, the preprocessing and the metrics.
The settings are checked before torch is imported (terra/scoring/settings.py); like every Hydra app
(terra/apps/runner.py) a user error, a missing or short video included, is one line and exit code 2, and nothing is
written into ``output_dir`` unless the whole run succeeds.
"""

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
