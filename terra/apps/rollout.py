"""``terra-rollout``: batch rollouts from a JSONL of samples (ACT-Bench or Terra's format) → videos, sidecars and
a manifest.

    terra-rollout samples=samples.jsonl output.dir=out/run1 num_frames=16
    terra-rollout samples=act_bench.jsonl image_root=/data/nuscenes output.naming=actbench \
        num_frames=44 output.dir=generated_videos/terra model=terra_v1 terra_root=/data/Terra backend=vllm

``model=terra_v1`` / ``terra_v2`` with ``terra_root`` (a download of turing-motors/Terra) picks the world model
and its tokenizer, as in ``terra-generate`` (terra/config/snapshot.py).

``executor=ray`` runs one engine per GPU on a Ray cluster (a local one for the run unless ``ray.address`` is
set; docs/rollout.md, "Running across nodes").

A thin Hydra wrapper (conf/rollout.yaml) around :mod:`terra.batch`, which documents the sample formats, the
output naming, resuming, sharding and Ray runs. Rerunning the same command resumes: finished samples are
skipped. Exit code: 0 when every sample succeeded (or was already complete), 1 when some failed (each failure
is in the manifest with its one-line error), 2 for a configuration or input error found before any work.

It ends as every Hydra app does (terra/apps/runner.py): a user error is one line and exit code 2, an internal one
one line and exit code 1 (the traceback under ``--verbose``), and Ctrl-C or SIGTERM stop the engine, keep the
samples finished so far with their manifest records and exit 130 / 143 (a rerun resumes). The settings are
checked once, before torch is imported (terra/batch/config.py), and the output folder is locked once, before
any work (terra/core/lock.py): a second run into it fails at once, naming the first.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.batch.config import batch_spec, claim_output
from terra.config.moved import move_settings

PROG = "terra-rollout"  # the console script, named in error lines


@hydra.main(config_path=CONFIG_PATH, config_name="rollout", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """(1) the settings, checked once; (2) the output folder's lock, taken once; (3) plan, generate and write;
    (4) the summary. Exit code as in the module docstring."""
    check_added_settings(PROG, allowed=("backend.options.", "ray.runtime_env."), cfg=cfg)
    move_settings(cfg, PROG)  # old setting names in a user's config file
    spec = batch_spec(cfg)  # no torch yet: a bad setting is one line in about a second
    with claim_output(spec).hold(spec.manifest_path.name):  # a second run into this folder stops here
        from terra.batch.run import run_locked  # torch and the models

        result = run_locked(spec)
    print(f"{PROG}: {result.summary_line()}")
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
