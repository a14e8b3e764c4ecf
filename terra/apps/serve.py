"""``terra-serve``: the world model behind HTTP and WebSocket, and a page to drive it (Hydra app, conf/serve.yaml).

Settings are checked before the model loads; a mistake exits with code 2 and one line on stderr. The model
loads before the port opens, so ``GET /health`` answers 200 as soon as anything answers. On SIGINT/SIGTERM
open sockets get a close frame (1001, "server shutting down") before the server stops; then the process ends
as every app does on an interrupt (terra/apps/runner.py, ``run_app``: exit 130 / 143).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import hydra
import uvicorn
from omegaconf import DictConfig, OmegaConf

from terra.apps.runner import CONFIG_PATH, check_added_settings, run_app, task
from terra.config.spec import check_window, run_spec
from terra.serve.settings import ServeSettings

if TYPE_CHECKING:
    from terra.serve.service import SessionService


class GracefulServer(uvicorn.Server):
    """uvicorn's server that first sends every open socket a close frame naming the reason."""

    def __init__(self, config: uvicorn.Config, service: SessionService) -> None:
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets=None) -> None:
        await self.service.close_sockets(1001, "server shutting down")
        await super().shutdown(sockets)


def load_service(cfg: DictConfig) -> SessionService:
    """(1) the settings, (2) the window and the pipeline, (3) the session service."""
    settings = ServeSettings.from_mapping(OmegaConf.to_container(cfg.serve, resolve=True))
    spec = run_spec(cfg)
    # torch, Transformers and FastAPI load only once the settings above are known to be good
    from terra.generation.backends import resolve_spec, set_torch_threads
    from terra.models.checkpoint import read_world_model_config
    from terra.pipeline import WorldModelPipeline
    from terra.serve.service import SessionService
    from terra.session import SessionHost

    set_torch_threads(spec.num_threads)
    spec = resolve_spec(spec, settings.max_sessions)  # a vLLM engine's decoding chosen for its most sessions
    config = read_world_model_config(spec.world_model)
    check_window(config.num_temporal_embeddings, spec.num_context, spec.overlap)
    pipeline = WorldModelPipeline.from_spec(spec, config=config)
    host = SessionHost(pipeline, spec.sampling, max_frames=settings.max_frames, overlap=spec.overlap,
                       num_context=spec.num_context, resize=spec.resize)
    return SessionService(host, settings)


def serve(service: SessionService) -> None:
    """Run the server until interrupted; the pipeline is closed afterwards."""
    from terra.serve.app import create_app

    settings = service.settings
    config = uvicorn.Config(
        create_app(service), host=settings.host, port=settings.port, log_level=settings.log_level,
        ws_max_size=settings.max_message_bytes, timeout_graceful_shutdown=10, lifespan="on",
    )
    server = GracefulServer(config, service)
    try:
        server.run()
    finally:
        service.host.pipeline.close()


@hydra.main(config_path=CONFIG_PATH, config_name="serve", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(name)s: %(message)s")
    check_added_settings("terra-serve", allowed=("backend.options.",))
    service = load_service(cfg)
    settings = service.settings
    print(f"terra-serve: {service.host.backend.name} backend ready; open http://{settings.host}:"
          f"{settings.port}/", flush=True)
    serve(service)


def main() -> None:
    """Console-script entry point; how it ends (exit codes, one line on stderr) is terra/apps/runner.py's run_app."""
    run_app(_main, "terra-serve")


if __name__ == "__main__":
    main()
