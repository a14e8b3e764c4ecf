"""Write the files of a generation run: videos per rollout (and a grid of them), PNG frames, the JSON sidecar.

The checks (:func:`check_output`, :func:`output_file_names`, :func:`prepare_output_dir`) run before any model
loads and import nothing heavy; :func:`write_outputs` leaves nothing of a run that fails or is interrupted
while writing.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from decoder.overlay import draw_trajectory, mark_frames
from decoder.sidecar import write_sidecar
from decoder.writers import check_fps, write_grid, write_png_sequence, write_video
from terra.errors import TerraInputError
from terra.metrics import psnr
from terra.validation import check_output_dir

if TYPE_CHECKING:
    from terra.pipeline import RolloutResult

FORMATS = ("gif", "mp4", "png")


def check_output_formats(formats: Sequence[str] | str, distinct: bool = False) -> list[str]:
    """Validate ``output.formats`` before any work is done (a single name counts as a list of one).

    ``distinct``: each name at most once (batch rollouts write one file per format and sample).
    """
    formats = [formats] if isinstance(formats, str) else list(formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats or (distinct and len(set(formats)) != len(formats)):
        what = "a non-empty list of distinct names from" if distinct else "a non-empty list drawn from"
        raise TerraInputError(f"output.formats {formats} must be {what} {list(FORMATS)}")
    return formats


def check_output(output) -> None:
    """Validate the ``output`` settings (formats, fps, name, flags) before any work is done."""
    check_output_formats(output.formats)
    check_fps(output.fps, "output.fps")
    name = output.name
    if not isinstance(name, str) or name.strip(".") == "" or "/" in name or "\\" in name or "\0" in name:
        raise TerraInputError(
            f"output.name {name!r} must be a plain file name such as rollout; choose the folder with output.dir"
        )
    for flag in ("mark_context", "overlay_trajectory"):
        if not isinstance(output[flag], bool):
            raise TerraInputError(f"output.{flag} must be true or false (got {output[flag]!r})")


def output_file_names(output, num_samples: int) -> list[str]:
    """The names :func:`write_outputs` gives its files and folders in the output folder."""
    formats = check_output_formats(output.formats)
    stems = [output.name] if num_samples == 1 else [f"{output.name}_{i:02d}" for i in range(num_samples)]
    names = [f"{stem}_frames" if fmt == "png" else f"{stem}.{fmt}" for stem in stems for fmt in formats]
    if num_samples > 1:
        names += [f"{output.name}_grid.{fmt}" for fmt in formats if fmt != "png"]
    return names + [f"{output.name}.json"]


def prepare_output_dir(out_dir: Path, file_names: Sequence[str] = ()) -> None:
    """Create ``out_dir`` or fail with one clear line when it cannot be written or ``file_names`` do not fit
    the file system there."""
    check_output_dir(out_dir, file_names)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".terra-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise TerraInputError(f"output folder {out_dir} is not writable ({err.strerror}); choose another output.dir") from None


def write_outputs(
    out_dir: Path,
    output,
    results: Sequence[RolloutResult],
    actions: np.ndarray,
    config: dict,
    timings: dict[str, float],
    ground_truth: np.ndarray | None = None,
    **record: Any,
) -> list[Path]:
    """Write every rollout's videos and one sidecar describing the run; return the written paths.

    ``output`` carries ``name``, ``formats``, ``fps``, ``mark_context`` and ``overlay_trajectory``;
    ``ground_truth`` (uint8 ``[num_frames, H, W, 3]``), when known, adds per-frame PSNR to the sidecar;
    ``record`` adds fields to the sidecar. When a write fails or is interrupted, the files and frame folders
    written so far are removed before the error propagates.
    """
    formats = check_output_formats(output.formats)
    prepare_output_dir(out_dir)
    files: list[Path] = []
    new_folders = [out_dir / name for name in output_file_names(output, len(results))
                   if name.endswith("_frames") and not (out_dir / name).exists()]
    try:
        _write_videos(out_dir, output, formats, results, actions, files)
        rollouts: list[dict[str, Any]] = []
        for result in results:
            entry = {"seed": result.request.seed, "num_context": result.num_context,
                     "num_generated": len(result.codes) - result.num_context, "codes": result.codes}
            if ground_truth is not None and result.frames.shape[1:] == ground_truth.shape[1:]:  # not refined
                entry["psnr_db_per_generated_frame"] = psnr(result.frames[result.num_context :], ground_truth)
            rollouts.append(entry)
        sidecar = write_sidecar(
            out_dir / f"{output.name}.json", config=config, seed=results[0].request.seed, actions=actions,
            timings=timings, rollouts=rollouts, files=[str(f.relative_to(out_dir)) for f in files], **record,
        )
    except BaseException:
        for path in files:
            path.unlink(missing_ok=True)
        for folder in new_folders:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return files + [sidecar]


def _write_videos(out_dir: Path, output, formats: list[str], results: Sequence[RolloutResult],
                  actions: np.ndarray, files: list[Path]) -> None:
    """Each rollout's videos / PNG frames and the grid; every path is added to ``files`` once written."""
    shown = []
    for i, result in enumerate(results):
        frames = result.frames
        if output.overlay_trajectory:
            frames = draw_trajectory(frames, actions[: len(frames)])
        if output.mark_context:
            frames = mark_frames(frames, result.num_context)
        shown.append(frames)
        stem = output.name if len(results) == 1 else f"{output.name}_{i:02d}"
        for fmt in formats:
            if fmt == "png":
                files += write_png_sequence(out_dir / f"{stem}_frames", frames)
            else:
                files.append(write_video(out_dir / f"{stem}.{fmt}", frames, fps=output.fps))
    if len(results) > 1:
        for fmt in (f for f in formats if f != "png"):
            files.append(write_grid(out_dir / f"{output.name}_grid.{fmt}", shown, fps=output.fps))
