"""One WebSocket per session: actions or key states in, frames out as soon as each is generated."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from terra.config.checks import check_keys
from terra.config.files import parse_json
from terra.core.atomic import json_text
from terra.core.errors import TerraInputError
from terra.serve.media import frame_message
from terra.serve.service import Entry, SessionService
from terra.session.driver_input import parse_action, refuse_route

log = logging.getLogger("terra.serve")
MESSAGE_TYPES = ("step", "keys", "drive", "ack", "reset")
MAX_DIGITS = 300  # JSON integers from clients: a number's own range check names the setting beyond this


class SocketConnection:
    """A session's socket: a receiver that reads messages and a producer that generates and sends frames."""

    def __init__(self, websocket: WebSocket, entry: Entry, service: SessionService) -> None:
        self.websocket = websocket
        self.entry = entry
        self.service = service
        self.settings = service.settings
        self.steps: asyncio.Queue = asyncio.Queue(maxsize=self.settings.max_queued_steps)
        self.wakeup = asyncio.Event()
        self.driving = False
        self.sent = -1  # index of the last frame sent
        self.acked = -1  # of the last frame acknowledged (frames before driving started count as acknowledged)
        self.closing = False
        self._send_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task] = []

    async def run(self) -> None:
        """Serve the socket until the client leaves, stops reading, or the session closes."""
        self.entry.sockets.add(self)
        try:
            await self._send({"type": "ready", "session": self.entry.info(),
                                   "context_frame": await self.service.context_image(self.entry)})
            self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._produce())]
            await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        except (WebSocketDisconnect, RuntimeError):  # the client left (RuntimeError: sending after it did)
            pass
        finally:
            self.entry.sockets.discard(self)
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def close(self, code: int, reason: str) -> None:
        """Send a close frame (at most ``send_timeout_s`` waiting on a client that does not read)."""
        if self.closing:
            return
        self.closing = True
        self.entry.sockets.discard(self)
        if self.websocket.application_state == WebSocketState.CONNECTED:
            async with self._send_lock:  # after a frame being sent
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.websocket.close(code, reason[:120]), self.settings.send_timeout_s)
        for task in self._tasks:
            task.cancel()

    async def _receive(self) -> None:
        while not self.closing:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            try:
                self._handle(message)
            except TerraInputError as err:
                await self._send({"type": "error", "message": str(err)})
            except Exception:  # noqa: BLE001  (a bug: logged; the socket and the server go on)
                log.exception("session %s: a socket message failed", self.entry.session.id)
                await self._send({"type": "error", "message": "internal error; the server log has it"})

    def _handle(self, message: dict) -> None:
        """Act on one client message; bad input raises :class:`TerraInputError`."""
        if message.get("text") is None:
            raise TerraInputError("send JSON text messages, not binary ones")
        value = parse_json(message["text"], "message", MAX_DIGITS, finite=False)
        if not isinstance(value, dict) or value.get("type") not in MESSAGE_TYPES:
            raise TerraInputError(f"a message must be an object whose type is one of {', '.join(MESSAGE_TYPES)}")
        kind = value["type"]
        if kind == "step":
            refuse_route(value, "a step message")
            check_keys(value, ("type", "action"), "a step message", 'it holds {"type": "step", "action": ACTION}')
            if "action" not in value:
                raise TerraInputError("a step message needs an action, e.g. {\"type\": \"step\", \"action\": "
                                      "{\"steer\": 0, \"speed_kmh\": 30}}")
            self._queue(("step", parse_action(value["action"])))
        elif kind == "keys":
            self.entry.session.driver.set_keys(value.get("keys"))
        elif kind == "drive":
            if not isinstance(value.get("on"), bool):
                raise TerraInputError("a drive message needs on: true or false")
            self.driving = value["on"]
            self.acked = self.sent
        elif kind == "ack":
            index = value.get("index")
            if isinstance(index, bool) or not isinstance(index, int):
                raise TerraInputError("an ack message needs the index of the frame it acknowledges")
            self.acked = max(self.acked, min(index, self.sent))
        else:
            self._queue(("reset", None))
        self.wakeup.set()

    def _queue(self, item: tuple) -> None:
        try:
            self.steps.put_nowait(item)
        except asyncio.QueueFull:
            raise TerraInputError(f"{self.steps.maxsize} steps are already queued on this socket; wait for their "
                                  "frames") from None

    def _next(self) -> tuple | None:
        """The next job: a queued step or reset, else a driving frame when the client keeps up."""
        if not self.steps.empty():
            return self.steps.get_nowait()
        if self.driving and self.sent - self.acked < self.settings.drive_window:
            return ("drive", None)
        return None

    async def _produce(self) -> None:
        while True:
            job = self._next()
            if job is None:
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            kind, action = job
            try:
                if kind == "reset":
                    await self.service.reset(self.entry)
                    self.sent = self.acked = -1
                    await self._send({"type": "reset", "session": self.entry.info(),
                                           "context_frame": await self.service.context_image(self.entry)})
                    continue
                if kind == "drive":
                    action = self.entry.session.driver.action()
                _, image, header = await self.service.step(self.entry, action)
            except Exception as err:  # noqa: BLE001  (input errors are one line; a bug is logged, the socket goes on)
                if kind == "drive":
                    self.driving = False
                if not isinstance(err, TerraInputError):
                    log.exception("session %s: a step failed", self.entry.session.id)
                message = str(err) if isinstance(err, TerraInputError) else "internal error; the server log has it"
                await self._send({"type": "error", "message": message})
                continue
            self.sent = header["index"]
            await self._send(frame_message(header, image))

    async def _send(self, message: dict | bytes) -> None:
        """Send JSON text (or a frame's bytes) within ``send_timeout_s``; a client too slow to take it is cut off."""
        if self.closing:
            return
        async with self._send_lock:
            send = (self.websocket.send_bytes(message) if isinstance(message, bytes)
                    else self.websocket.send_text(json_text(message)))
            try:
                await asyncio.wait_for(send, self.settings.send_timeout_s)
            except asyncio.TimeoutError:
                log.warning("session %s: a socket did not read for %s s; closing it", self.entry.session.id,
                            self.settings.send_timeout_s)
                self.closing = True
                with contextlib.suppress(Exception):
                    await self.websocket.close(1008, "client does not read its frames")
                raise WebSocketDisconnect(1008) from None
