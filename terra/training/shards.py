"""Training shards: tokenized clips of any length, grouped in safetensors files, with one index per folder."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from terra.config.checks import one_line, shown
from terra.contract.actions import NUM_ACTION_TOKENS
from terra.contract.routes import no_route
from terra.core.atomic import atomic_path, json_text, mark, write_text
from terra.core.errors import TerraInputError
from terra.sim.tokens import checked_routes
from terra.tokenizer.tensors import check_codes, check_floats

SHARDS_VERSION = 3  # 3: routes [x, y, s]
INDEX_FILE = "index.json"
SPLITS = ("train", "val")
SHARD_FILE = re.compile(r"(train|val)-\d{5}\.safetensors")
SHARD_FILES = tuple(f"{split}-*.safetensors" for split in SPLITS)  # the same names as file-name patterns


@dataclass(frozen=True)
class ShardClip:
    """One clip of a shard: its id (the clip folder's name) and how many frames it holds."""

    id: str
    frames: int
    inputs: dict[str, str] = field(default_factory=dict, compare=False)  # what it was made from, by part


@dataclass(frozen=True)
class ShardEntry:
    file: str
    split: str
    clips: tuple[ShardClip, ...]


@dataclass
class ShardIndex:
    """The folder's ``index.json``: what every shard holds and what tokenized it."""

    codebook_size: int
    grid: tuple[int, int]
    image_size: tuple[int, int]
    frame_rate_hz: float
    tokenizer: str
    routes: str = "road"  # where the clips' routes come from (module docstring)
    shards: list[ShardEntry] = field(default_factory=list)
    index_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # carried by every shard of the index

    def clip_ids(self) -> set[str]:
        return {clip.id for entry in self.shards for clip in entry.clips}

    def to_json(self) -> dict[str, Any]:
        return {"version": SHARDS_VERSION, "index_id": self.index_id, **asdict(self)}


def read_index(folder: str | Path) -> ShardIndex:
    """Read ``folder/index.json``; one line also names a listed shard that is not whole."""
    index, damaged = open_shards(folder)
    for file, why in damaged.items():
        raise TerraInputError(f"{Path(folder) / INDEX_FILE} lists shard {file}, which {why}; prepare the shards "
                              "again into a new folder")
    return index


def open_shards(folder: str | Path) -> tuple[ShardIndex, dict[str, str]]:
    """``folder/index.json`` and why each listed shard whose file is not what it lists is damaged."""
    path = Path(folder) / INDEX_FILE
    if not path.is_file():
        raise TerraInputError(f"{folder} has no {INDEX_FILE}; prepare shards with terra-prepare-logs")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw["version"] != SHARDS_VERSION:
            raise ValueError(f"version {raw['version']}, expected {SHARDS_VERSION}")
        shards = [ShardEntry(str(e["file"]), str(e["split"]),
                             tuple(ShardClip(str(c["id"]), int(c["frames"]), dict(c.get("inputs") or {}))
                                   for c in e["clips"]))
                  for e in raw["shards"]]
        for entry in shards:
            match = SHARD_FILE.fullmatch(entry.file)
            if not match or match.group(1) != entry.split:
                raise ValueError(f"shard file {shown(entry.file)} of split {shown(entry.split)} is not a shard's name")
        index = ShardIndex(int(raw["codebook_size"]), tuple(raw["grid"]), tuple(raw["image_size"]),
                           float(raw["frame_rate_hz"]), str(raw["tokenizer"]), str(raw.get("routes", "road")), shards,
                           str(raw["index_id"]))
    except (ValueError, KeyError, TypeError) as err:
        raise TerraInputError(f"{path} is not a shard index of version {SHARDS_VERSION} ({err}); "
                              "prepare the shards again with terra-prepare-logs") from None
    seen: dict[str, str] = {}
    for entry in shards:
        if not (Path(folder) / entry.file).is_file():
            raise TerraInputError(f"{path} lists shard {entry.file}, which is missing from {folder}; restore it, or "
                                  "prepare the shards again into a new folder")
        for clip in entry.clips:
            if clip.id in seen:
                raise TerraInputError(f"{path} lists clip {shown(clip.id)} in two shards ({seen[clip.id]} and "
                                      f"{entry.file}); prepare the shards again into a new folder")
            seen[clip.id] = entry.file
    damaged = {entry.file: why for entry in shards if (why := shard_damage(folder, index, entry))}
    if shards and all(why == FOREIGN for why in damaged.values()) and len(damaged) == len(shards):
        raise TerraInputError(f"{path} is not the index its shards were written with (none carries its id): another "
                              "folder's index; restore this folder's index.json, or prepare the shards again into a "
                              "new folder")
    return index, damaged


FOREIGN = "was written for another index"


def shard_damage(folder: str | Path, index: ShardIndex, entry: ShardEntry) -> str | None:
    """Why the shard file of ``entry`` is not what ``index`` lists, from its header alone; None: it is."""
    try:
        with safe_open(str(Path(folder) / entry.file), "np") as shard:
            metadata = shard.metadata() or {}
            lengths = shard.get_tensor("clip_lengths").tolist()
            shapes = {name: shard.get_slice(name).get_shape() for name in ("codes", "actions")}
    except (SafetensorError, OSError, KeyError, ValueError) as err:
        return f"cannot be read ({one_line(str(err))[:80]})"
    if metadata.get("index_id") != index.index_id:
        return FOREIGN
    frames = sum(c.frames for c in entry.clips)
    if (metadata.get("clips") != json.dumps([c.id for c in entry.clips]) or lengths != [c.frames for c in entry.clips]
            or shapes["codes"][:1] != [frames] or shapes["actions"][:1] != [frames]):
        return "holds other clips than the index lists"
    return None


def write_shard(folder: str | Path, index: ShardIndex, split: str, clips: list[tuple[str, np.ndarray, np.ndarray]],
                routes: list[np.ndarray | None] | None = None, inputs: dict[str, dict[str, str]] | None = None
                ) -> ShardEntry:
    """Add one shard of ``clips`` (``(id, codes [T, h, w], actions [T, 6, 3])``, ``routes [T, M, 3]``) to the index."""
    folder = Path(folder)
    number = 1 + max((int(e.file[len(split) + 1:-len(".safetensors")]) for e in index.shards if e.split == split),
                     default=-1)
    name = f"{split}-{number:05d}.safetensors"
    dtype = np.int16 if index.codebook_size <= np.iinfo(np.int16).max + 1 else np.int32
    tensors = {
        "codes": np.ascontiguousarray(np.concatenate([c for _, c, _ in clips]), dtype=dtype),
        "actions": np.ascontiguousarray(np.concatenate([a for _, _, a in clips]), dtype=np.float32),
        "clip_lengths": np.array([len(c) for _, c, _ in clips], dtype=np.int64),
    }
    given = [r for r in routes or () if r is not None]
    if given:
        rows = [no_route(len(c), given[0].shape[1]) if r is None else r for (_, c, _), r in zip(clips, routes)]
        tensors["routes"] = np.ascontiguousarray(np.concatenate(rows), dtype=np.float32)
    entry = ShardEntry(name, split, tuple(ShardClip(cid, len(codes), (inputs or {}).get(cid, {}))
                                          for cid, codes, _ in clips))
    folder.mkdir(parents=True, exist_ok=True)
    mark(folder, (INDEX_FILE, name))
    _save(folder / name, tensors, index, entry)
    index.shards.append(entry)
    write_text(folder / INDEX_FILE, json_text(index.to_json(), indent=1) + "\n")
    return entry


def _save(path: Path, tensors: dict[str, np.ndarray], index: ShardIndex, entry: ShardEntry) -> None:
    metadata = {"index_id": index.index_id, "clips": json.dumps([c.id for c in entry.clips])}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def drop_clips(folder: str | Path, index: ShardIndex, ids: set[str], damaged: Iterable[str] = ()) -> None:
    """Take the clips ``ids`` and the ``damaged`` shard files out of ``folder``'s shards and index."""
    folder, damaged = Path(folder), set(damaged)
    kept, rewrite, remove = [], [], []
    for entry in index.shards:
        keep = [c.id not in ids for c in entry.clips]
        if entry.file not in damaged and all(keep):
            kept.append(entry)
        elif entry.file not in damaged and any(keep):
            kept.append(ShardEntry(entry.file, entry.split, tuple(c for c, k in zip(entry.clips, keep) if k)))
            rewrite.append((entry, kept[-1], keep))
        else:
            remove.append(entry.file)
    index.shards = kept
    write_text(folder / INDEX_FILE, json_text(index.to_json(), indent=1) + "\n")
    for file in remove:
        (folder / file).unlink(missing_ok=True)
    for before, after, keep in rewrite:
        tensors = load_file(str(folder / before.file))
        rows = np.repeat(keep, [c.frames for c in before.clips])
        _save(folder / after.file, {name: np.ascontiguousarray(t[keep] if name == "clip_lengths" else t[rows])
                                    for name, t in tensors.items()}, index, after)


def read_shard(folder: str | Path, index: ShardIndex, entry: ShardEntry
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Codes ``[F, h, w]`` int64, actions ``[F, 6, 3]`` and routes ``[F, M, 3]`` (or None) of one shard, checked."""
    path = Path(folder) / entry.file
    try:
        tensors = load_file(str(path))
        codes, actions, lengths = tensors["codes"], tensors["actions"], tensors["clip_lengths"]
    except (SafetensorError, OSError, KeyError) as err:
        raise TerraInputError(f"shard {path} cannot be read ({err}); prepare the shards again") from None
    expected = [c.frames for c in entry.clips]
    if (lengths.tolist() != expected or codes.shape != (sum(expected), *index.grid)
            or actions.shape != (len(codes), NUM_ACTION_TOKENS, 3)):
        raise TerraInputError(f"shard {path} does not hold what {INDEX_FILE} lists; prepare the shards again")
    fix = "the shard is damaged: prepare the shards again"
    check_codes(codes, f"shard {path}: tensor codes", index.codebook_size, fix)
    check_floats(actions, f"shard {path}: tensor actions", fix)
    routes = tensors.get("routes")
    if routes is not None:
        routes = checked_routes(routes, (len(codes),), f"shard {path}: tensor routes", fix)
    return codes.astype(np.int64), actions, routes
