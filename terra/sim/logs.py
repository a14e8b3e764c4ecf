"""Synthetic clips written as driving logs (the layout ``terra-prepare-logs`` reads): a folder per clip with
frames, ``timestamps.txt``, ``trajectory.csv``, ``road.json`` and a hidden settings record; ``clips.json`` last."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from PIL import Image

from terra.config.output_dir import claim_output_dir
from terra.contract.actions import FRAME_RATE_HZ
from terra.core.atomic import atomic_dir, json_text, mark, write_text
from terra.core.errors import TerraInputError
from terra.core.progress import Progress
from terra.inputs.driving_logs import ROAD_FILES, TIMESTAMPS_FILE, TRAJECTORY_STEM
from terra.roads import write_road_file
from terra.sim.dataset import APP, RECIPES, check_recipe, check_sizes, map_in_processes, kept_outputs
from terra.sim.scene import scene_road

LOGS_META_FILE = "clips.json"
TRAJECTORY_FILE = f"{TRAJECTORY_STEM}.csv"
ROAD_FILE = ROAD_FILES[0]  # road.json
CLIP_RECORD = ".clip-settings.json"  # in a clip folder: the settings it was made with (hidden: not read as a log)


def clip_id(domain: str, seed: int, index: int) -> str:
    """A clip's folder name: its domain, the run's seed and its index, so that runs of other settings differ."""
    return f"{domain}-{seed}-{index:05d}"


def write_driving_logs(out_dir: str | Path, num_clips: int, num_frames: int, height: int, width: int, seed: int = 0,
                       domain: str = "day", workers: int = 1, progress: bool = True,
                       recipe: str = "manoeuvres") -> Path:
    """Render ``num_clips`` random clips as driving logs in ``out_dir`` in ``workers`` processes (0 = one per core)."""
    num_clips, num_frames, height, width, seed, workers = check_sizes(
        num_clips=num_clips, num_frames=num_frames, height=height, width=width, seed=seed, workers=workers)
    check_recipe(recipe, num_frames, domain)
    out = Path(out_dir)
    if (out / LOGS_META_FILE).exists():
        raise TerraInputError(f"{out} already holds driving logs ({LOGS_META_FILE}); choose a new out_dir or delete it")
    ids = [clip_id(domain, seed, i) for i in range(num_clips)]
    claim_output_dir(out, "out_dir", files=[LOGS_META_FILE], folders=[clip_id(domain, seed, 0)[:-5] + "*"],
                     app=APP).record()
    # every visible folder is a clip to terra-prepare-logs: only this run's stay
    found = [entry.name for entry in os.scandir(out) if entry.is_dir() and not entry.name.startswith(".")]
    wanted = {name: clip_settings(i, num_frames, height, width, seed, domain, recipe) for i, name in enumerate(ids)}
    kept_outputs(out, found, wanted, recorded_settings, "clip folders")
    mark(out, ids)
    jobs = [(str(out / name), i, num_frames, height, width, seed, domain, recipe) for i, name in enumerate(ids)]
    with Progress(len(jobs), "rendering clips", "clip", enabled=progress) as bar:
        clips = list(bar.counted(map_in_processes(_write_clip, jobs, workers)))
    meta = {"format": "driving_logs", "num_clips": num_clips, "num_frames": num_frames, "height": height,
            "width": width, "fps": FRAME_RATE_HZ, "seed": seed, "domain": domain, "recipe": recipe, "clips": clips}
    write_text(out / LOGS_META_FILE, json_text(meta, indent=1))
    return out


def clip_settings(index: int, num_frames: int, height: int, width: int, seed: int, domain: str, recipe: str) -> dict:
    """What makes clip folder ``index`` (its :data:`CLIP_RECORD`); a rerun keeps a folder with the same."""
    return {"index": index, "num_frames": num_frames, "height": height, "width": width, "seed": seed,
            "domain": domain, "recipe": recipe, "road": ROAD_FILE}


def recorded_settings(folder: Path) -> dict | None:
    """The settings clip folder ``folder`` records, or None without a readable record."""
    try:
        record = json.loads((folder / CLIP_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _write_clip(folder: str, index: int, num_frames: int, height: int, width: int, seed: int, domain: str,
                recipe: str) -> dict:
    """Render clip ``index`` into ``folder`` unless already there; return its metadata."""
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
            write_road_file(scene_road(drive.scene), tmp / ROAD_FILE)  # the trajectory's world frame
            settings = clip_settings(index, num_frames, height, width, seed, domain, recipe)
            (tmp / CLIP_RECORD).write_text(json_text(settings) + "\n", encoding="utf-8")
    return {"id": path.name, "manoeuvre": drive.manoeuvre, "scene_seed": drive.scene.seed, "start_s": drive.start_s,
            "speed_kmh": drive.speed_kmh, "scene_length_m": drive.scene.length_m}
