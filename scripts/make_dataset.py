"""Render a dataset of random synthetic driving clips (frames, poses, instruction trajectories, actions).

    python scripts/make_dataset.py out_dir=data/clips num_clips=4000 num_frames=25 height=144 width=256

See conf/make_dataset.yaml for every option and terra/sim/dataset.py for the folder format.
"""

from __future__ import annotations

import os

# Every worker process renders single-threaded; BLAS thread pools in each of them would only contend.
# (Set before numpy is imported; an explicit setting in the environment wins.)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402
import time  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from terra.config.checks import TerraInputError  # noqa: E402
from terra.apps.runner import CONFIG_PATH, run_app  # noqa: E402
from terra.sim.dataset import ClipDataset, write_dataset  # noqa: E402


@hydra.main(config_path=CONFIG_PATH, config_name="make_dataset", version_base=None)
def main(cfg: DictConfig) -> None:
    """Write the dataset described by ``cfg`` and print a one-line summary."""
    start = time.perf_counter()
    try:
        out = write_dataset(
            cfg.out_dir, int(cfg.num_clips), int(cfg.num_frames), int(cfg.height), int(cfg.width),
            seed=int(cfg.seed), clips_per_shard=int(cfg.clips_per_shard), workers=int(cfg.workers),
            compress=bool(cfg.compress),
        )
    except TerraInputError as err:
        print(f"make_dataset: error: {err}", file=sys.stderr)
        sys.exit(2)
    data = ClipDataset(out)
    size_mb = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"wrote {len(data)} clips x {data.num_frames} frames at {data.image_size[0]}x{data.image_size[1]} "
          f"to {out} ({size_mb:.1f} MiB, {data.num_shards} shards) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    run_app(main, "make_dataset", "python scripts/make_dataset.py")
