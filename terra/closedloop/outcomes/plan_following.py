"""Plan following: does the generated clip show the motion the policy commanded (ACT-Estimator)?"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from terra.closedloop.loop import Drive
from terra.inputs.ego_motion import to_ego


class PlanFollowing:
    """An ACT-Estimator loaded once from ``folder`` (``device``: cpu | cuda), scoring drives."""

    def __init__(self, folder: str | Path, device: str = "cpu") -> None:
        import torch

        from terra.scoring.estimator import VideoActionEstimator

        self.torch = torch
        self.device = torch.device(device)
        self.estimator = VideoActionEstimator.from_pretrained(folder).to(self.device).eval()
        self.frames = self.estimator.config.input_shape[1]

    def driven_path(self, drive: Drive) -> np.ndarray | None:
        """The commanded path over the estimator's frames ``[T, 2]`` in its frame, or None for a short drive."""
        if len(drive.poses) < self.frames:
            return None
        window = np.stack(drive.poses[-self.frames:])
        local = to_ego(window[:, :2], window[0])
        return np.stack([-local[:, 1], local[:, 0]], axis=-1)

    def score(self, drives: Sequence[Drive]) -> list[dict | None]:
        """Per drive ``{"ade_m", "fde_m", "estimated_class"}``, None where the drive is too short."""
        from terra.scoring.labels import LABELS
        from terra.scoring.metrics import displacement_errors
        from terra.scoring.run import timestamps
        from terra.scoring.videos import preprocess

        torch, config = self.torch, self.estimator.config
        out: list[dict | None] = []
        for drive in drives:
            driven = self.driven_path(drive)
            if driven is None:
                out.append(None)
                continue
            clip = preprocess(np.stack(drive.frames[-self.frames:]), tuple(config.input_shape[2:]))
            times = timestamps(self.frames)[None].to(self.device) if config.timestamp_dim else None
            with torch.inference_mode():
                estimate = self.estimator(clip[None].to(self.device).float().div_(255), times)
            waypoints = estimate.waypoints.float().cpu().numpy()
            ade, fde = displacement_errors(waypoints, driven[None])
            label = LABELS[int(torch.softmax(estimate.command.float().cpu(), dim=1).argmax())]
            out.append({"ade_m": float(ade[0]), "fde_m": float(fde[0]), "estimated_class": label})
        return out
