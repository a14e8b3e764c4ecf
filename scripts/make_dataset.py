"""Render a dataset of random synthetic driving clips (frames, poses, instruction trajectories, actions).

    python scripts/make_dataset.py out_dir=data/clips num_clips=4000 num_frames=25 height=144 width=256
    python scripts/make_dataset.py format=driving_logs out_dir=data/night_logs num_clips=300 num_frames=20 \
        domain=night seed=1     # driving logs for scripts/prepare_driving_logs.py

See conf/make_dataset.yaml for every option; the folder formats: terra/sim/dataset.py (``format=shards``) and
terra/sim/logs.py (``format=driving_logs``).
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

from terra.core.errors import TerraInputError  # noqa: E402
from terra.config.checks import check_choice  # noqa: E402
from terra.apps.runner import CONFIG_PATH, run_app  # noqa: E402
from terra.sim.dataset import ClipDataset, write_dataset  # noqa: E402
from terra.sim.logs import write_driving_logs  # noqa: E402

FORMATS = ("shards", "driving_logs")


@hydra.main(config_path=CONFIG_PATH, config_name="make_dataset", version_base=None)
def main(cfg: DictConfig) -> None:
    """Write the dataset described by ``cfg`` and print a one-line summary."""
    start = time.perf_counter()
    sizes = (int(cfg.num_clips), int(cfg.num_frames), int(cfg.height), int(cfg.width))
    try:
        if check_choice(cfg.format, "format", FORMATS) == "driving_logs":
            out = write_driving_logs(cfg.out_dir, *sizes, seed=int(cfg.seed), domain=cfg.domain,
                                     workers=int(cfg.workers))
        else:
            out = write_dataset(cfg.out_dir, *sizes, seed=int(cfg.seed), clips_per_shard=int(cfg.clips_per_shard),
                                workers=int(cfg.workers), compress=bool(cfg.compress), domain=cfg.domain)
    except TerraInputError as err:
        print(f"make_dataset: error: {err}", file=sys.stderr)
        sys.exit(2)
    size_mb = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20
    elapsed = time.perf_counter() - start
    if cfg.format == "driving_logs":
        print(f"wrote {sizes[0]} clips x {sizes[1]} frames at {sizes[2]}x{sizes[3]} ({cfg.domain}) as driving logs "
              f"to {out} ({size_mb:.1f} MiB) in {elapsed:.1f} s")
        return
    data = ClipDataset(out)
    print(f"wrote {len(data)} clips x {data.num_frames} frames at {data.image_size[0]}x{data.image_size[1]} "
          f"({data.domain}) to {out} ({size_mb:.1f} MiB, {data.num_shards} shards) in {elapsed:.1f} s")


if __name__ == "__main__":
    run_app(main, "make_dataset", "python scripts/make_dataset.py")
