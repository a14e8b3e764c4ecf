"""AlpaSim's video-model sessions on one world model: many rollouts at once on one session engine."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from PIL import Image

from terra.alpasim.fields import RequestError, client_id, quoted
from terra.alpasim.maps import SessionMap, release_map_memory, session_map, TopView
from terra.alpasim.poses import Chunk, RigTrack
from terra.alpasim.settings import AlpasimSettings
from terra.config.checks import MAX_SEED
from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError, error_line
from terra.decoder.writers import encode_image
from terra.generation.rollout import DEFAULT_OVERLAP
from terra.generation.session_engine import Rollout, SessionEngine
from terra.tokenizer.images import frames_to_tensor, image_from_bytes
from terra.tokenizer.resize import MAX_UPSCALE, fit_frame

log = logging.getLogger("terra.alpasim")
ASPECT_TOLERANCE = 0.02  # a camera whose width / height is this close to the model's gets its frames resized


class SessionUnusable(RequestError):
    """A chunk of the session is being rendered, or a chunk failed and left it half-advanced."""

    status = "FAILED_PRECONDITION"


@dataclass
class AlpasimSession:
    """One AlpaSim rollout: its rollout on the engine, its camera, and where its frames are."""

    id: str
    rollout: Rollout
    camera: str  # the camera's logical id, echoed in every chunk
    size: tuple[int, int]  # (H, W) of the frames sent
    seed: int
    hd_map: SessionMap  # its road and the routes it tells each frame
    view: TopView | None = None  # draws the HD-map condition frames (None: not asked)
    skip_video: bool = False  # only the HD-map condition frames: the model is not run
    track: RigTrack = field(default_factory=RigTrack)
    busy: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)
    failed: str | None = None  # why a chunk failed after its frames were queued
    last: "Rendered | None" = None  # the last chunk rendered, kept for a retry of it


@dataclass
class Rendered:
    """A session's last rendered chunk, kept so that a retry of the same poses gets its frames again."""

    times_us: np.ndarray
    poses: np.ndarray
    chunk: Chunk
    images: list[bytes]
    hdmap: list[bytes]  # the HD-map condition frames (empty: not asked)
    committed: bool


def frame_size(asked: tuple[int, int], native: tuple[int, int]) -> tuple[int, int]:
    """The size ``(H, W)`` frames are sent at for a camera that asks for ``asked`` (``(0, 0)``: the model's own)."""
    if asked == (0, 0):
        return native
    height, width = asked
    if not height or not width:
        raise RequestError(f"camera_specs[0] asks for {height}x{width} pixels (height x width); give both or neither")
    aspect, model = width / height, native[1] / native[0]
    fix = (f"ask for {native[0]}x{native[1]} (height x width) or another size of aspect ratio {model:.3f}, e.g. "
           f"{native[0] * 4}x{native[1] * 4} (AlpaSim: the camera's resolution_hw override), or leave it 0x0")
    if abs(aspect / model - 1.0) > ASPECT_TOLERANCE:
        raise RequestError(f"camera_specs[0] asks for {height}x{width} pixels (aspect ratio {aspect:.3f}); this "
                           f"model renders {native[0]}x{native[1]} frames: {fix}")
    if max(height / native[0], width / native[1]) > MAX_UPSCALE:
        raise RequestError(f"camera_specs[0] asks for {height}x{width} pixels, more than {MAX_UPSCALE:g} times the "
                           f"model's {native[0]}x{native[1]} frames: {fix}")
    return height, width


class SessionTable:
    """The open sessions of one server, on ``pipeline`` (a :class:`~terra.pipeline.WorldModelPipeline`)."""

    def __init__(self, pipeline, settings: AlpasimSettings, sampling: SamplingConfig = SamplingConfig(),
                 overlap: int = DEFAULT_OVERLAP, resize: str = "crop") -> None:
        self.pipeline = pipeline
        self.settings = settings
        self.sampling = pipeline.backend.as_run(sampling)  # auto: as the run chose it
        self.overlap = overlap
        self.resize = resize  # how the initial frame fits the tokenizer: crop | stretch
        self.engine = SessionEngine(pipeline.backend)
        self.sessions: dict[str, AlpasimSession] = {}
        self._lock = threading.Lock()  # guards sessions and _opening
        self._opening = 0
        self._reading_map = threading.Lock()  # maps are read one at a time: a large one keeps the interpreter busy
        # for seconds (numpy and Python), and many at once would starve the engine's driver thread

    # ------------------------------------------------------------------ start, close

    def start(self, initial_frame: bytes, camera: str, asked: tuple[int, int], seed: int, hdmap: bytes = b"",
              hdmap_frames: bool = False, skip_video: bool = False) -> AlpasimSession:
        """A session from the camera's ``initial_frame`` (PNG / JPEG bytes), its frames sent at size ``asked``."""
        size = frame_size(asked, self.pipeline.image_size)
        self._reap_idle()
        with self._lock:
            if len(self.sessions) + self._opening >= self.settings.max_sessions:
                raise RequestError(f"{len(self.sessions)} sessions are open, the most this server takes "
                                   f"(alpasim.max_sessions={self.settings.max_sessions}); close one, or start the "
                                   "server with more", "RESOURCE_EXHAUSTED")
            self._opening += 1
        try:
            image = image_from_bytes(initial_frame, "initial_frames[0]", self.settings.max_image_pixels)
            context = fit_frame(image, self.pipeline.image_size, "initial_frames[0]", self.resize)
            session_id = secrets.token_hex(8)
            with self._reading_map:
                hd_map = session_map(hdmap, self.pipeline.backend.layout.route_tokens, session_id)
            codes = self.pipeline.encode(frames_to_tensor(np.stack([context])))
            seed = secrets.randbelow(MAX_SEED) + 1 if seed == 0 else seed % (MAX_SEED + 1)
            rollout = self.engine.open(codes, np.zeros((0, 6, 3), np.float32), self.settings.max_frames, seed,
                                       self.overlap, hd_map.context_routes())
            view = TopView(hd_map.road, size) if hdmap_frames else None
            session = AlpasimSession(session_id, rollout, camera, size, seed, hd_map, view, skip_video)
            with self._lock:
                self.sessions[session.id] = session
        finally:
            with self._lock:
                self._opening -= 1
        return session

    def close(self, session_id: str) -> bool:
        """Free a session; False when there is none of that id."""
        client_id(session_id, "session_id")
        with self._lock:
            session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        self.engine.close_rollout(session.rollout).result()
        held_map = session.hd_map.road is not None
        del session  # the last reference to its road: the map's arrays are freed here
        if held_map:
            release_map_memory()
        return True

    def _reap_idle(self) -> None:
        """Close the sessions no request has touched for ``alpasim.idle_timeout_s`` (a runtime that died)."""
        now = time.monotonic()
        with self._lock:
            idle = [s.id for s in self.sessions.values()
                    if now - s.last_used > self.settings.idle_timeout_s and not s.busy.locked()]
        for session_id in idle:
            if self.close(session_id):
                log.info("session %s closed after %.0f s without a request", session_id,
                         self.settings.idle_timeout_s)

    def shutdown(self) -> None:
        """Stop the engine; open sessions end (the pipeline stays open for its owner)."""
        self.engine.close()

    # ------------------------------------------------------------------ chunks

    def get(self, session_id: str) -> AlpasimSession:
        client_id(session_id, "session_id")
        with self._lock:
            session = self.sessions.get(session_id)
        if session is None:
            raise RequestError(f"no session {quoted(session_id)}: it was closed, expired after "
                               f"{self.settings.idle_timeout_s:g} s idle or never started; call start_session",
                               "NOT_FOUND")
        return session

    def render(self, session_id: str, times_us: np.ndarray, poses: np.ndarray,
               answered: Callable[[], bool] = lambda: True, wait_s: float = 0.0) -> Rendered:
        """One encoded image per pose (timestamps ``[m]`` µs, planar poses ``[m, 3]``), and HD-map frames if asked."""
        session = self.get(session_id)
        if not session.busy.acquire(timeout=max(0.0, min(wait_s, self.settings.idle_timeout_s))):
            raise SessionUnusable(f"session {session_id} is rendering a chunk; send its chunks one after another")
        try:
            session.last_used = time.monotonic()
            if session.failed:
                raise SessionUnusable(f"session {session_id} failed in an earlier chunk ({session.failed}); close "
                                      "it and start a new one")
            kept = session.last
            if kept is not None and np.array_equal(kept.times_us, times_us) and np.array_equal(kept.poses, poses):
                if not kept.committed:
                    session.track.commit(kept.chunk)
                    kept.committed = True
                return kept
            if kept is not None and not kept.committed:
                raise SessionUnusable(
                    f"session {session_id}: the chunk of {len(kept.times_us)} poses from {kept.times_us[0]} us was "
                    "rendered after its caller gave up; send that chunk again (the same poses) to get its frames")
            self.check_room(session, len(times_us))
            chunk = session.track.plan(times_us, poses)
            routes = session.hd_map.routes(poses)
            try:
                codes = None if session.skip_video else self._generate(session, chunk.actions, routes)
            except Exception as err:
                session.failed = error_line(err, memory_advice="lower alpasim.max_sessions")
                if isinstance(err, TerraInputError):  # the engine's refusal (shut down, closed meanwhile)
                    raise SessionUnusable(f"session {session_id}: {err}") from None
                raise
            images = [] if codes is None else self._encode(session, codes)
            hdmap = [] if session.view is None else self._draw(session, poses, routes)
            session.last = Rendered(times_us.copy(), poses.copy(), chunk, images, hdmap, committed=answered())
            if not session.last.committed:
                log.info("session %s: the chunk at %d us was abandoned by its caller; kept for its retry",
                         session_id, int(times_us[0]))
                raise SessionUnusable(f"session {session_id}: the caller gave up on the chunk; send it again")
            session.track.commit(chunk)
            return session.last
        finally:
            session.last_used = time.monotonic()
            session.busy.release()

    def check_room(self, session: AlpasimSession, count: int) -> None:
        """Refuse a chunk of ``count`` poses beyond what ``session`` may still render (``alpasim.max_frames``)."""
        left = self.settings.max_frames - session.track.frames
        if count > left:
            raise RequestError(f"session {session.id} has rendered {session.track.frames} frames and may render "
                               f"{left} more (alpasim.max_frames={self.settings.max_frames}); the chunk asks for "
                               f"{count}: start a new session, or the server with more", "OUT_OF_RANGE")

    def _generate(self, session: AlpasimSession, actions: np.ndarray, routes: np.ndarray | None) -> np.ndarray:
        """The chunk's codes ``[m, h, w]``, its frames known up front: one request."""
        results = self.engine.steps(session.rollout, actions, self.sampling,
                                    None if routes is None else list(routes)).result()
        return np.stack([result.codes.reshape(self.pipeline.tokenizer.grid_shape) for result in results])

    def _encode(self, session: AlpasimSession, codes: np.ndarray) -> list[bytes]:
        return [self._image(rgb if tuple(rgb.shape[:2]) == session.size
                            else fit_frame(Image.fromarray(rgb), session.size, "a frame", "crop"))
                for rgb in self.pipeline.decode(codes)]

    def _draw(self, session: AlpasimSession, poses: np.ndarray, routes: np.ndarray | None) -> list[bytes]:
        """The HD-map condition frames of a chunk: each frame's told route."""
        return [self._image(session.view.draw(pose, None if routes is None else routes[i]))
                for i, pose in enumerate(poses)]

    def _image(self, rgb: np.ndarray) -> bytes:
        return encode_image(rgb, self.settings.image_format, self.settings.jpeg_quality)
