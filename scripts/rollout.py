"""Batch rollouts from a JSONL of samples (ACT-Bench or Terra's format) → videos, sidecars and a manifest.

    python scripts/rollout.py samples=samples.jsonl output.dir=out/run1 num_frames=16
    python scripts/rollout.py samples=act_bench.jsonl image_root=/data/nuscenes output.naming=actbench \
        num_frames=44 output.dir=generated_videos/terra model=terra_v1 terra_root=/data/Terra backend=vllm

``model=terra_v1`` / ``terra_v2`` with ``terra_root`` (a download of turing-motors/Terra) picks the world model
and its tokenizer, as in ``terra-generate`` (terra/snapshot.py).

``executor=ray`` runs one engine per GPU on a Ray cluster (a local one for the run unless ``ray.address`` is
set; README, "Running across nodes").

A thin Hydra wrapper (conf/rollout.yaml) around :mod:`terra.batch`, which documents the sample formats, the
output naming, resuming, sharding and Ray runs. Rerunning the same command resumes: finished samples are
skipped. Exit code: 0 when every sample succeeded (or was already complete), 1 when some failed (each failure
is in the manifest with its one-line error), 2 for a configuration or input error found before any work.

It ends as every Hydra app does (terra/hydra_app.py): a user error is one line and exit code 2, an internal one
one line and exit code 1 (the traceback under ``--verbose``), and Ctrl-C or SIGTERM stop the engine, keep the
samples finished so far with their manifest records and exit 130 / 143 (a rerun resumes). The settings are
checked before torch is imported (terra/batch/config.py), and the output folder is locked before any work
(terra/batch/lock.py): a second run into it fails at once, naming the first.
"""

from __future__ import annotations

import dataclasses
import sys

import hydra
from omegaconf import DictConfig

from terra.batch.config import check_settings, config_from_omegaconf
from terra.batch.lock import output_lock
from terra.hydra_app import CONFIG_PATH, check_added_settings, run_app, task

COMMAND = "python scripts/rollout.py"


@hydra.main(config_path=CONFIG_PATH, config_name="rollout", version_base=None)
@task
def main(cfg: DictConfig) -> None:
    """Hydra entry point: run the batch and print its summary; exit code as in the module docstring."""
    check_added_settings(COMMAND, allowed=("backend.options.", "ray.runtime_env."))
    config = config_from_omegaconf(cfg)
    check_settings(config)  # no torch yet: a bad setting is one line in about a second
    quiet = not sys.stderr.isatty()  # no progress bars in logs: stderr holds one line per failure only
    if quiet:
        config = dataclasses.replace(config, progress=False)
    with output_lock(config.manifest_path):  # a second run into this folder stops here
        from terra.batch.run import run_batch  # torch and the models

        if quiet:
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
        result = run_batch(config)
    print(f"rollout: {result.summary_line()}")
    for actor, counts in result.per_actor.items():
        where = "CPU" if counts["gpus"] == "cpu" else f"GPU {counts['gpus']}"
        print(f"rollout: actor {actor} on {counts['node']} ({where}): {counts['ok']} succeeded, {counts['failed']} "
              f"failed, {counts['retried']} of them after a retry")
    sys.exit(result.exit_code)


if __name__ == "__main__":
    run_app(main, "rollout", COMMAND)
