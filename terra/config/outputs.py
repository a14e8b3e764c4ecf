"""What a run writes, checked before any work: output formats, and the names of ``terra-generate``'s files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from terra.config.checks import check_flag
from terra.core.errors import TerraInputError
from terra.decoder.writers import check_fps, ffmpeg_exe

FORMATS = ("gif", "mp4", "png")


def check_output_formats(formats: Sequence[str] | str, distinct: bool = False) -> list[str]:
    """Validate ``output.formats`` (a single name is a list of one); ``distinct``: each at most once; mp4 needs ffmpeg.
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
    """``terra-generate``'s ``output`` block, checked: file stem, formats, frame rate, overlays."""

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

    def names(self, num_samples: int) -> OutputNames:
        """The run's names for ``num_samples`` samples: a stem per sample (``name`` or ``name_00``...), grids, sidecar.
        """
        stems = [self.name] if num_samples == 1 else [f"{self.name}_{i:02d}" for i in range(num_samples)]
        samples = [[(fmt, f"{stem}_frames" if fmt == "png" else f"{stem}.{fmt}") for fmt in self.formats]
                   for stem in stems]
        grids = tuple((fmt, f"{self.name}_grid.{fmt}") for fmt in self.formats if fmt != "png" and num_samples > 1)
        return OutputNames(tuple(dict(sample) for sample in samples), grids, f"{self.name}.json")


@dataclass(frozen=True)
class OutputNames:
    """A ``terra-generate`` run's names in its output folder, each made once."""

    samples: tuple[dict[str, str], ...]  # each sample's file (mp4, gif) or PNG folder (png), by format
    grids: tuple[tuple[str, str], ...]  # (format, file) of the grid video of several samples, per format (no png)
    sidecar: str  # the run's JSON sidecar

    @property
    def files(self) -> tuple[str, ...]:
        """Every file above, in the order written, the sidecar last."""
        return tuple(name for fmt, name in self._by_format() if fmt != "png") + (self.sidecar,)

    @property
    def folders(self) -> tuple[str, ...]:
        return tuple(name for fmt, name in self._by_format() if fmt == "png")

    def _by_format(self) -> list[tuple[str, str]]:
        """(format, name) of each sample's outputs, then of the grids, in the order written."""
        return [*(pair for sample in self.samples for pair in sample.items()), *self.grids]
