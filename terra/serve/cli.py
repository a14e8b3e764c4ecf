"""``terra-serve``: the world model behind HTTP and WebSocket, and a page to drive it (Hydra app, conf/serve.yaml).

Settings are checked before the model loads; a mistake exits with code 2 and one line on stderr. The model
loads before the port opens, so ``GET /health`` answers 200 as soon as anything answers. On SIGINT/SIGTERM
open sockets get a close frame (1001, "server shutting down") before the server stops; then the process ends
as every app does on an interrupt (terra/hydra_app.py, ``run_app``: exit 130 / 143).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import hydra
import uvicorn
from omegaconf import DictConfig, OmegaConf

from terra.errors import TerraInputError, check_whole_number
from terra.hydra_app import CONFIG_PATH, check_added_settings, run_app, task
from terra.serve.settings import ServeSettings

if TYPE_CHECKING:
    from terra.generation.sampling import SamplingConfig
    from terra.serve.service import SessionService


class GracefulServer(uvicorn.Server):
    """uvicorn's server that first sends every open socket a close frame naming the reason."""

    def __init__(self, config: uvicorn.Config, service: SessionService) -> None:
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets=None) -> None:
        await self.service.close_sockets(1001, "server shutting down")
        await super().shutdown(sockets)


def sampling_from(cfg: DictConfig) -> SamplingConfig:
    """The ``sampling`` group as a :class:`SamplingConfig` (unknown keys fail with one line)."""
    from terra.generation.sampling import SamplingConfig  # torch: after the settings are checked

    options = OmegaConf.to_container(cfg.sampling) if OmegaConf.is_dict(cfg.sampling) else None
    names = {f.name for f in dataclasses.fields(SamplingConfig)}
    if options is None or not set(options) <= names:
        raise TerraInputError(f"sampling settings {cfg.sampling} are unknown; use temperature, top_k, top_p")
    return SamplingConfig(**options)


def load_service(cfg: DictConfig) -> SessionService:
    """Check the configuration, load tokenizer and world model, and build the session service."""
    settings = ServeSettings.from_mapping(OmegaConf.to_container(cfg.serve, resolve=True))
    num_context = check_whole_number(cfg.num_context, "num_context", 1, "num_context=3")
    overlap = check_whole_number(cfg.model.overlap, "model.overlap", 1, "model.overlap=3")
    # torch, Transformers and FastAPI load only once the settings above are known to be good
    from terra.inputs import check_window
    from terra.models.checkpoint import read_world_model_config
    from terra.pipeline import WorldModelPipeline
    from terra.serve.service import SessionService
    from terra.session import SessionHost
    from terra.snapshot import checkpoint_path

    sampling = sampling_from(cfg)
    world_model = checkpoint_path(cfg, "model", "world_model")
    tokenizer = checkpoint_path(cfg, "tokenizer", "path")
    config = read_world_model_config(world_model)
    check_window(config.num_temporal_embeddings, num_context, overlap, "model.overlap")
    pipeline = WorldModelPipeline.from_pretrained(
        world_model, tokenizer, backend=str(cfg.backend.name), device=str(cfg.device), dtype=str(cfg.dtype),
        config=config, zero_embed_code_0=bool(cfg.model.get("zero_embed_code_0", False)),
        **OmegaConf.to_container(cfg.backend.options),
    )
    host = SessionHost(pipeline, sampling, max_frames=settings.max_frames, overlap=overlap, num_context=num_context,
                       resize=str(cfg.tokenizer.get("resize", "crop")))
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
    """Console-script entry point; how it ends (exit codes, one line on stderr) is terra/hydra_app.run_app's."""
    run_app(_main, "terra-serve")


if __name__ == "__main__":
    main()
