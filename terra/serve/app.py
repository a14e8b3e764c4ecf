"""``terra-serve``'s HTTP and WebSocket interface (FastAPI), its page at ``/`` and its uvicorn server."""

from __future__ import annotations

import base64
import contextlib
import logging
import secrets
from importlib.resources import files
from pathlib import Path
from typing import Any, Sequence

from fastapi import APIRouter, Depends, FastAPI, Request, WebSocket
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
import uvicorn

from terra.config.files import parse_json
from terra.core.atomic import json_text
from terra.core.errors import TerraInputError
from terra.serve.guard import RequestGuard
from terra.serve.media import VIDEO_FORMATS, video_bytes
from terra.serve.service import LimitError, NotFoundError, SessionService
from terra.serve.sockets import MAX_DIGITS, SocketConnection
from terra.session.driver_input import parse_action, refuse_route

log = logging.getLogger("terra.serve")
STATIC = Path(str(files("terra.serve") / "static"))
SUBPROTOCOL = "terra"


def _error(status: int, message: str, headers: dict | None = None) -> Response:
    """``{"error": message}``, ASCII-escaped (a message may quote a client's string, lone surrogates and all)."""
    return Response(json_text({"error": message}), status_code=status, headers=headers,
                    media_type="application/json")


def create_app(service: SessionService) -> FastAPI:
    """The FastAPI app serving ``service``'s sessions (the model is loaded: ``/health`` answers 200)."""
    settings = service.settings

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        yield
        await service.shutdown()

    app = FastAPI(title="terra-serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    if settings.cors:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(RequestGuard, settings=settings)  # added last, so it runs first

    def authorized(header: str | None, offered: Sequence[str] = ()) -> bool:
        if settings.token is None:
            return True
        wanted = [f"Bearer {settings.token}", f"bearer.{settings.token}"]
        given = [header or "", *offered]
        return any(secrets.compare_digest(g.encode(), w.encode()) for g in given for w in wanted)

    def require_token(request: Request) -> None:
        if not authorized(request.headers.get("authorization")):
            raise HTTPException(401, "missing or wrong bearer token; send the header Authorization: Bearer <token>",
                                headers={"WWW-Authenticate": "Bearer"})

    async def read_json(request: Request) -> Any:
        """The request body as JSON, at most ``serve.max_request_bytes`` (413 beyond, before reading it all)."""
        limit = settings.max_request_bytes
        too_large = HTTPException(413, f"request body over serve.max_request_bytes={limit} bytes; send fewer or "
                                       "smaller context images")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
        return parse_json(bytes(body), "request body", MAX_DIGITS, finite=False) if body.strip() else {}

    @app.exception_handler(TerraInputError)
    async def input_error(request: Request, err: TerraInputError) -> Response:
        return _error(404 if isinstance(err, NotFoundError) else 429 if isinstance(err, LimitError) else 400, str(err))

    @app.exception_handler(StarletteHTTPException)  # FastAPI's, and the router's own 404 / 405
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        return _error(err.status_code, str(err.detail), getattr(err, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, err: ClientDisconnect) -> Response:
        log.info("client left before its request was read: %s %s", request.method, request.url.path)  # no error
        return _error(400, "the client disconnected before its request was read")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError) -> Response:
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(422, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception) -> Response:
        log.exception("internal error on %s", request.url.path)
        return _error(500, f"internal error ({type(err).__name__}); the server log has the details")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "backend": service.host.backend.name, "sessions": len(service.entries),
                "token_required": settings.token is not None}

    api = APIRouter(dependencies=[Depends(require_token)])

    @api.get("/metrics")
    async def metrics() -> dict:
        return service.metrics()

    @api.get("/sessions")
    async def list_sessions() -> dict:
        return {"sessions": [entry.info() for entry in service.entries.values()]}

    @api.post("/sessions", status_code=201)
    async def create_session(request: Request) -> dict:
        return (await service.create(await read_json(request))).info()

    @api.get("/sessions/{session_id}")
    async def get_session(session_id: str) -> dict:
        return service.get(session_id).info()

    @api.delete("/sessions/{session_id}", status_code=204)
    async def delete_session(session_id: str) -> Response:
        await service.delete(session_id, "session deleted")
        return Response(status_code=204)

    @api.post("/sessions/{session_id}/step")
    async def step(session_id: str, request: Request) -> dict:
        entry = service.get(session_id)
        body = await read_json(request)
        if isinstance(body, dict):
            refuse_route(body, "a step")
        if not isinstance(body, dict) or "action" not in body or not set(body) <= {"action", "codes"}:
            raise TerraInputError("the body must be {\"action\": ..., \"codes\": false}, e.g. "
                                  "{\"action\": {\"steer\": 0, \"speed_kmh\": 30}}")
        frame, image, header = await service.step(entry, parse_action(body["action"]))
        header["image"] = f"data:image/{settings.image_format};base64,{base64.b64encode(image).decode()}"
        if body.get("codes") is True:
            header["codes"] = frame.codes.tolist()
        return header

    @api.post("/sessions/{session_id}/fork", status_code=201)
    async def fork(session_id: str) -> dict:
        return (await service.fork(service.get(session_id))).info()

    @api.post("/sessions/{session_id}/reset")
    async def reset(session_id: str) -> dict:
        entry = service.get(session_id)
        await service.reset(entry)
        return entry.info()

    @api.get("/sessions/{session_id}/video")
    async def video(session_id: str, format: str = "mp4") -> Response:
        entry = service.get(session_id)
        if format not in VIDEO_FORMATS:
            raise TerraInputError(f"format must be one of {', '.join(VIDEO_FORMATS)} (got {format!r})")
        session = entry.session
        data = await service.run(lambda: video_bytes(session.video(), session.num_context, format))
        headers = {"Content-Disposition": f'attachment; filename="terra-{session.id}.{format}"'}
        return Response(data, media_type=VIDEO_FORMATS[format], headers=headers)

    app.include_router(api)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.websocket("/sessions/{session_id}/ws")
    async def socket(websocket: WebSocket, session_id: str) -> None:
        offered = list(websocket.scope.get("subprotocols", []))
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        if not authorized(websocket.headers.get("authorization"), offered):
            await websocket.send_json({"type": "error", "message": "missing or wrong token; offer the subprotocol "
                                       "bearer.<token> or send Authorization: Bearer <token>"})
            return await websocket.close(1008, "unauthorized")
        entry = service.entries.get(session_id)
        if entry is None:
            await websocket.send_json({"type": "error", "message": f"no session {session_id!r}"})
            return await websocket.close(1008, "no such session")
        await SocketConnection(websocket, entry, service).run()

    return app


class GracefulServer(uvicorn.Server):
    """uvicorn's server, which says where it listens and closes every open socket on shutdown."""

    def __init__(self, config: uvicorn.Config, service: SessionService) -> None:
        super().__init__(config)
        self.service = service

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            print(f"terra-serve: {self.service.host.backend.name} backend ready; open http://{shown}:{port}/",
                  flush=True)

    async def shutdown(self, sockets=None) -> None:
        await self.service.close_sockets(1001, "server shutting down")
        await super().shutdown(sockets)
