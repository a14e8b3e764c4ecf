"""``terra-make-dataset``: render a dataset of random synthetic driving clips (frames, poses, instruction
trajectories, actions, routes)."""

from __future__ import annotations

import os

# Every worker process renders single-threaded; BLAS thread pools in each of them would only contend.
# (Set before numpy is imported; an explicit setting in the environment wins.)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import time  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task  # noqa: E402
from terra.config.checks import required_path  # noqa: E402
from terra.config.schema import check_schema  # noqa: E402
from terra.sim.dataset import ClipDataset, MakeDatasetConfig, write_dataset  # noqa: E402
from terra.sim.logs import write_driving_logs  # noqa: E402

PROG = "terra-make-dataset"  # the console script, named in error lines


@hydra.main(config_path=CONFIG_PATH, config_name="make_dataset", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    """Write the dataset described by ``cfg`` and print a one-line summary."""
    check_added_settings(PROG, cfg=cfg)
    start = time.perf_counter()
    settings = check_schema(cfg, MakeDatasetConfig)
    values = {key: settings[key] for key in ("num_clips", "num_frames", "height", "width", "seed", "workers",
                                             "domain", "recipe")}
    out_dir = required_path(cfg, "out_dir", "the dataset's folder")
    as_logs = settings["format"] == "driving_logs"
    if as_logs:
        out = write_driving_logs(out_dir, **values)
    else:
        out = write_dataset(out_dir, clips_per_shard=settings["clips_per_shard"], compress=settings["compress"],
                            **values)
    size_mb = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20
    elapsed = time.perf_counter() - start
    if as_logs:
        print(f"wrote {values['num_clips']} clips x {values['num_frames']} frames at {values['height']}x"
              f"{values['width']} ({values['domain']}) as driving logs to {out} ({size_mb:.1f} MiB) in {elapsed:.1f} s")
        return
    data = ClipDataset(out)
    print(f"wrote {len(data)} clips x {data.num_frames} frames at {data.image_size[0]}x{data.image_size[1]} "
          f"({data.domain}, routes of {data.route_points} points) to {out} ({size_mb:.1f} MiB, {data.num_shards} "
          f"shards) in {elapsed:.1f} s")


main = console_script(_main, PROG)


if __name__ == "__main__":
    main()
