"""The server's sessions: creation from a JSON spec, limits, stepping on the event loop, the idle reaper."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from terra.config.checks import shown
from terra.config.sampling import SamplingConfig
from terra.contract.routes import TOLD
from terra.core.errors import TerraInputError
from terra.decoder.writers import encode_image
from terra.serve.media import decode_upload
from terra.serve.settings import ServeSettings
from terra.session import Frame, Session, SessionHost
from terra.session.context import OWN_ROAD

log = logging.getLogger("terra.serve")
CONTEXT_KINDS = ("builtin", "images", "codes")
SPEC_KEYS = {"context", "seed", "sampling", "num_context", "max_frames", "road"}
MAX_WAITING_STEPS = 8  # HTTP steps queued on one session before 429


class LimitError(TerraInputError):
    """A limit was reached (too many sessions, a busy session): HTTP 429."""


class NotFoundError(TerraInputError):
    """No such session: HTTP 404."""


@dataclass
class Entry:
    """A session with what the server keeps beside it."""

    session: Session
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    waiting: int = 0
    sockets: set = field(default_factory=set)  # open socket connections

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def info(self) -> dict[str, Any]:
        session = self.session
        return {"id": session.id, "context": session.context.source, "num_context": session.num_context,
                "route": session.route_source is not None and (TOLD in session.route_told or not session.route_told),
                "route_source": session.route_source, "routed_steps": session.route_told.count(TOLD),
                "route_told": session.route_told, "frames": session.num_generated, "max_frames": session.max_frames,
                "seed": session.rollout.state.seed, "sampling": dataclasses.asdict(session.sampling),
                "speed_kmh": round(session.driver.speed_kmh, 2),
                "decoding": session.pass_stats().as_dict(session.sampling),
                "idle_s": round(time.monotonic() - self.last_used, 3), "sockets": len(self.sockets)}


class SessionService:
    """Open sessions of one server and their limits (:class:`~terra.serve.settings.ServeSettings`)."""

    def __init__(self, host: SessionHost, settings: ServeSettings, decode_threads: int = 2) -> None:
        self.host = host
        self.settings = settings
        self.entries: dict[str, Entry] = {}
        self.pool = ThreadPoolExecutor(max_workers=decode_threads, thread_name_prefix="terra-serve-decode")
        self.started = time.monotonic()
        self._opening = 0
        self._reaper: asyncio.Task | None = None

    # ------------------------------------------------------------------ sessions

    async def create(self, spec: Any) -> Entry:
        """Open a session from a JSON spec with ``context``, ``seed``, ``sampling``, ``num_context``, ``max_frames``,
        ``road`` (all optional)."""
        if not isinstance(spec, dict):
            raise TerraInputError("the body must be a JSON object, e.g. {\"context\": {\"builtin\": {}}}")
        unknown = sorted(set(spec) - SPEC_KEYS)
        if unknown:
            raise TerraInputError(f"unknown session settings {unknown}; use {', '.join(sorted(SPEC_KEYS))}")
        sampling = None if spec.get("sampling") is None else SamplingConfig.from_mapping(spec["sampling"])
        if len(self.entries) + self._opening >= self.settings.max_sessions:
            raise LimitError(f"too many sessions ({len(self.entries)} open, serve.max_sessions="
                             f"{self.settings.max_sessions}); close one (DELETE /sessions/ID) or wait for idle ones "
                             f"to expire")
        self._opening += 1
        try:
            session = await self.run(lambda: self._open(spec, sampling))
        finally:
            self._opening -= 1
        entry = Entry(session)
        self.entries[session.id] = entry
        log.info("session %s opened (%s)", session.id, session.context.source)
        return entry

    def _open(self, spec: dict, sampling: SamplingConfig) -> Session:
        """Build the context (encoding images) and open the session; runs on the thread pool."""
        host = self.host
        road = host.given_road(spec["road"]) if "road" in spec else OWN_ROAD  # before any image is encoded
        context = spec.get("context", {"builtin": {}})
        if not isinstance(context, dict) or len([k for k in CONTEXT_KINDS if k in context]) != 1:
            raise TerraInputError(f"context must be an object with one of {', '.join(CONTEXT_KINDS)} "
                                  f"(got {context!r:.80})")
        num_context = spec.get("num_context", host.num_context)
        common = {"seed": spec.get("seed"), "sampling": sampling, "max_frames": spec.get("max_frames"), "road": road}
        if "builtin" in context:
            _only(context, {"builtin"}, "context")
            builtin = context["builtin"]
            if not isinstance(builtin, dict):
                raise TerraInputError("context.builtin must be an object: {manoeuvre, scene, speed_kmh}")
            _only(builtin, {"manoeuvre", "scene", "speed_kmh"}, "context.builtin")
            return host.open(builtin=builtin, num_context=num_context, **common)
        kind = "images" if "images" in context else "codes"
        _only(context, {kind, "actions", "speed_kmh"}, "context")
        options = {"actions": context.get("actions"), "speed_kmh": context.get("speed_kmh", 30.0)}
        if kind == "codes":
            return host.open(codes=context["codes"], **common, **options)
        images = context["images"]
        window = host.layout.max_frames - 1
        if not isinstance(images, list) or not 1 <= len(images) <= window:
            raise TerraInputError(f"context.images must be a list of 1 to {window} images (base64 or data URLs)")
        frames = [decode_upload(value, i, host.pipeline.image_size, host.resize) for i, value in enumerate(images)]
        return host.open(images=frames, num_context=num_context, **common, **options)

    def get(self, session_id: str) -> Entry:
        entry = self.entries.get(session_id)
        if entry is None:
            raise NotFoundError(f"no session {shown(session_id)}; it was closed, expired or never existed "
                                "(GET /sessions lists the open ones)")
        return entry

    async def delete(self, session_id: str, reason: str = "session closed") -> None:
        """Close a session and its sockets (each gets a close frame naming ``reason``)."""
        entry = self.entries.pop(session_id, None)
        if entry is None:
            raise NotFoundError(f"no session {shown(session_id)}")  # a client's id: quoted short
        await asyncio.gather(*(conn.close(1000, reason) for conn in list(entry.sockets)), return_exceptions=True)
        await asyncio.wrap_future(self.host.engine.close_rollout(entry.session.rollout))
        log.info("session %s closed: %s", session_id, reason)

    async def fork(self, entry: Entry) -> Entry:
        if len(self.entries) + self._opening >= self.settings.max_sessions:
            raise LimitError(f"too many sessions to fork (serve.max_sessions={self.settings.max_sessions})")
        self._opening += 1
        try:
            async with entry.lock:
                twin = await self.run(entry.session.fork)
        finally:
            self._opening -= 1
        self.entries[twin.id] = Entry(twin)
        return self.entries[twin.id]

    async def reset(self, entry: Entry) -> None:
        async with entry.lock:
            await self.run(entry.session.reset)
            entry.touch()

    async def step(self, entry: Entry, action: np.ndarray) -> tuple[Frame, bytes, dict[str, Any]]:
        """Generate the entry's next frame under ``action``; the frame, its image bytes and its header."""
        if entry.waiting >= MAX_WAITING_STEPS:
            raise LimitError(f"session {entry.session.id} already has {entry.waiting} steps waiting; "
                             "wait for their frames")
        entry.waiting += 1
        try:
            async with entry.lock:
                entry.touch()
                started = time.perf_counter()
                result = await asyncio.wrap_future(entry.session.step_async(action))
                frame, image, encode_s = await self.run(lambda: self._render(entry.session, result))
                entry.touch()
        finally:
            entry.waiting -= 1
        header = {
            "type": "frame", "session": entry.session.id, "index": frame.index,
            "format": self.settings.image_format, "pose": [round(v, 4) for v in frame.pose],
            "speed_kmh": round(frame.speed_kmh, 2), "passes": frame.passes, "route_told": frame.route_told,
            "path": [[round(float(x), 3), round(float(y), 3)] for y, x, _ in frame.action],
            "timings": {**{k: round(v, 4) for k, v in frame.timings.items()}, "encode_s": round(encode_s, 4),
                        "total_s": round(time.perf_counter() - started, 4)},
        }
        return frame, image, header

    async def context_image(self, entry: Entry) -> str:
        """The session's last context frame as the model sees it, as a data URL."""
        session = entry.session
        image = await self.run(lambda: encode_image(self.host.decode(session.context.codes[-1:])[0],
                                                     self.settings.image_format, self.settings.jpeg_quality))
        return f"data:image/{self.settings.image_format};base64,{base64.b64encode(image).decode()}"

    def _render(self, session: Session, result) -> tuple[Frame, bytes, float]:
        frame = session.frame(result)
        start = time.perf_counter()
        image = encode_image(frame.rgb, self.settings.image_format, self.settings.jpeg_quality)
        return frame, image, time.perf_counter() - start

    async def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the server's thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    # ------------------------------------------------------------------ server life

    def metrics(self) -> dict[str, Any]:
        return {"sessions": len(self.entries), "max_sessions": self.settings.max_sessions,
                "sockets": sum(len(e.sockets) for e in self.entries.values()),
                "uptime_s": round(time.monotonic() - self.started, 1), "backend": self.host.backend.name,
                **self.host.engine.metrics()}

    def start(self) -> None:
        """Start the idle reaper (call on the server's event loop)."""
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        timeout = self.settings.idle_timeout_s
        while True:
            await asyncio.sleep(min(5.0, timeout / 4))
            now = time.monotonic()
            idle = [session_id for session_id, entry in self.entries.items()
                    if now - entry.last_used > timeout and not entry.lock.locked()]
            await asyncio.gather(*(self.delete(i, f"idle timeout: no step for {timeout:g} s") for i in idle),
                                 return_exceptions=True)

    async def close_sockets(self, code: int, reason: str) -> None:
        """Send every open socket a close frame (graceful shutdown)."""
        conns = [c for e in self.entries.values() for c in e.sockets]
        await asyncio.gather(*(c.close(code, reason) for c in conns), return_exceptions=True)

    async def shutdown(self) -> None:
        """Close sockets and sessions, stop the engine and the thread pool."""
        if self._reaper is not None:
            self._reaper.cancel()
        await self.close_sockets(1001, "server shutting down")
        self.entries.clear()
        self.host.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


def _only(value: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(value) - allowed)
    if extra:
        raise TerraInputError(f"unknown keys {extra} in {where}; it takes {', '.join(sorted(allowed))}")
