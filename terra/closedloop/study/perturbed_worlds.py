"""The synthetic world made a little wrong, to learn what a policy tolerates from a world model."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from terra.closedloop.scenarios import Scenario
from terra.closedloop.study.control_worlds import shifted_left
from terra.closedloop.worlds import TrueWorld
from terra.config.assets import demo_checkpoints


class TokenizerWorld(TrueWorld):
    """The true world's frames (and context) through the demo tokenizer, encoded and decoded."""

    name = "tokenizer"

    def __init__(self, image_size: Sequence[int]) -> None:
        from terra.tokenizer import load_tokenizer

        super().__init__(image_size)
        self.tokenizer = load_tokenizer(demo_checkpoints()[1]).eval()

    def round_trip(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """uint8 frames ``[N, H, W, 3]`` as the tokenizer gives them back."""
        import torch

        from terra.decoder import codes_to_frames
        from terra.tokenizer.images import frames_to_tensor

        with torch.inference_mode():
            codes = self.tokenizer.encode(frames_to_tensor(np.stack(frames)))
        return codes_to_frames(self.tokenizer, codes.numpy())

    def context_frames(self, drive: Scenario) -> np.ndarray:
        return self.round_trip(list(drive.images))

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        frames = super().step(drives, actions, poses)
        done = [i for i, frame in enumerate(frames) if not isinstance(frame, BaseException)]
        if done:
            for i, frame in zip(done, self.round_trip([frames[i] for i in done])):
                frames[i] = frame
        return frames


@dataclass
class ShakenDrive:
    """A drive of a :class:`ShakenWorld`: its scenario, its random stream and the camera's offset now (m)."""

    scenario: Scenario
    rng: np.random.Generator
    offset: float = 0.0
    offsets: list[float] = field(default_factory=list)


class ShakenWorld(TrueWorld):
    """The true world from a camera moved ``sigma_m`` sideways at random each step, AR(1) with ``rho``."""

    name = "shaken"
    sigma_m = 0.08
    rho = 0.0

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> ShakenDrive:
        super().open(scenario, seed, max_frames)
        return ShakenDrive(scenario, np.random.default_rng(zlib.crc32(scenario.id.encode())))

    def context_frames(self, drive: ShakenDrive) -> np.ndarray:
        return drive.scenario.images

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        for drive in drives:
            drive.offset = self.rho * drive.offset + float(drive.rng.normal(0.0, self.sigma_m))
            drive.offsets.append(drive.offset)
        moved = [shifted_left(pose, drive.offset) for drive, pose in zip(drives, poses)]
        return super().step([drive.scenario for drive in drives], actions, moved)


class Shaken4cm(ShakenWorld):
    name, sigma_m, rho = "shaken_4cm", 0.04, 0.0


class Shaken8cm(ShakenWorld):
    name, sigma_m, rho = "shaken_8cm", 0.08, 0.0


class Drifting4cm(ShakenWorld):
    """Fresh draws of 4 cm, each offset 0.8 of the last: 6.7 cm about the truth, correlated over ~5 steps."""

    name, sigma_m, rho = "drifting_4cm", 0.04, 0.8
