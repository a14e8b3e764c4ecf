"""Frames → files for ``terra-generate`` and the batch writer: overlays, one file per format, and a run's videos,
grid and sidecar (nothing stays when writing fails)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from terra.config.outputs import OutputNames, OutputSpec
from terra.contract.routes import NONE_GIVEN, TOLD
from terra.decoder.overlay import draw_trajectory, mark_frames
from terra.decoder.sidecar import write_sidecar
from terra.decoder.writers import write_grid, write_png_sequence, write_video
from terra.metrics import psnr

if TYPE_CHECKING:
    from terra.pipeline import RolloutResult


def shown_frames(frames: np.ndarray, actions: np.ndarray, num_context: int, mark_context: bool,
                 overlay_trajectory: bool, routes: np.ndarray | None = None) -> np.ndarray:
    """The frames as written: commanded path and told ``routes`` (``[T, K, 3]``, None: none) drawn on, context
    marked."""
    if overlay_trajectory:
        frames = draw_trajectory(frames, actions[: len(frames)], routes=routes)
    if mark_context:
        frames = mark_frames(frames, num_context)
    return frames


def route_record(routes: np.ndarray | None, source: str | None, frames: int,
                 told: Sequence[str] | None = None) -> dict[str, Any]:
    """What a sidecar says of a rollout's routes: ``route``, whether any frame was told one (by content)."""
    if routes is None:
        return {"route": False, "route_source": None, "ego_routes": None, "route_told": [NONE_GIVEN] * frames}
    routes = np.asarray(routes, dtype=np.float64)[:frames]
    finite = [bool(np.isfinite(route).all()) for route in routes] + [False] * (frames - len(routes))
    verdicts = list(told or ())[:frames]
    verdicts += [TOLD if ok else NONE_GIVEN for ok in finite[len(verdicts):]]
    ego = [np.round(route[:, :2], 3).tolist() if ok else None for route, ok in zip(routes, finite)]
    return {"route": any(finite), "route_source": source, "ego_routes": ego + [None] * (frames - len(ego)),
            "route_told": verdicts}


def write_formats(paths: Mapping[str, Path], frames: np.ndarray, fps: float, written: list[Path]) -> None:
    """Write ``frames`` once per format, ``{"mp4": file, "gif": file, "png": folder}``."""
    for fmt, path in paths.items():
        if fmt == "png":
            written += write_png_sequence(path, frames)
        else:
            written.append(write_video(path, frames, fps=fps))


def write_outputs(
    out_dir: Path,
    output: OutputSpec,
    names: OutputNames,
    results: Sequence[RolloutResult],
    actions: np.ndarray,
    config: dict,
    timings: dict[str, float],
    ground_truth: np.ndarray | None = None,
    route_source: str | None = None,
    route_told: Sequence[str] | None = None,
    **record: Any,
) -> list[Path]:
    """Write every rollout's videos and one sidecar for the run, as ``output`` says, named as ``names`` plans."""
    out_dir.mkdir(parents=True, exist_ok=True)  # claimed by the app
    files: list[Path] = []
    new_folders = [out_dir / name for name in names.folders if not (out_dir / name).exists()]
    try:
        _write_videos(out_dir, output, names, results, actions, files)
        rollouts: list[dict[str, Any]] = []
        for result in results:
            entry = {"seed": result.request.seed, "num_context": result.num_context,
                     "num_generated": len(result.codes) - result.num_context, "decoding": result.pass_record(),
                     **route_record(result.request.routes, route_source, len(result.codes), route_told),
                     "codes": result.codes}
            if ground_truth is not None and result.frames.shape[1:] == ground_truth.shape[1:]:  # not refined
                entry["psnr_db_per_generated_frame"] = psnr(result.frames[result.num_context :], ground_truth)
            rollouts.append(entry)
        sidecar = write_sidecar(
            out_dir / names.sidecar, config=config, seed=results[0].request.seed, actions=actions,
            timings=timings, rollouts=rollouts, files=[str(f.relative_to(out_dir)) for f in files], **record,
        )
    except BaseException:
        for path in files:
            path.unlink(missing_ok=True)
        for folder in new_folders:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return files + [sidecar]


def _write_videos(out_dir: Path, output: OutputSpec, names: OutputNames, results: Sequence[RolloutResult],
                  actions: np.ndarray, files: list[Path]) -> None:
    """Each rollout's videos / PNG frames and the grid; every path is added to ``files`` once written."""
    shown = []
    for result, sample in zip(results, names.samples):
        frames = shown_frames(result.frames, actions, result.num_context, output.mark_context,
                              output.overlay_trajectory, result.request.routes)
        shown.append(frames)
        write_formats({fmt: out_dir / name for fmt, name in sample.items()}, frames, output.fps, files)
    for _, name in names.grids:
        files.append(write_grid(out_dir / name, shown, fps=output.fps))
