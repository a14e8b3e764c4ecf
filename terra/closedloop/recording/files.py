"""A drive's files (video, top-down picture, JSON) and manifest line, written here or by writer processes."""

from __future__ import annotations

import hashlib
import io
import os
import sys
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm.auto import tqdm

from terra.closedloop.loop import Drive, DriveSpec
from terra.closedloop.outcomes.alpasim import alpasim_metrics
from terra.closedloop.outcomes.frames import measure_device, measure_frames
from terra.closedloop.outcomes.mapless import drive_metrics
from terra.closedloop.outcomes.truth import truth_metrics
from terra.closedloop.scenarios import Scenario
from terra.config.checks import shown
from terra.config.files import content_digest, load_json
from terra.config.manifest import MANIFEST, summary_name
from terra.config.output_dir import Inputs, OutputDir, claim_output_dir
from terra.config.spec import changed_inputs, fingerprint as spec_fingerprint
from terra.contract.routes import TOLD, route_distances
from terra.core.atomic import atomic_path, json_text, whole_files, write_text, written
from terra.core.errors import TerraInputError
from terra.decoder.sidecar import to_jsonable
from terra.decoder.writers import write_video
from terra.inputs.ego_motion import to_world


MARGIN_M = 30.0
ROUTE_EVERY = 10  # frames: a route a second
ROUTE_POINTS = 16
ROUTE_COLOR = "#ff3ce6"
PATH_COLOR = "#1f6fd0"


def topdown_png(drive: Drive) -> bytes:
    """The drive's top-down picture as PNG bytes (matplotlib's Agg canvas, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    from terra.sim.scene import scene_road

    poses, scenario = drive.world_poses(), drive.spec.scenario
    shown = [poses[:, :2]]
    figure = Figure(figsize=(6, 6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    road = scenario.road if scenario.road is not None or scenario.scene is None else scene_road(scenario.scene)
    if road is not None:  # the map's road, else the scene's
        axes.add_collection(LineCollection(list(road.boundaries), colors="0.2", linewidths=1.5, label="road edge"))
        axes.add_collection(LineCollection([road.lane_points(i) for i in range(len(road))], colors="0.6",
                                           linewidths=0.8, linestyles="--", label="lane centres"))
    if drive.route_source is not None and drive.route_source == scenario.route_source:
        at = poses[::ROUTE_EVERY]
        routes = scenario.model_routes(at, ROUTE_POINTS)
        lines = [to_world(route[:, :2], pose) for route, pose in zip(routes, at) if np.isfinite(route).all()]
        shown += lines
        axes.add_collection(LineCollection(lines, colors=ROUTE_COLOR, linewidths=2.0, alpha=0.6,
                                           label=f"route told ({drive.route_source}; "
                                                 f"{route_distances(ROUTE_POINTS)[-1]:g} m, one a second)"))
    elif drive.route_source is not None:
        axes.plot([], [], color=ROUTE_COLOR, label=f"route told: {drive.route_source} (not drawn)")
    axes.plot(poses[:, 0], poses[:, 1], color=PATH_COLOR, linewidth=2.0, label="driven path")
    axes.plot(*poses[0, :2], "o", color=PATH_COLOR, label="start")
    points = np.concatenate(shown)
    centre = (points.min(axis=0) + points.max(axis=0)) / 2
    half = np.ptp(points, axis=0).max() / 2 + MARGIN_M
    axes.set(xlim=(centre[0] - half, centre[0] + half), ylim=(centre[1] - half, centre[1] + half), aspect="equal",
             xlabel="x (m)", ylabel="y (m)")
    axes.set_title(f"{drive.spec.id} ({drive.world})", fontsize=9)
    axes.legend(loc="upper left", fontsize=7)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


APP = "terra-drive"  # whose run folders drives are, by terra-drive or the Python API


def file_stem(drive_id: str) -> str:
    """The name a drive's files start with: its id, any path separator made ``_``."""
    return drive_id.replace(os.sep, "_")


def claim_drive_folder(path: str | os.PathLike, drive_ids: list[str], videos: bool = True, manifest: str = MANIFEST,
                       inputs: Inputs = (), setting: str = "output_dir") -> OutputDir:
    """The folder a run of drives (``drive_ids``) writes, checked before any work."""
    owners: dict[str, str] = {}
    for drive_id in drive_ids:
        other = owners.setdefault(file_stem(drive_id), drive_id)
        if other != drive_id:
            raise TerraInputError(f"drives {shown(other, 80)} and {shown(drive_id, 80)} would write the same files; "
                                  "give the scenarios or policies distinct names")
    suffixes = (".mp4", ".png") * videos + (".json",)  # the video and top-down picture unless videos is False
    names = [file_stem(drive_id) + suffix for drive_id in drive_ids for suffix in suffixes]
    return claim_output_dir(path, setting, files=[manifest, summary_name(manifest), *names], inputs=inputs,
                            app=APP)


SHARED_READS = ("scenarios file",)  # read by every scenario of a run: each one's own content is its arrays


def scenario_digest(scenario: Scenario) -> str:
    """sha256 (32 hex digits) of what a drive starts from."""
    digest = hashlib.sha256()
    for array in (scenario.images, scenario.actions, [scenario.speed_kmh], scenario.start_pose,
                  scenario.context_poses, scenario.path):
        digest.update(b"-" if array is None else np.ascontiguousarray(array, dtype=np.float64).tobytes() + b"|")
    files = [path for what, path in scenario.reads if what not in SHARED_READS and Path(path).is_file()]
    digest.update(content_digest(files, "scenario file").encode())
    return digest.hexdigest()[:32]


CHECKPOINTS = ("world_model", "tokenizer")  # parts of the world model's settings that are checkpoints' digests


def drive_inputs(spec: DriveSpec, world: str, num_steps: int, vehicle: str, settings: dict[str, Any]
                 ) -> dict[str, str]:
    """What shapes a drive's outputs, by part."""
    args = {"policy_args": spec.policy_args} if spec.policy_args else {}
    rest = {key: value for key, value in settings.items() if key not in CHECKPOINTS}
    return {**{key: settings[key] for key in CHECKPOINTS if key in settings},
            "scenario": scenario_digest(spec.scenario),
            "settings": spec_fingerprint({"scenario": spec.scenario.id, "source": spec.scenario.source,
                                          "policy": spec.policy, **args, "seed": spec.seed, "num_steps": num_steps,
                                          "world": world, "vehicle": vehicle, **rest})}


def paths(output_dir: Path, spec: DriveSpec) -> tuple[Path, Path]:
    """``(video, sidecar)`` of a drive."""
    stem = file_stem(spec.id)
    return output_dir / f"{stem}.mp4", output_dir / f"{stem}.json"


def completed(output_dir: Path, spec: DriveSpec, inputs: dict[str, str]) -> tuple[dict | None, str | None]:
    """``(record, None)``: the JSON of a complete earlier drive made from ``inputs`` whose files are whole."""
    try:
        record = load_json(paths(output_dir, spec)[1], "drive record")  # no file: a TerraInputError too
    except TerraInputError:
        return None, None
    if not (isinstance(record, dict) and record.get("complete")):
        return None, None
    if record.get("fingerprint") != spec_fingerprint(inputs):
        return None, changed_inputs(record.get("inputs"), inputs)
    if not whole_files(output_dir, record.get("files"), record.get("file_digests")):
        return None, "its files are not whole"
    return record, None


def metrics_of(drive: Drive) -> dict:
    """The drive's map-free metrics and, in the true world, its ground truth and AlpaSim's metrics."""
    poses = np.stack(drive.poses) if drive.poses else np.zeros((1, 3))
    metrics = drive_metrics(poses, drive.plans)
    if drive.spec.scenario.scene is not None and drive.poses:
        metrics["truth"] = truth_metrics(drive.spec.scenario.scene, drive.world_poses())
        metrics["alpasim"] = alpasim_metrics(drive.spec.scenario, drive.world_poses(), drive.error)
    return metrics


def drive_json(drive: Drive, metrics: dict, inputs: dict[str, str], files: list[str]) -> dict:
    """The drive's JSON file."""
    scenario = drive.spec.scenario
    return {
        "drive": drive.spec.id, "scenario": scenario.id, "source": scenario.source, "policy": drive.spec.policy,
        "world": drive.world, "vehicle": drive.vehicle.name, "seed": drive.spec.seed,
        "status": "ok" if drive.ok else "failed",
        "stage": drive.stage, "error": drive.error, "ended": drive.ended, "warnings": drive.warnings,
        "num_context": drive.num_context, "steps": drive.steps,
        "route": bool(drive.route_told) and TOLD in drive.route_told, "route_source": drive.route_source,
        "routed_steps": None if drive.route_told is None else drive.route_told.count(TOLD),
        "route_told": drive.route_told,
        "frames": len(drive.frames), "files": files, "metrics": metrics,
        "plans": [p.to_json() for p in drive.plans], "actions": np.round(np.array(drive.actions), 4).tolist(),
        "poses": np.round(np.array(drive.poses), 4).tolist(),
        "world_poses": np.round(drive.world_poses(), 4).tolist() if drive.poses else [],
        "speeds_mps": np.round(drive.speeds, 4).tolist(), "policy_s": np.round(drive.policy_s, 5).tolist(),
        "fingerprint": spec_fingerprint(inputs), "inputs": inputs,
        "complete": drive.ok,  # a failed drive runs again on a rerun
    }


def lost_drive_json(drive_id: str, scenario: str, policy: str, world: str, vehicle: str, error: str) -> dict:
    """The JSON content of a drive that never reached its files (its Ray actor was lost with it)."""
    return {"drive": drive_id, "scenario": scenario, "source": "", "policy": policy, "world": world,
            "vehicle": vehicle, "seed": None,
            "status": "failed", "stage": "world", "error": error, "warnings": [], "num_context": 0, "steps": 0,
            "route": False, "route_source": None, "routed_steps": None, "route_told": None,
            "frames": 0, "files": [], "metrics": {}, "plans": [], "actions": [], "poses": [], "world_poses": [],
            "speeds_mps": [], "policy_s": [], "fingerprint": None, "complete": False}


def write_drive(output_dir: Path, drive: Drive, inputs: dict[str, str], fps: float | None = 10.0,
                extra_metrics: dict | None = None, measure: bool = False, device: str = "cpu") -> dict:
    """Write the drive's video and top-down picture (unless ``fps`` is None) and JSON; return the JSON."""
    video, sidecar = paths(output_dir, drive.spec)
    files = []
    if drive.frames and fps is not None:
        write_video(video, np.stack(drive.frames), fps)
        picture = video.with_suffix(".png")
        with atomic_path(picture) as tmp:
            tmp.write_bytes(topdown_png(drive))
        files += [video.name, picture.name]
    content = drive_json(drive, {**metrics_of(drive), **(extra_metrics or {})}, inputs, files)
    content["file_digests"] = written(output_dir, files)
    if measure and drive.ok:
        content["fidelity"] = measure_frames(drive, measure_device(device))
    write_text(sidecar, json_text(to_jsonable(content)) + "\n")
    return content


def manifest_record(content: dict, status: str, seconds: float | None = None) -> dict:
    """The manifest's line for a drive's JSON content."""
    truth = content.get("metrics", {}).get("truth") or {}
    alpasim = content.get("metrics", {}).get("alpasim") or {}
    return {"drive": content["drive"], "scenario": content["scenario"], "policy": content["policy"],
            "world": content["world"], "status": status, "stage": content.get("stage"),
            "error": content.get("error"), "ended": content.get("ended"), "steps": content.get("steps"),
            "time_in_lane": truth.get("time_in_lane"), "score": alpasim.get("score"),
            "seconds": None if seconds is None else round(seconds, 3), "files": content.get("files", [])}


Emit = Callable[[dict, dict], None]  # (manifest record, the drive's JSON content)


class DriveWriters:
    """Where finished drives are measured and written."""

    def __init__(self, processes: int, emit: Emit) -> None:
        self.emit = emit
        self.pool = ProcessPoolExecutor(processes, mp_context=get_context("spawn")) if processes else None
        self.pending: deque[tuple[Future | None, float, tuple]] = deque()

    def write(self, seconds: float, *args: Any) -> None:
        """Write a drive (``write_drive``'s arguments; ``seconds``: its share of the chunk's time)."""
        future = None
        if self.pool is not None:
            try:
                future = self.pool.submit(write_drive, *args)
            except BrokenProcessPool as err:  # a writer died since the last drive was handed in
                self._fall_back(err)
        self.pending.append((future, seconds, args))
        self.wait(len(self.pending) if self.pool is not None else 0)

    def wait(self, backlog: int) -> None:
        """Emit every drive written so far, in order, waiting until at most ``backlog`` drives are left to write."""
        while self.pending:
            first = self.pending[0][0]
            if first is not None and not first.done():
                if len(self.pending) <= backlog:
                    return
                if self._write_newest_here():
                    continue
            future, seconds, args = self.pending.popleft()
            content = self._written(future, args)
            self.emit(manifest_record(content, content["status"], seconds), content)

    def _write_newest_here(self) -> bool:
        """Write the newest drive no writer has begun; False when every drive left has begun."""
        for index in range(len(self.pending) - 1, -1, -1):
            future, seconds, args = self.pending[index]
            if future is None or (not future.done() and not future.cancel()):
                return False  # begun by a writer, and so has every older one (they are taken in order)
            if future.cancelled():
                here: Future = Future()
                try:
                    here.set_result(write_drive(*args))
                except Exception as err:  # raised when its record is emitted, as a writer's would be
                    here.set_exception(err)
                self.pending[index] = (here, seconds, args)
                return True
        return False

    def _written(self, future: Future | None, args: tuple) -> dict:
        if future is not None:
            try:
                return future.result()
            except BrokenProcessPool as err:
                self._fall_back(err)
        return write_drive(*args)

    def _fall_back(self, err: BrokenProcessPool) -> None:
        """A writer died: every drive not yet written is written by this process from now on."""
        tqdm.write(f"terra-drive: warning: a writer process died ({err}); drives are written by the loop's own "
                   "process from now on", file=sys.stderr)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = None
        self.pending = deque((None, seconds, args) for _, seconds, args in self.pending)

    def __enter__(self) -> "DriveWriters":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=exc[0] is None, cancel_futures=exc[0] is not None)
