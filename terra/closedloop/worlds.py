"""The two worlds a policy can drive in, behind one interface: the world model, and the true world."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from terra.closedloop.scenarios import Scenario
from terra.config.sampling import SamplingConfig
from terra.contract.routes import NO_LANE_NEAR, NONE_GIVEN, TOLD
from terra.core.errors import TerraInputError
from terra.generation.rollout import DEFAULT_OVERLAP, WorldModelBackend
from terra.generation.session_engine import Rollout, SessionEngine
from terra.sim.renderer import render


class World(Protocol):
    """Opens a drive on a scenario and steps many drives at once."""

    name: str
    generate_s: float
    decode_s: float

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> Any: ...

    def context_frames(self, drive: Any) -> np.ndarray: ...

    def step(self, drives: Sequence[Any], actions: Sequence[np.ndarray],
             poses: Sequence[np.ndarray]) -> list[np.ndarray | BaseException]: ...

    def close(self, drive: Any) -> None: ...


class Road(Protocol):
    """What a model world reads a drive's routes from: a scenario (its scene's road) or a route control's road."""

    route_source: str | None

    def model_routes(self, poses: np.ndarray, route_tokens: int) -> np.ndarray | None: ...


def route_verdict(road: Road, pose: np.ndarray, routes: np.ndarray | None) -> str:
    """``TOLD``, or why ``routes`` at world ``pose`` tell none (the road's own reason where it gives one)."""
    if routes is None:
        return NONE_GIVEN
    if np.isfinite(routes).all():
        return TOLD
    why = getattr(road, "why_no_route", None)
    return NO_LANE_NEAR if why is None else why(pose)


WORLD_METHODS = ("open", "context_frames", "step", "close")  # what any World must have (name, counters: optional)


def pose_key(pose: np.ndarray) -> bytes:
    """A true render's key."""
    return np.asarray(pose, dtype=np.float64).tobytes()


@dataclass
class ModelDrive:
    """A drive in the model world."""

    rollout: Rollout
    context: np.ndarray  # [n, h, w] context codes
    sampling: SamplingConfig
    seed: int
    scenario: Scenario
    road: Road  # what tells the drive's routes (the scenario itself, but for the route controls)
    keeps_references: bool = False  # its true frames kept, its scene known (ModelWorld.references)
    references: list[np.ndarray] = field(default_factory=list)  # the true frames through the tokenizer, step by step
    truths: dict[bytes, np.ndarray] = field(default_factory=dict)  # the true frames themselves, by pose (pose_key)
    route_told: list[str] = field(default_factory=list)  # each step: TOLD, or why the model was told no route

    def codes(self) -> np.ndarray:
        """Every frame's codes so far ``[n + generated, h, w]``, context first."""
        return self.rollout.codes().reshape(-1, *self.context.shape[1:])


class ModelWorld:
    """The world model as a simulator."""

    name = "model"

    def __init__(self, pipeline, sampling: SamplingConfig = SamplingConfig(), overlap: int = DEFAULT_OVERLAP,
                 references: bool = False) -> None:
        self.pipeline = None if isinstance(pipeline, WorldModelBackend) else pipeline
        self.backend: WorldModelBackend = pipeline if self.pipeline is None else pipeline.backend
        self.sampling = self.backend.as_run(sampling)  # auto: as the run chose it
        self.overlap = overlap
        self.references = references  # keep each drive's true frames through the tokenizer (reference_frames)
        self.engine = SessionEngine(self.backend)
        self.generate_s = 0.0  # in the engine, summed over steps
        self.decode_s = 0.0  # in the tokenizer's decoder (the references' round trips too)

    def open(self, scenario: Scenario, seed: int, max_frames: int, road: Road | None = None) -> ModelDrive:
        """A drive from ``scenario``'s context; its routes read from ``road`` (None: the scenario's own)."""
        from terra.tokenizer.images import frames_to_tensor

        return self.open_codes(self.pipeline.encode(frames_to_tensor(scenario.images)), scenario, seed, max_frames,
                               road)

    def open_codes(self, codes: np.ndarray, scenario: Scenario, seed: int, max_frames: int,
                   road: Road | None = None) -> ModelDrive:
        """A drive from ``scenario``'s context as ``codes`` ``[n, h, w]``."""
        road = scenario if road is None else road
        routes = self.routes(road, scenario.context_poses)
        rollout = self.engine.open(codes, scenario.actions, max_frames, seed, self.overlap, routes)
        keep = bool(self.references) and scenario.scene is not None and self.pipeline is not None
        return ModelDrive(rollout, codes, self.sampling, seed, scenario, road, keep)

    def routes(self, road: Road, poses: np.ndarray | None) -> np.ndarray | None:
        """The model's routes at world ``poses`` read from ``road``: what a drive is told of the road ahead."""
        layout = self.backend.layout
        return None if not layout.route_model or poses is None else road.model_routes(poses, layout.route_tokens)

    def route_source(self, drive: ModelDrive) -> str | None:
        """Where ``drive``'s routes come from (None: a model without route slots, or a road that tells none)."""
        return drive.road.route_source if self.backend.layout.route_model else None

    def route_told(self, drive: ModelDrive) -> list[str] | None:
        """Each step of ``drive``'s verdict: ``TOLD`` or why not, by content (None: a model without route slots)."""
        return list(drive.route_told) if self.backend.layout.route_model else None

    def reference_frames(self, drive: ModelDrive) -> np.ndarray | None:
        """The true scene at the drive's poses through this world's tokenizer (None: no references kept)."""
        return np.stack([self.context_frames(drive)[-1], *drive.references]) if drive.keeps_references else None

    def true_renders(self, drive: ModelDrive) -> dict[bytes, np.ndarray] | None:
        """The true renders its references were made from, by pose (:func:`pose_key`; None: no references kept)."""
        return drive.truths if drive.keeps_references else None

    def context_frames(self, drive: ModelDrive) -> np.ndarray:
        """The context as the model sees it: the tokenizer's reconstruction of the context codes."""
        return self.pipeline.decode(drive.context)

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        """The model's next frames, conditioned on the actions and, with route slots, the road ahead."""
        start = time.perf_counter()
        told = [self.routes(drive.road, pose) for drive, pose in zip(drives, poses)]
        for drive, pose, routes in zip(drives, poses, told):
            drive.route_told.append(route_verdict(drive.road, pose, routes))
        futures = [self.engine.step(drive.rollout, action, drive.sampling, routes)
                   for drive, action, routes in zip(drives, actions, told)]
        results: list[Any] = []
        for future in futures:
            try:
                results.append(future.result())
            except Exception as err:  # noqa: BLE001  (one drive's failure ends that drive only)
                results.append(err)
        self.generate_s += time.perf_counter() - start
        start = time.perf_counter()
        done = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
        if done:
            grid = drives[done[0]].context.shape[1:]
            rgb = self.pipeline.decode(np.stack([results[i].codes.reshape(grid) for i in done]))
            for k, i in enumerate(done):
                results[i] = rgb[k]
            self._keep_references([drives[i] for i in done], [poses[i] for i in done], rgb.shape[1:3])
        self.decode_s += time.perf_counter() - start
        return results

    def _keep_references(self, drives: Sequence[ModelDrive], poses: Sequence[np.ndarray],
                         size: tuple[int, int]) -> None:
        """Each kept drive's true frame at its pose, through the tokenizer (encoded and decoded at once)."""
        from terra.tokenizer.images import frames_to_tensor

        kept = [(drive, pose) for drive, pose in zip(drives, poses) if drive.keeps_references]
        if not kept:
            return
        truth = np.stack([render(drive.scenario.scene, np.asarray(pose, dtype=np.float64), *size)
                          for drive, pose in kept])
        for (drive, pose), rendered in zip(kept, truth):
            drive.truths[pose_key(pose)] = rendered
        for (drive, _), frame in zip(kept, self.pipeline.decode(self.pipeline.encode(frames_to_tensor(truth)))):
            drive.references.append(frame)

    def close(self, drive: ModelDrive) -> None:
        self.engine.close_rollout(drive.rollout).result()

    def shutdown(self) -> None:
        """Stop the sessions' engine (drives still open fail); the pipeline stays open."""
        self.engine.close()


TRUTH = "truth"  # the true world's name


class TrueWorld:
    """The true world rendered at the poses the cars reach (``image_size``: the frames' height and width)."""

    name = TRUTH

    def __init__(self, image_size: Sequence[int]) -> None:
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.generate_s = 0.0  # rendering, summed over steps
        self.decode_s = 0.0  # (nothing to decode)

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> Scenario:
        """A drive of the true world is its scenario."""
        if scenario.scene is None:
            raise TerraInputError(f"scenario {scenario.id} has no synthetic scene: the true world drives only the "
                                  "synthetic scenarios")
        return scenario

    def context_frames(self, drive: Scenario) -> np.ndarray:
        return drive.images

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        """The scene rendered at each pose (the actions are the world model's alone)."""
        start = time.perf_counter()
        frames: list[np.ndarray | BaseException] = []
        for drive, pose in zip(drives, poses):
            try:
                frames.append(render(drive.scene, np.asarray(pose, dtype=np.float64), *self.image_size))
            except Exception as err:  # noqa: BLE001
                frames.append(err)
        self.generate_s += time.perf_counter() - start
        return frames

    def close(self, drive) -> None:
        pass
