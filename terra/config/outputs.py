"""Where a run writes, checked before any work: output formats and names, the output folder and its disk.

:class:`OutputSpec` is ``terra-generate``'s ``output`` block checked once; batch rollouts check their own
naming (terra/batch/config.py) with :func:`check_output_formats` and :func:`check_output_names`. Output names
must fit the file system with the temporary suffix of an atomic write (:data:`ATOMIC_EXTRA`), and the output
disk must have :data:`MIN_FREE_BYTES` free (a disk that fills up later fails at the write). Nothing here
creates a file; the rule on what an output folder may hold and replace is terra/config/output_dir.py's.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from terra.config.checks import check_flag, shown
from terra.core.errors import TerraInputError
from terra.decoder.writers import check_fps, ffmpeg_exe

MIN_FREE_BYTES = 1 << 20  # an output folder's disk needs at least this much room before any work starts
ATOMIC_EXTRA = len(".") + len(".XXXXXXXX.tmp")  # terra/core/atomic.py writes ".<stem>.<8 chars>.tmp<suffix>" first
FORMATS = ("gif", "mp4", "png")



def check_output_formats(formats: Sequence[str] | str, distinct: bool = False) -> list[str]:
    """Validate ``output.formats`` before any work is done (a single name counts as a list of one).

    ``distinct``: each name at most once (batch rollouts write one file per format and sample). ``mp4`` needs an
    ffmpeg that runs (:func:`terra.decoder.writers.ffmpeg_exe`): without one a run would generate and then fail every
    write.
    """
    formats = [formats] if isinstance(formats, str) else list(formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats or (distinct and len(set(formats)) != len(formats)):
        what = "a non-empty list of distinct names from" if distinct else "a non-empty list drawn from"
        raise TerraInputError(f"output.formats {formats} must be {what} {list(FORMATS)}")
    if "mp4" in formats:
        ffmpeg_exe()
    return formats


@dataclass(frozen=True)
class OutputSpec:
    """The ``output`` block of ``terra-generate`` (conf/generate.yaml), checked: file stem, formats, frame rate
    and what is drawn on the frames. The folder is the app's (``output.dir`` or Hydra's run folder)."""

    name: str
    formats: tuple[str, ...]
    fps: float
    mark_context: bool
    overlay_trajectory: bool

    @classmethod
    def from_mapping(cls, output: Any) -> "OutputSpec":
        """Check the block's values once (formats, fps, a plain file name, flags)."""
        name = output["name"]
        if not isinstance(name, str) or name.strip(".") == "" or "/" in name or "\\" in name or "\0" in name:
            raise TerraInputError(
                f"output.name {name!r} must be a plain file name such as rollout; choose the folder with output.dir"
            )
        return cls(name, tuple(check_output_formats(output["formats"])), check_fps(output["fps"], "output.fps"),
                   check_flag(output["mark_context"], "output.mark_context"),
                   check_flag(output["overlay_trajectory"], "output.overlay_trajectory"))

    def stems(self, num_samples: int) -> list[str]:
        """One file stem per sample: ``name``, or ``name_00``, ``name_01``, ... for several."""
        return [self.name] if num_samples == 1 else [f"{self.name}_{i:02d}" for i in range(num_samples)]

    @staticmethod
    def file_name(stem: str, fmt: str) -> str:
        """A rollout's file in format ``fmt``: ``stem.mp4``, ``stem.gif``, or the PNG folder ``stem_frames``."""
        return f"{stem}_frames" if fmt == "png" else f"{stem}.{fmt}"

    def file_names(self, num_samples: int) -> list[str]:
        """The names terra/outputs.py gives its files and folders in the output folder, sidecar last."""
        names = [self.file_name(stem, fmt) for stem in self.stems(num_samples) for fmt in self.formats]
        if num_samples > 1:
            names += [f"{self.name}_grid.{fmt}" for fmt in self.formats if fmt != "png"]
        return names + [f"{self.name}.json"]


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def check_output_dir(path: str | os.PathLike, file_names: Iterable[str] = (), setting: str = "output.dir") -> Path:
    """Check, without creating anything, that folder ``path`` can be created or written and that ``file_names``
    fit the file system there (with the temporary suffix of an atomic write); return it as an absolute path."""
    folder = Path(os.path.abspath(Path(path).expanduser()))
    existing = folder
    while not os.path.lexists(existing):
        existing = existing.parent
    if not existing.is_dir():
        raise TerraInputError(f"output folder {path} is not writable ({existing} is not a folder); "
                              f"choose another {setting}")
    name_max, path_max = _limit(existing, "PC_NAME_MAX", 255), _limit(existing, "PC_PATH_MAX", 4096)
    parts = [(p, 0) for p in folder.relative_to(existing).parts] + [(n, ATOMIC_EXTRA) for n in file_names]
    for name, extra in parts:
        size = len(os.fsencode(name)) + extra
        if size > name_max:
            what = "the output file name" if extra else "the folder name"
            fix = "a shorter output.name" if extra else f"a shorter {setting}"
            raise TerraInputError(f"{what} {shown(name)} is too long: {size} bytes"
                                  f"{' with its temporary suffix' * bool(extra)}, more than the file system allows "
                                  f"({name_max}); choose {fix}")
    longest = max([len(os.fsencode(n)) + ATOMIC_EXTRA for n in file_names] or [0])
    if len(os.fsencode(str(folder))) + 1 + longest > path_max:
        raise TerraInputError(f"output folder {shown(str(path))} makes paths longer than the file system allows "
                              f"({path_max} bytes); choose a shorter {setting}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TerraInputError(f"output folder {path} is not writable ({existing} cannot be written); "
                              f"choose another {setting}")
    usage = shutil.disk_usage(existing)
    if usage.total == 0:  # /proc, /sys: a kernel interface, not storage
        raise TerraInputError(f"output folder {path} is not on a disk ({existing} is on a virtual file system that "
                              f"holds no files); choose another {setting}")
    free = usage.free
    if free < MIN_FREE_BYTES:
        raise TerraInputError(f"output folder {path} is on a full disk ({free >> 10} KiB free); free some space "
                              f"or choose another {setting}")
    return folder


def check_output_names(folder: str | os.PathLike, names: Iterable[str], what: str = "output file") -> None:
    """Raise unless each of ``names`` (paths relative to ``folder``, e.g. from a naming pattern) is text the file
    system takes there: no NUL or lone surrogate, each part at most ``NAME_MAX`` bytes (the last with the
    temporary suffix of an atomic write) and the whole path at most ``PATH_MAX``. Nothing is created."""
    base = Path(os.path.abspath(Path(folder).expanduser()))
    existing = base
    while not os.path.lexists(existing):
        existing = existing.parent
    name_max, path_max = _limit(existing, "PC_NAME_MAX", 255), _limit(existing, "PC_PATH_MAX", 4096)
    for name in names:
        try:
            encoded = os.fsencode(name)
        except UnicodeEncodeError:
            raise TerraInputError(f"{what} name {shown(name)} is not valid text (a lone surrogate escape)") from None
        if b"\0" in encoded:
            raise TerraInputError(f"{what} name {shown(name)} holds a NUL character")
        parts = Path(name).parts
        for i, part in enumerate(parts):
            size = len(os.fsencode(part)) + (ATOMIC_EXTRA if i == len(parts) - 1 else 0)
            if size > name_max:
                raise TerraInputError(f"{what} name {shown(part)} is too long: {size} bytes with its temporary "
                                      f"suffix, more than the file system allows ({name_max})")
        if len(os.fsencode(str(base))) + 1 + len(encoded) + ATOMIC_EXTRA > path_max:
            raise TerraInputError(f"{what} {shown(name)} makes a path longer than the file system allows "
                                  f"({path_max} bytes) in {shown(str(base))}")
