"""Synthetic clips written as driving logs, the folder layout ``terra-prepare-logs`` reads
(terra/inputs/driving_logs.py), so the synthetic world can stand in for recorded drives.

Layout of a logs folder::

    clips.json               the settings and every clip's manoeuvre / scene seed / start / speed (written last;
                             files beside the clip folders are not read by prepare_driving_logs)
    night-1-00000/           clip i of seed 1 in domain night: its id in the shards
      frame_000.png ...      the frames at 10 Hz, in name order
      timestamps.txt         each frame's time in seconds (i / 10), so no frame_rate_hz setting can misplace them
      trajectory.csv         t,x,y,yaw: the world-frame ego trajectory on the frames' clock, every sample the
                             clip was rendered from (100 Hz) up to 3 s past the last frame, so the actions
                             prepare_driving_logs computes are the clip's own
    night-1-00001/
    ...

Clip ``i`` is the drive of ``numpy.random.default_rng([seed, i])`` (:func:`terra.sim.clips.random_drive`), the
same as clip ``i`` of a shard dataset of that seed (terra/sim/dataset.py). Each clip is written into a hidden
temporary folder and renamed, so a clip folder is always complete; a rerun of an interrupted run keeps the
clips already there and writes the rest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from terra.config.checks import check_choice
from terra.config.output_dir import claim_output_dir
from terra.core.atomic import atomic_dir, json_text, mark, write_text
from terra.core.errors import TerraInputError
from terra.core.progress import Progress
from terra.generation.actions import FRAME_RATE_HZ
from terra.inputs.driving_logs import TIMESTAMPS_FILE, TRAJECTORY_STEM
from terra.sim.dataset import RECIPES, check_recipe, check_sizes, map_in_processes
from terra.sim.scene import DOMAINS

LOGS_META_FILE = "clips.json"
APP = "terra-make-dataset"  # format=driving_logs (terra/config/output_dir.py)
TRAJECTORY_FILE = f"{TRAJECTORY_STEM}.csv"  # the layout terra/inputs/driving_logs.py reads


def clip_id(domain: str, seed: int, index: int) -> str:
    """A clip's folder name: its domain, the run's seed and its index, so that runs of other settings differ."""
    return f"{domain}-{seed}-{index:05d}"


def write_driving_logs(
    out_dir: str | Path,
    num_clips: int,
    num_frames: int,
    height: int,
    width: int,
    seed: int = 0,
    domain: str = "day",
    workers: int = 1,
    progress: bool = True,
    recipe: str = "manoeuvres",
) -> Path:
    """Render ``num_clips`` random clips of ``num_frames`` frames at ``height x width`` as driving logs in
    ``out_dir`` (module docstring), in ``workers`` processes (0 = one per CPU core), drawn by ``recipe``
    (terra/sim/dataset.py's RECIPES). Returns the folder."""
    num_clips, num_frames, height, width, seed, workers = check_sizes(
        num_clips=num_clips, num_frames=num_frames, height=height, width=width, seed=seed, workers=workers)
    check_choice(domain, "domain", DOMAINS)
    check_recipe(recipe, num_frames)
    out = Path(out_dir)
    if (out / LOGS_META_FILE).exists():
        raise TerraInputError(f"{out} already holds driving logs ({LOGS_META_FILE}); choose a new out_dir or delete it")
    ids = [clip_id(domain, seed, i) for i in range(num_clips)]
    if out.is_dir():
        ours = set(ids)
        others = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")
                        and p.name not in ours)
        if others:
            raise TerraInputError(f"{out} holds clip folders of other settings ({', '.join(others[:3])}); choose a "
                                  "new out_dir or delete them")
    claim_output_dir(out, "out_dir", files=[LOGS_META_FILE], folders=[clip_id(domain, seed, 0)[:-5] + "*"],
                     app=APP).record()
    mark(out, ids)
    jobs = [(str(out / name), i, num_frames, height, width, seed, domain, recipe) for i, name in enumerate(ids)]
    with Progress(len(jobs), "rendering clips", "clip", enabled=progress) as bar:  # terra/core/progress.py
        clips = list(bar.counted(map_in_processes(_write_clip, jobs, workers)))
    meta = {"format": "driving_logs", "num_clips": num_clips, "num_frames": num_frames, "height": height,
            "width": width, "fps": FRAME_RATE_HZ, "seed": seed, "domain": domain, "recipe": recipe, "clips": clips}
    write_text(out / LOGS_META_FILE, json_text(meta, indent=1))
    return out


def _write_clip(folder: str, index: int, num_frames: int, height: int, width: int, seed: int, domain: str,
                recipe: str) -> dict:
    """Render clip ``index`` into ``folder`` unless it is there already; return its metadata."""
    drive = RECIPES[recipe](np.random.default_rng([seed, index]), num_frames, domain)
    path = Path(folder)
    if not path.is_dir():
        clip = drive.render(num_frames, height, width)
        with atomic_dir(path) as tmp:
            digits = max(3, len(str(num_frames - 1)))
            for t, frame in enumerate(clip.frames):
                Image.fromarray(frame).save(tmp / f"frame_{t:0{digits}d}.png")
            times = np.arange(num_frames) / FRAME_RATE_HZ
            (tmp / TIMESTAMPS_FILE).write_text("".join(f"{t!r}\n" for t in times.tolist()))
            traj = drive.trajectory  # on the frames' clock: frame 0 is at the trajectory's first sample
            rows = zip((traj.t - traj.t[0]).tolist(), traj.x.tolist(), traj.y.tolist(), traj.yaw.tolist())
            (tmp / TRAJECTORY_FILE).write_text("t,x,y,yaw\n" + "".join(f"{t!r},{x!r},{y!r},{a!r}\n"
                                                                       for t, x, y, a in rows))
    return {"id": path.name, "manoeuvre": drive.manoeuvre, "scene_seed": drive.scene.seed, "start_s": drive.start_s,
            "speed_kmh": drive.speed_kmh, "scene_length_m": drive.scene.length_m}
