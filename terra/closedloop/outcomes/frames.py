"""What one drive's frames say about its world, measured against the true world's renders at the drive's poses."""

from __future__ import annotations

from typing import Any

import numpy as np

from terra.closedloop.loop import Drive
from terra.closedloop.worlds import pose_key
from terra.fidelity.agreement import (
    MAX_LAG, Lag, LaneAgreement, frame_changes, frame_fidelity, lane_agreement, temporal_lag,
)
from terra.fidelity.following import Following, recover
from terra.fidelity.odometry import step_motions
from terra.sim.renderer import render


def measure_device(device: str) -> str | None:
    """torch's device for the measurements of a run on ``device`` (auto, cpu, cuda, cuda:N)."""
    if device == "cpu":
        return None
    import torch

    return ("cuda" if device == "auto" else device) if torch.cuda.is_available() else None


def measure_frames(drive: Drive, device: str | None = None) -> dict[str, Any] | None:
    """The drive's frame measurements, or None without a generated frame or synthetic scene; ``device`` None: numpy."""
    scene = drive.spec.scenario.scene
    if scene is None or drive.steps == 0:
        return None
    frames = np.stack(drive.frames[drive.num_context - 1:])  # the last context frame, then each step's
    poses = drive.world_poses()  # [steps + 1, 3]: the last context frame's pose first
    height, width = frames.shape[1:3]
    renders = drive.truths or {}  # those the world made
    truth = np.stack([renders[key] if (key := pose_key(pose)) in renders else render(scene, pose, height, width)
                      for pose in poses])  # the last context frame's pose first
    kept = drive.references
    through = kept is not None and len(kept) >= len(poses)  # the truth through the world's tokenizer
    reference = np.asarray(kept[:len(poses)]) if through else truth
    following = recover(frames, step_motions(poses), reference=reference, device=device)
    truth = truth[1:]
    lanes = lane_agreement(frames[1:], reference[1:], device)
    lag = temporal_lag(frames[1:], truth, device=device) if len(truth) >= int(np.ceil(1.5 * MAX_LAG)) else None
    return {
        "commanded": following.commanded, "recovered": following.recovered, "match": following.match,
        "recovered_truth": following.reference, "reference": "tokenizer" if through else "truth",
        "change_world": frame_changes(frames, device), "change_truth": frame_changes(reference, device),
        "lane_world": lanes.world, "lane_truth": lanes.truth,
        "horizons": {str(h): values for h, values in frame_fidelity(frames[1:], truth, device=device).items()},
        "lag": None if lag is None else {"lag": lag.lag, "curve": lag.curve},
    }


def _floats(values: Any, columns: int | None = None) -> np.ndarray:
    """A JSON list (nulls for NaN) as a float array."""
    if columns is None:
        return np.array(values, dtype=np.float64)
    return np.array([[np.nan] * columns if v is None else v for v in values], dtype=np.float64).reshape(-1, columns)


def read_following(record: dict) -> Following:
    """The action following of a drive's stored measurements."""
    reference = record.get("recovered_truth")
    return Following(_floats(record["commanded"], 3), _floats(record["recovered"], 3), _floats(record["match"]),
                     None if reference is None else _floats(reference, 3))


def read_changes(record: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """How much each frame changed from the one before, in the world and in the reference (None: not measured)."""
    if record.get("change_world") is None:
        return None
    return _floats(record["change_world"]), _floats(record["change_truth"])


def read_lanes(record: dict) -> LaneAgreement:
    """The lane readings of a drive's stored measurements."""
    return LaneAgreement(_floats(record["lane_world"]), _floats(record["lane_truth"]))


def read_horizons(record: dict) -> dict[int, dict[str, float]]:
    """PSNR and SSIM per horizon of a drive's stored measurements."""
    return {int(h): {k: np.nan if v is None else float(v) for k, v in values.items()}
            for h, values in record["horizons"].items()}


def read_lag(record: dict) -> Lag | None:
    """The temporal lag of a drive's stored measurements (None: too short a drive)."""
    lag = record.get("lag")
    return None if lag is None else Lag(int(lag["lag"]), _floats(lag["curve"]))
