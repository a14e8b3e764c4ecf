"""A folder of synthetic clips on disk: :func:`write_dataset` renders them into ``.npz`` shards, :class:`ClipDataset`
reads. Clip ``i`` is drawn from ``default_rng([seed, i])``; ``meta.json`` is written last; a rerun keeps only the
outputs recorded with its settings."""

from __future__ import annotations

import fnmatch
import json
import multiprocessing
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import numpy as np

from terra.config.checks import MAX_FRAMES, Range, SEED, check_choice, check_flag, one_line, shown
from terra.config.output_dir import claim_output_dir
from terra.config.schema import flag, setting
from terra.contract.actions import FRAME_RATE_HZ
from terra.core.atomic import atomic_path, json_text, mark, marked, write_text
from terra.core.device import usable_cores
from terra.core.errors import TerraInputError, past
from terra.core.progress import Progress
from terra.sim.clips import Clip, DATASET_ROUTE_POINTS, Drive, random_drive
from terra.sim.long_drives import random_long_drive
from terra.sim.recoveries import CONTEXT_FRAMES, random_recovery
from terra.sim.scene import DOMAINS


APP = "terra-make-dataset"
LEFTOVERS = (".tmp", ".old")  # atomic_dir's ``.<name>.tmp`` and ``.<name>.old`` folders


def kept_outputs(out: Path, found: Iterable[str], wanted: Mapping[str, dict], recorded: Callable[[Path], dict | None],
                 what: str) -> set[str]:
    """The names among ``found`` whose ``recorded`` settings equal ``wanted[name]``; the rest of this program's outputs
    are removed with one line on stderr; an entry not listed in the folder's marker raises :class:`TerraInputError`
    before anything is removed."""
    found = sorted(found)
    listed = marked(out)
    foreign = [name for name in found if name not in listed]
    if foreign:
        them = "it" if len(foreign) == 1 else "them"
        raise TerraInputError(
            f"out_dir={one_line(out)} holds {', '.join(shown(n, 60) for n in foreign[:3])}"
            f"{f' and {len(foreign) - 3} more' if len(foreign) > 3 else ''}, which {APP} did not write and which "
            f"would be mistaken for its {what}; move {them} away or choose another out_dir")
    keep: set[str] = set()
    changed: dict[str, list[str]] = {}  # stale name -> the settings it was made with otherwise
    unwanted, unrecorded = [], []
    for name in found:
        record = recorded(out / name) if name in wanted else None
        if name not in wanted:
            unwanted.append(name)
        elif record is None:
            unrecorded.append(name)
        elif record == wanted[name]:
            keep.add(name)
        else:
            want = wanted[name]
            changed[name] = sorted(k for k in want.keys() | record.keys() if record.get(k) != want.get(k))
    stale = [*changed, *unwanted, *unrecorded]
    for path in (out / name for name in stale):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    leftovers = {f".{name}{end}" for name in listed - set(wanted) for end in LEFTOVERS}  # atomic writes cut short
    for entry in os.scandir(out):
        if entry.name in leftovers and entry.is_dir():
            shutil.rmtree(entry.path, ignore_errors=True)
    if stale:
        why = [f"{len(changed)} made with other {', '.join(sorted({k for keys in changed.values() for k in keys}))}"
               if changed else "", f"{len(unwanted)} that this run does not write" if unwanted else "",
               f"{len(unrecorded)} without a record of their settings" if unrecorded else ""]
        print(f"{APP}: removed {len(stale)} {what} that an earlier run left in {one_line(out)} "
              f"({'; '.join(w for w in why if w)})", file=sys.stderr, flush=True)
    return keep


DATASET_VERSION = 3  # 3: routes [x, y, s] (2: [y, x, s]; 1: the road's centre line)
META_FILE = "meta.json"
ARRAYS = ("frames", "poses", "instruction_trajs", "actions", "routes")
OPTIONAL_ARRAYS = ("routes",)  # absent from datasets written before clips carried routes
SHARD_FILES = "shard-*.npz"
SHARD_RECORD = "record"  # a shard's array of JSON text: {"settings": ..., "clips": [...]}
# what makes a shard (its _write_shard job after the path): a rerun keeps a shard made with the same
SHARD_SETTINGS = ("start", "end", "num_frames", "height", "width", "seed", "compress", "domain", "recipe")
# What a dataset's drives are (the ``recipe`` setting): each draws a Drive from (rng, num_frames, domain).
RECIPES: dict[str, Callable[[np.random.Generator, int, str], Drive]] = {
    "manoeuvres": random_drive, "long_drives": random_long_drive, "recoveries": random_recovery}
SIZES = {  # terra-make-dataset's sizes (and write_dataset's, write_driving_logs')
    "num_clips": Range(1, 10_000_000, 1000, whole=True),
    "num_frames": Range(1, MAX_FRAMES, 25, whole=True),
    "height": Range(8, 4096, 144, whole=True),
    "width": Range(8, 4096, 256, whole=True),
    "seed": SEED,
    "clips_per_shard": Range(1, 100_000, 64, whole=True),
    "workers": Range(0, 1024, 0, whole=True),
}
MAX_HELD_BYTES = 8 << 30  # the frames one writer renders before it writes them: a shard's, or a clip folder's


@dataclass
class MakeDatasetConfig:
    """terra-make-dataset's settings."""

    format: str = setting("shards", "shards: npz shards + meta.json; driving_logs: a folder per clip with PNG frames "
                                    "and trajectory.csv, for terra-prepare-logs", choices=("shards", "driving_logs"))
    out_dir: Optional[str] = setting("data/clips", "must not hold a dataset yet (a rerun of an interrupted run "
                                                   "finishes it: docs/train.md)")
    recipe: str = setting("manoeuvres", "manoeuvres: 2 s clips of single manoeuvres and lane keeping; long_drives: "
                                        "20 s drives with what closed-loop policies do (drifts, lane changes, leaving "
                                        "the road, stops, weaving, manoeuvre chains); recoveries: long drives' "
                                        "stretches whose first 3 to num_frames-1 frames are seen from off the car's "
                                        "pose (num_frames=16, the world model's window, for data.recoveries)",
                          choices=tuple(RECIPES))
    domain: str = setting("day", "day: the demo models' world; night; left_hand: mirrored, driven on the left",
                          choices=DOMAINS)
    num_clips: int = setting(1000, "clips to render", SIZES["num_clips"])
    num_frames: int = setting(25, "frames per clip at 10 Hz (Terra's window: 25)", SIZES["num_frames"])
    height: int = setting(144, "frame height in pixels", SIZES["height"])
    width: int = setting(256, "frame width in pixels", SIZES["width"])
    seed: int = setting(0, "clip i is drawn from numpy.random.default_rng([seed, i])", SIZES["seed"])
    clips_per_shard: int = setting(64, "format=shards only", SIZES["clips_per_shard"])
    workers: int = setting(0, "processes; 0 = one per CPU core", SIZES["workers"])
    compress: Any = flag(True, "format=shards only: npz deflate, about 4x smaller, slower to read")


def write_dataset(out_dir: str | Path, num_clips: int, num_frames: int, height: int, width: int, seed: int = 0,
                  clips_per_shard: int = 64, workers: int = 1, compress: bool = True, progress: bool = True,
                  domain: str = "day", recipe: str = "manoeuvres") -> Path:
    """Render ``num_clips`` random clips of ``num_frames`` frames at ``height x width`` into ``out_dir``.

    Args:
        workers: processes rendering shards (0 = one per CPU core).
        recipe: one of :data:`RECIPES`.
    """
    num_clips, num_frames, height, width, seed, clips_per_shard, workers = check_sizes(
        num_clips=num_clips, num_frames=num_frames, height=height, width=width, seed=seed,
        clips_per_shard=clips_per_shard, workers=workers)
    check_flag(compress, "compress")
    check_recipe(recipe, num_frames, domain)
    out = Path(out_dir)
    if (out / META_FILE).exists():
        raise TerraInputError(f"{out} already holds a dataset ({META_FILE}); choose a new out_dir or delete it")
    claim_output_dir(out, "out_dir", files=[META_FILE, SHARD_FILES], app=APP).record()
    jobs = [(str(out / f"shard-{k:05d}.npz"), start, min(start + clips_per_shard, num_clips), num_frames, height,
             width, seed, compress, domain, recipe) for k, start in enumerate(range(0, num_clips, clips_per_shard))]
    wanted = {Path(job[0]).name: shard_settings(job) for job in jobs}
    found = [entry.name for entry in os.scandir(out) if fnmatch.fnmatchcase(entry.name, SHARD_FILES)]
    kept = kept_outputs(out, found, wanted, lambda path: (shard_record(path) or {}).get("settings"), "shards")
    mark(out, wanted)
    done = {name: shard_record(out / name)["clips"] for name in kept}
    todo = [job for job in jobs if Path(job[0]).name not in kept]
    with Progress(num_clips, "rendering clips", "clip", enabled=progress) as bar:
        bar.update(sum(len(metas) for metas in done.values()))
        for job, metas in zip(todo, map_in_processes(_write_shard, todo, workers)):
            done[Path(job[0]).name] = metas
            bar.update(job[2] - job[1])
    meta = {"version": DATASET_VERSION, "num_clips": num_clips, "num_frames": num_frames, "height": height,
            "width": width, "fps": FRAME_RATE_HZ, "seed": seed, "domain": domain, "recipe": recipe,
            "route_points": DATASET_ROUTE_POINTS,
            "shards": [{"file": Path(job[0]).name, "num_clips": job[2] - job[1]} for job in jobs],
            "clips": [meta for name in wanted for meta in done[name]]}
    write_text(out / META_FILE, json_text(meta, indent=1))
    return out


def check_recipe(recipe: str, num_frames: int, domain: str) -> None:
    """``domain`` one of :data:`DOMAINS`, ``recipe`` one of :data:`RECIPES`, and recovery clips longer than a rollout's
    context (one line otherwise)."""
    check_choice(domain, "domain", DOMAINS)
    check_choice(recipe, "recipe", tuple(RECIPES))
    if recipe == "recoveries" and num_frames <= CONTEXT_FRAMES:
        raise TerraInputError(f"a recovery clip needs more than {CONTEXT_FRAMES} frames, a rollout's context and a "
                              f"frame after it (got num_frames={num_frames}); set num_frames to the training window")


def check_sizes(**values: Any) -> tuple[int, ...]:
    """Each size of :data:`SIZES` given, checked, as ints in order; a writer's held frames within
    :data:`MAX_HELD_BYTES`."""
    sizes = {name: SIZES[name].check(value, name) for name, value in values.items()}
    clips_held = min(sizes.get("clips_per_shard", 1), sizes["num_clips"])
    held = clips_held * sizes["num_frames"] * sizes["height"] * sizes["width"] * 3
    if held > MAX_HELD_BYTES:
        shard = f"a shard of {clips_held} clips" if clips_held > 1 else "a clip"
        raise TerraInputError(
            f"{shard} of {sizes['num_frames']} frames at {sizes['height']}x{sizes['width']} is "
            f"{past(held / 2**30, MAX_HELD_BYTES / 2**30)} GiB of frames held in memory while it is written, more "
            f"than {MAX_HELD_BYTES / 2**30:g} GiB; lower "
            f"{'clips_per_shard, ' if clips_held > 1 else ''}num_frames, height or width")
    return tuple(sizes.values())


def map_in_processes(function: Callable[..., Any], jobs: list[tuple], workers: int) -> Iterator[Any]:
    """``function(*job)`` of each job, in order, in ``workers`` processes (0 = one per core; 1 = here)."""
    workers = min(workers or usable_cores(), len(jobs))
    if workers <= 1:
        yield from (function(*job) for job in jobs)
        return
    # fork: workers inherit the imported modules instead of re-importing torch/transformers.
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        yield from pool.map(function, *zip(*jobs))


def shard_settings(job: tuple) -> dict:
    return {**dict(zip(SHARD_SETTINGS, job[1:])), "version": DATASET_VERSION, "route_points": DATASET_ROUTE_POINTS}


def shard_record(path: Path) -> dict | None:
    """A shard file's record (:data:`SHARD_RECORD`), or None for a file without a readable one."""
    try:
        with np.load(path, allow_pickle=False) as data:
            record = json.loads(str(data[SHARD_RECORD]))
    except Exception:  # noqa: BLE001  (any file that is not a shard of this version: not kept)
        return None
    ok = isinstance(record, dict) and isinstance(record.get("settings"), dict) and isinstance(record.get("clips"), list)
    return record if ok else None


def _write_shard(path: str, start: int, end: int, num_frames: int, height: int, width: int, seed: int,
                 compress: bool, domain: str, recipe: str) -> list[dict]:
    """Render clips ``[start, end)`` into one shard file, with its record; return their metadata."""
    clips = [RECIPES[recipe](np.random.default_rng([seed, i]), num_frames, domain).render(num_frames, height, width)
             for i in range(start, end)]
    arrays = {name: np.stack([getattr(c, name) for c in clips]) for name in ARRAYS}
    metas = [{"manoeuvre": c.manoeuvre, "scene_seed": c.seed, "start_s": c.start_s, "speed_kmh": c.speed_kmh,
              "scene_length_m": c.scene_length_m, "off_pose_frames": c.off_pose_frames} for c in clips]
    job = (path, start, end, num_frames, height, width, seed, compress, domain, recipe)
    record = json_text({"settings": shard_settings(job), "clips": metas})
    save = np.savez_compressed if compress else np.savez
    with atomic_path(path) as tmp:  # keeps the .npz suffix, so numpy adds none
        save(tmp, **arrays, **{SHARD_RECORD: np.array(record)})
    return metas


class ClipDataset:
    """Read a folder written by :func:`write_dataset`; ``dataset[i]`` is a :class:`~terra.sim.clips.Clip`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_path = self.path / META_FILE
        if not meta_path.is_file():
            raise TerraInputError(f"{self.path} is not a clip dataset (no {META_FILE}); run terra-make-dataset")
        self.meta = json.loads(meta_path.read_text())
        if self.meta.get("version") != DATASET_VERSION:
            raise TerraInputError(f"{meta_path} has dataset version {self.meta.get('version')}, this code reads "
                                  f"{DATASET_VERSION}; regenerate the dataset")
        self._shard_start = np.concatenate([[0], np.cumsum([s["num_clips"] for s in self.meta["shards"]])])
        self._cached: tuple[int, dict[str, np.ndarray]] | None = None

    @property
    def num_frames(self) -> int:
        return int(self.meta["num_frames"])

    @property
    def domain(self) -> str:
        """The clips' domain; older datasets are day."""
        return str(self.meta.get("domain", "day"))

    @property
    def route_points(self) -> int | None:
        """Points of each frame's route; None for a dataset without routes."""
        points = self.meta.get("route_points")
        return None if points is None else int(points)

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) of every frame."""
        return int(self.meta["height"]), int(self.meta["width"])

    def __len__(self) -> int:
        return int(self.meta["num_clips"])

    def __getitem__(self, index: int) -> Clip:
        if not -len(self) <= index < len(self):
            raise IndexError(f"clip index {index} out of range for {len(self)} clips")
        index %= len(self)
        shard = int(np.searchsorted(self._shard_start, index, side="right") - 1)
        arrays = self.shard(shard)
        row = index - int(self._shard_start[shard])
        info = self.meta["clips"][index]
        return Clip(**{name: arrays[name][row] for name in ARRAYS if name in arrays}, manoeuvre=info["manoeuvre"],
                    seed=info["scene_seed"], start_s=info["start_s"], speed_kmh=info["speed_kmh"],
                    scene_length_m=info["scene_length_m"], domain=self.domain,
                    off_pose_frames=int(info.get("off_pose_frames", 0)))

    def __iter__(self) -> Iterator[Clip]:
        return (self[i] for i in range(len(self)))

    @property
    def num_shards(self) -> int:
        return len(self.meta["shards"])

    def shard(self, k: int) -> dict[str, np.ndarray]:
        """All arrays of shard ``k`` (``frames [n, T, H, W, 3]``, ...), loaded once and kept until the next."""
        if self._cached is None or self._cached[0] != k:
            with np.load(self.path / self.meta["shards"][k]["file"], allow_pickle=False) as data:
                self._cached = (k, {name: data[name] for name in ARRAYS if name in data or name not in OPTIONAL_ARRAYS})
        return self._cached[1]
