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
"""

from __future__ import annotations

import signal
import sys

import hydra
from omegaconf import DictConfig

from terra.batch import config_from_omegaconf, run_batch
from terra.errors import TerraInputError
from terra.hydra_app import CONFIG_PATH, run_app


def _terminate(signum, frame) -> None:
    """SIGTERM ends the run like Ctrl-C: finished rollouts are still written and the manifest is closed."""
    raise SystemExit(128 + signum)


@hydra.main(config_path=CONFIG_PATH, config_name="rollout", version_base=None)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: run the batch and print its summary; exit code as in the module docstring."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        result = run_batch(config_from_omegaconf(cfg))
    except TerraInputError as err:
        print(f"rollout: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"rollout: {result.summary_line()}")
    for actor, counts in result.per_actor.items():
        where = "CPU" if counts["gpus"] == "cpu" else f"GPU {counts['gpus']}"
        print(f"rollout: actor {actor} on {counts['node']} ({where}): {counts['ok']} succeeded, {counts['failed']} "
              f"failed, {counts['retried']} of them after a retry")
    sys.exit(result.exit_code)


if __name__ == "__main__":
    run_app(main, "rollout", "python scripts/rollout.py")
