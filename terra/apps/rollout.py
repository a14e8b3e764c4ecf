"""``terra-rollout``: batch rollouts from a JSONL of samples (ACT-Bench or Terra's format) → videos, sidecars and a
manifest."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.batch.config import batch_spec, claim_output

PROG = "terra-rollout"  # the console script, named in error lines


@hydra.main(config_path=CONFIG_PATH, config_name="rollout", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """Settings; the output folder's lock; plan, generate and write; summary."""
    check_added_settings(PROG, allowed=("backend.options.", "ray.runtime_env."), cfg=cfg)
    spec = batch_spec(cfg)  # no torch yet: a bad setting is one line in about a second
    with claim_output(spec).hold(spec.manifest_path.name):  # a second run into this folder stops here
        from terra.batch.run import run_locked  # the samples planned before torch and the models load

        result = run_locked(spec)
    print(f"{PROG}: {result.summary_line()}")
    if result.route_line() is not None:
        print(f"{PROG}: {result.route_line()}")
    if result.decoding is not None:
        decoding, stats = result.decoding
        print(f"{PROG}: {decoding} decoding: {stats.line()}")
    for actor, counts in result.per_actor.items():
        where = "CPU" if counts["gpus"] == "cpu" else f"GPU {counts['gpus']}"
        print(f"{PROG}: actor {actor} on {counts['node']} ({where}): {counts['ok']} succeeded, {counts['failed']} "
              f"failed, {counts['retried']} of them after a retry")
    sys.exit(result.exit_code)


main = console_script(_main, PROG)


if __name__ == "__main__":
    main()
