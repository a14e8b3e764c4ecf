"""Closed-loop sessions: open one from context frames, then ``step(action)`` -> the next frame, fork, reset, close."""

from __future__ import annotations

import secrets
import time
from concurrent.futures import Future, InvalidStateError
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from terra.config.checks import MAX_FRAMES, MAX_SEED, check_whole_number
from terra.config.sampling import SamplingConfig
from terra.contract.routes import NO_ROUTE_SLOTS, NONE_GIVEN
from terra.core.errors import TerraInputError, quoted
from terra.generation.pass_stats import PassStats
from terra.generation.rollout import DEFAULT_OVERLAP, WorldModelBackend
from terra.generation.session_engine import Rollout, SessionEngine, StepResult
from terra.inputs.ego_motion import Pose, advance_pose, speed_of
from terra.inputs.routes import road_of_setting, told_road_routes
from terra.roads import Road
from terra.session import context as contexts
from terra.session.driver_input import KeyDriver, parse_action


@dataclass
class Frame:

    index: int  # frames generated before it since the last reset
    codes: np.ndarray  # [h, w]
    rgb: np.ndarray | None  # uint8 [H, W, 3], None when not decoded
    action: np.ndarray  # [6, 3] that conditioned it
    pose: Pose  # where the car is at this frame, in the ego frame of the last context frame
    timings: dict[str, float] = field(default_factory=dict)
    passes: int | None = None  # forward passes that generated it (sequential decoding: one per image token)
    route_told: str = NONE_GIVEN  # TOLD, or why its step was told no route

    @property
    def speed_kmh(self) -> float:
        return speed_of(self.action)


class Session:
    """One closed-loop rollout; methods may be called from any thread, steps run in the order given."""

    def __init__(self, host: "SessionHost", rollout: Rollout, context: contexts.SessionContext,
                 sampling: SamplingConfig, poses: list[Pose] | None = None) -> None:
        self.id = secrets.token_urlsafe(8)
        self.host = host
        self.rollout = rollout
        self.context = context
        self.sampling = sampling
        self.poses: list[Pose] = list(poses or [])  # poses[k]: at generated frame k
        self.queued_pose: Pose = self.pose_at(len(self.poses) - 1)  # after the last queued step: where its route is
        self.driver = KeyDriver(context.speed_kmh)
        self.route_told: list[str] = []  # route_told[k]: TOLD, or why generated frame k was told no route

    @property
    def num_context(self) -> int:
        return len(self.context.codes)

    @property
    def max_frames(self) -> int:
        return self.rollout.request.num_frames

    @property
    def num_generated(self) -> int:
        return len(self.poses)

    @property
    def route_source(self) -> str | None:
        """Where the routes told each step come from (``scene``); None when none are told."""
        return self.context.route_source if self.host.layout.route_model else None

    def step_async(self, action: np.ndarray) -> Future:
        """Queue the next frame under a checked ``[6, 3]`` ``action``; resolves to a :class:`StepResult`."""
        assert action.shape == (6, 3), action.shape
        self.queued_pose = advance_pose(self.queued_pose, action)
        layout = self.host.layout
        route, told = (self.context.step_route(np.asarray(self.queued_pose), layout.route_tokens)
                       if layout.route_model else (None, NONE_GIVEN))
        step = self.host.engine.step(self.rollout, action, self.sampling, route)
        done: Future = Future()  # resolved once the step's pose is tracked, so a frame finds it
        done.add_done_callback(lambda f: f.cancelled() and step.cancel())  # a caller's cancel reaches the engine
        pose = self.queued_pose  # tracked on the driver thread, in step order
        step.add_done_callback(lambda f: self._track_pose(f, done, pose, told))
        return done

    def step(self, action: Any, decode: bool = True) -> Frame:
        """Generate the next frame under ``action`` (any form ``parse_action`` reads) and wait for it."""
        return self.frame(self.step_async(parse_action(action)).result(), decode)

    def frame(self, result: StepResult, decode: bool = True) -> Frame:
        """The :class:`Frame` of a finished step (decoding it here, on the calling thread)."""
        start = time.perf_counter()
        codes = result.codes.reshape(self.context.codes.shape[1:])
        rgb = self.host.decode(codes[None])[0] if decode else None
        timings = {"queue_s": result.queue_s, "generate_s": result.generate_s,
                   "decode_s": time.perf_counter() - start if decode else 0.0}
        # this step's pose is tracked by now (the driver ran its callback before finishing the step)
        told = self.route_told[result.index] if result.index < len(self.route_told) else NONE_GIVEN
        return Frame(result.index, codes, rgb, result.action, self.pose_at(result.index), timings, result.passes,
                     told)

    def pose_at(self, index: int) -> Pose:
        return self.poses[index] if 0 <= index < len(self.poses) else (0.0, 0.0, 0.0)

    def fork(self) -> "Session":
        """A new session continuing from this one's latest frame (after its queued steps); the past is shared."""
        rollout = self.host.engine.fork(self.rollout).result()
        twin = Session(self.host, rollout, self.context, self.sampling, self.poses[: rollout.state.num_generated])
        twin.driver.speed_kmh, twin.driver.steer = self.driver.speed_kmh, self.driver.steer
        twin.route_told = self.route_told[: len(twin.poses)]
        return twin

    def reset(self) -> None:
        """Back to the context frames; the same actions then give the same frames again."""
        self.host.engine.reset(self.rollout).result()
        self.poses.clear()
        self.route_told.clear()
        self.queued_pose = self.pose_at(-1)
        self.driver = KeyDriver(self.context.speed_kmh)

    def close(self) -> None:
        """Free the session's rollout (a step in flight finishes first)."""
        self.host.engine.close_rollout(self.rollout).result()

    def pass_stats(self) -> PassStats:
        """Forward passes of the frames generated since the last reset (how much speculative decoding saved)."""
        return self.rollout.state.pass_stats()

    def codes(self) -> np.ndarray:
        """Every frame's codes so far ``[n_ctx + generated, h, w]``, context first."""
        return self.rollout.codes().reshape(-1, *self.context.codes.shape[1:])

    def video(self) -> np.ndarray:
        """Every frame so far decoded to uint8 RGB ``[T, H, W, 3]``, context first."""
        return self.host.decode(self.codes())

    def _track_pose(self, step: Future, done: Future, pose: Pose, told: str) -> None:
        """Record where a finished step leaves the car (``pose``) and its route verdict, then resolve ``done``."""
        if step.cancelled():
            done.cancel()
            return
        error = step.exception()
        if error is None:
            index = step.result().index
            self.poses[index:] = [pose]
            self.route_told[index:] = [told]
        with suppress(InvalidStateError):  # the caller cancelled it while the step was already running
            if error is None:
                done.set_result(step.result())
            else:
                done.set_exception(error)


SESSION_FRAME = "the session's frame (the last context frame's ego frame, x forward, y left)"


class SessionHost:
    """Opens sessions on a :class:`~terra.pipeline.WorldModelPipeline` (or a bare backend: codes only, no decoding).

    Args:
        max_frames: the most frames of one session.
        overlap: window overlap.
        sampling: the default of :meth:`open`.
        resize: how context images fit the tokenizer (``crop`` or ``stretch``).
        roads: roads a session may give by name.
    """

    def __init__(self, pipeline, sampling: SamplingConfig = SamplingConfig(), max_frames: int = 1000,
                 overlap: int = DEFAULT_OVERLAP, num_context: int = 3, resize: str = "crop",
                 roads: Mapping[str, Road] | None = None) -> None:
        self.pipeline = None if isinstance(pipeline, WorldModelBackend) else pipeline
        self.backend: WorldModelBackend = pipeline if self.pipeline is None else pipeline.backend
        self.sampling = sampling
        self.max_frames = check_whole_number(max_frames, "max_frames", 1, "max_frames=600", MAX_FRAMES)
        self.overlap = check_whole_number(overlap, "overlap", 1, "overlap=3", MAX_FRAMES)
        self.num_context = check_whole_number(num_context, "num_context", 1, "num_context=3", MAX_FRAMES)
        self.resize = resize  # how context images fit the tokenizer: crop | stretch
        self.roads = dict(roads or {})
        self.engine = SessionEngine(self.backend)

    @property
    def layout(self):
        return self.backend.layout

    def given_road(self, value: Any) -> Road | None:
        """The road a client gives a session (None: no route): its content, checked to reach the car at the start."""
        if value is None:
            return None
        if not self.layout.route_model:
            raise TerraInputError(f"road: {NO_ROUTE_SLOTS}, so it cannot take a road; leave road out")
        if isinstance(value, str) and not value.lstrip().startswith("["):
            if value not in self.roads:
                named = f"one of this server's roads ({', '.join(self.roads)}) or " if self.roads else ""
                raise TerraInputError(f"road: {quoted(value)} is no road this server knows; give {named}the road "
                                      "itself, [[x, y], ...] or a list of lanes (the server reads no files of its "
                                      "clients)")
            road = self.roads[value]
        else:
            road = road_of_setting(value)
        told_road_routes(road, np.zeros((1, 3)), self.layout.route_tokens, "road", frame=SESSION_FRAME)
        return road

    def _tokenizer_pipeline(self):
        if self.pipeline is None:
            raise TerraInputError("this session host has a backend but no tokenizer: open sessions from codes "
                                  "with open_context, or build the host from a WorldModelPipeline")
        return self.pipeline

    def open(self, images: Any = None, codes: Any = None, builtin: dict | None = None, actions: Any = None,
             speed_kmh: float = 30.0, seed: int | None = None, sampling: SamplingConfig | None = None,
             num_context: int | None = None, max_frames: int | None = None, road: Any = contexts.OWN_ROAD) -> Session:
        """A session from ``images``, ``codes`` or the built-in world (``builtin``: manoeuvre, scene, speed_kmh;
        default).

        Args:
            actions: the context's own actions (default: straight at ``speed_kmh``).
            seed: fixes sampling (None: the backend picks one).
            road: the road each step is told, in the session frame (None: no route); by default the built-in world's
                scene, none for images and codes.
            max_frames: lowers the host's cap for this session.
        """
        if images is not None and codes is not None:
            raise TerraInputError("give context images or codes, not both")
        num_context = self.num_context if num_context is None else check_whole_number(  # within the model's window
            num_context, "num_context", 1, "num_context=3", self.layout.max_frames - 1)
        if seed is not None:
            check_whole_number(seed, "seed", 0, "seed=0", MAX_SEED)
        if max_frames is not None:
            check_whole_number(max_frames, "max_frames", 1, "max_frames=100")
            if max_frames > self.max_frames:
                raise TerraInputError(f"max_frames={max_frames} is over this host's limit of {self.max_frames}")
        pipeline = self._tokenizer_pipeline()
        if images is not None:
            context = contexts.from_images(pipeline, images, num_context, actions, speed_kmh, self.resize)
        elif codes is not None:
            context = contexts.from_codes(codes, pipeline.tokenizer.grid_shape, actions, speed_kmh)
        else:
            context = contexts.builtin(pipeline, num_context, **(builtin or {}))
        if road is not contexts.OWN_ROAD:  # told ``road`` (None: no route, not even its scene's)
            context = replace(context, scene=None, poses=None, road=road)
        return self.open_context(context, seed, sampling, max_frames)

    def open_context(self, context: contexts.SessionContext, seed: int | None = None,
                     sampling: SamplingConfig | None = None, max_frames: int | None = None) -> Session:
        routes = context.context_routes(self.layout.route_tokens) if self.layout.route_model else None
        rollout = self.engine.open(context.codes, context.actions, max_frames or self.max_frames, seed, self.overlap,
                                   routes)
        sampling = self.backend.as_run(sampling or self.sampling)  # auto: as the host's run chose
        return Session(self, rollout, context, sampling)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Codes ``[T, h, w]`` → uint8 RGB ``[T, H, W, 3]``."""
        return self._tokenizer_pipeline().decode(codes)

    def close(self) -> None:
        """Stop the engine (sessions end); the pipeline stays open for its owner."""
        self.engine.close()
