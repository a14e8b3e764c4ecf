"""``terra-serve``: the world model behind HTTP and WebSocket, and a page to drive it."""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Mapping

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.config.checks import select
from terra.config.spec import RunSpec, run_spec
from terra.core.errors import TerraInputError
from terra.serve.settings import ServeSettings

if TYPE_CHECKING:
    from terra.roads import Road
    from terra.serve.service import SessionService


BAD_HANDSHAKE = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 47\r\n"
                 b"Connection: close\r\n\r\nnot a WebSocket handshake this server can read\n")


def websocket_protocol() -> type | str:
    """uvicorn's websockets sans-I/O protocol, made to send the answer websockets gives a handshake it refuses."""
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
    except ImportError:
        return "auto"

    class AnsweringProtocol(WebSocketsSansIOProtocol):
        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.handshake_exc is not None and not self.handshake_initiated \
                    and not self.transport.is_closing():
                self.transport.write(b"".join(self.conn.data_to_send()) or BAD_HANDSHAKE)
                self.transport.close()

    return AnsweringProtocol


def bind(settings: ServeSettings) -> socket.socket:
    """The server's socket, bound to ``serve.host:serve.port``, not yet listening; a bind failure is one line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        sock.bind(address)
    except OSError as err:
        raise TerraInputError(f"cannot listen on {settings.host}:{settings.port} ({err.strerror or err}); stop the "
                              "program that uses the port or choose another serve.port / serve.host") from None
    return sock


def load_service(spec: RunSpec, settings: ServeSettings, roads: Mapping[str, Road]) -> SessionService:
    """(1) the run made concrete and its pipeline, (2) the session service."""
    # torch, Transformers, FastAPI and uvicorn load only once the settings are known to be good
    from terra.pipeline import WorldModelPipeline
    from terra.run import resolve_run
    from terra.serve.service import SessionService
    from terra.session import SessionHost

    # a vLLM engine's decoding chosen for its most sessions, and its room
    run = resolve_run(spec, settings.max_sessions, max_rollouts=settings.max_sessions)
    spec = run.spec
    pipeline = WorldModelPipeline.from_run(run)
    host = SessionHost(pipeline, spec.sampling, max_frames=settings.max_frames, overlap=spec.overlap,
                       num_context=spec.num_context, resize=spec.resize, roads=roads)
    return SessionService(host, settings)


def serve(service: SessionService, sock: socket.socket) -> None:
    """Run the server on ``sock`` until interrupted; the pipeline is closed afterwards."""
    import uvicorn

    from terra.serve.app import GracefulServer, create_app

    settings = service.settings
    config = uvicorn.Config(
        create_app(service), host=settings.host, port=settings.port, log_level=settings.log_level,
        ws=websocket_protocol(), ws_max_size=settings.max_message_bytes, timeout_graceful_shutdown=10, lifespan="on",
    )
    server = GracefulServer(config, service)
    try:
        server.run(sockets=[sock])
    finally:
        service.host.pipeline.close()


@hydra.main(config_path=CONFIG_PATH, config_name="serve", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(name)s: %(message)s")
    check_added_settings("terra-serve", allowed=("backend.options.",), cfg=cfg)
    settings = ServeSettings.from_mapping(select(cfg, "serve"))
    spec = run_spec(cfg)
    from terra.session.context import named_roads

    roads = named_roads(settings.roads)  # every road file read and checked before the model loads
    with bind(settings) as sock:  # before the model loads: a port in use is one line at once
        serve(load_service(spec, settings, roads), sock)


main = console_script(_main, "terra-serve", extras=("serve",))


if __name__ == "__main__":
    main()
