"""Tokenized clips in one safetensors file: ``codes`` ``[N, T, h, w]``, ``actions`` ``[N, T, 6, 3]``, ``poses``
``[N, T, 3]``, optional ``routes`` ``[N, T, M, 3]`` and ``off_pose_frames`` ``[N]``, and metadata."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from terra.contract.routes import ROUTE_POINT_VALUES, validate_routes
from terra.core.atomic import atomic_path, mark
from terra.core.errors import TerraInputError
from terra.tokenizer.tensors import check_codes, check_floats

TOKENS_VERSION = "2"  # 2: routes [x, y, s]


@dataclass(frozen=True)
class TokenizedClips:

    codes: np.ndarray  # [N, T, h, w] integer codes in [0, codebook_size)
    actions: np.ndarray  # [N, T, 6, 3] float32
    poses: np.ndarray  # [N, T, 3] float64 world poses
    codebook_size: int
    image_size: tuple[int, int]  # (H, W) of the frames that were encoded
    source: str = ""
    tokenizer: str = ""
    routes: np.ndarray | None = None  # [N, T, M, 3] float32 each frame's route; None: the clips have none
    off_pose_frames: np.ndarray | None = None  # [N] int each clip's first frames seen from off the car's pose; None: 0

    @property
    def grid_shape(self) -> tuple[int, int]:
        return int(self.codes.shape[2]), int(self.codes.shape[3])


def save_tokens(path: str | Path, clips: TokenizedClips) -> Path:
    """Write ``clips`` to ``path`` atomically (temporary file in the same folder, then rename)."""
    path = Path(path)
    dtype = np.int16 if clips.codebook_size <= np.iinfo(np.int16).max + 1 else np.int32
    arrays = {"codes": (clips.codes, dtype), "actions": (clips.actions, np.float32), "poses": (clips.poses, np.float64),
              "routes": (clips.routes, np.float32), "off_pose_frames": (clips.off_pose_frames, np.int32)}
    tensors = {name: np.ascontiguousarray(array, dtype=kind) for name, (array, kind) in arrays.items()
               if array is not None}
    metadata = {"version": TOKENS_VERSION, "codebook_size": str(clips.codebook_size),
                "image_height": str(clips.image_size[0]), "image_width": str(clips.image_size[1]),
                "source": clips.source, "tokenizer": clips.tokenizer}
    path.parent.mkdir(parents=True, exist_ok=True)
    mark(path.parent, [path.name])  # the toolkit's file: a later run may replace it
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return path


def load_tokens(path: str | Path) -> TokenizedClips:
    """Read a file written by :func:`save_tokens`, its codes, actions, poses and routes checked."""
    path = Path(path)
    if not path.is_file():
        raise TerraInputError(f"tokenized clips {path} do not exist; run terra-tokenize first")
    try:
        with safe_open(str(path), framework="numpy") as fh:
            meta = fh.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise TerraInputError(f"tokenized clips {path} cannot be read ({err}); re-run terra-tokenize") from None
    if meta.get("version") != TOKENS_VERSION or not {"codes", "actions", "poses"} <= tensors.keys():
        raise TerraInputError(f"{path} is not a tokenized-clips file of version {TOKENS_VERSION}; re-run "
                              "terra-tokenize")
    try:
        codebook_size = int(meta["codebook_size"])
    except (KeyError, ValueError):
        raise TerraInputError(f"{path} names no codebook size; re-run terra-tokenize") from None
    fix = "the file is damaged: re-run terra-tokenize"
    check_codes(tensors["codes"], f"tokenized clips {path}: tensor codes", codebook_size, fix)
    for name in ("actions", "poses"):
        check_floats(tensors[name], f"tokenized clips {path}: tensor {name}", fix)
    routes = tensors.get("routes")
    if routes is not None:
        routes = checked_routes(routes, tensors["codes"].shape[:2], f"tokenized clips {path}: tensor routes", fix)
    num_clips, num_frames = tensors["codes"].shape[:2]
    off_pose = tensors.get("off_pose_frames", np.zeros(num_clips, dtype=np.int32))
    if off_pose.shape != (num_clips,) or off_pose.dtype != np.int32 or off_pose.min(initial=0) < 0 \
            or off_pose.max(initial=0) > num_frames:
        raise TerraInputError(f"tokenized clips {path}: tensor off_pose_frames is not {num_clips} int32 counts in "
                              f"[0, {num_frames}]; {fix}")
    return TokenizedClips(codes=tensors["codes"].astype(np.int64), actions=tensors["actions"], poses=tensors["poses"],
                          codebook_size=codebook_size, image_size=(int(meta["image_height"]), int(meta["image_width"])),
                          source=meta.get("source", ""), tokenizer=meta.get("tokenizer", ""), routes=routes,
                          off_pose_frames=off_pose.astype(np.int64))


def checked_routes(routes: np.ndarray, frames: tuple[int, ...], where: str, fix: str) -> np.ndarray:
    """Routes ``[*frames, M, 3]`` (``M >= 2``) from a training file, checked and returned float32; each frame's route is
    all NaN ("no route") or finite and in reach; ``where`` names the tensor, ``fix`` ends the line."""
    shape = tuple(routes.shape)
    if shape[:-2] != tuple(frames) or len(shape) != len(frames) + 2 or shape[-2] < 2 or shape[-1] != ROUTE_POINT_VALUES:
        wanted = ", ".join(str(n) for n in frames)
        raise TerraInputError(f"{where} has shape {list(shape)}, not [{wanted}, points >= 2, {ROUTE_POINT_VALUES}]; "
                              f"{fix}")
    flat = routes.reshape(-1, shape[-2], shape[-1])
    told = ~np.isnan(flat).all(axis=(1, 2)) if flat.dtype.kind == "f" else np.ones(len(flat), dtype=bool)
    check_floats(flat[told], where, fix)
    out = np.full(flat.shape, np.nan, dtype=np.float32)
    if told.any():
        out[told] = validate_routes(flat[told], shape[-2], where)
    return out.reshape(shape)
