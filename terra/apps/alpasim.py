"""``terra-alpasim``: the world model as AlpaSim's video-model renderer, its ``WorldModelService`` over gRPC."""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, console_script, task
from terra.alpasim.settings import AlpasimSettings, alpasim_spec
from terra.config.spec import RunSpec

STOP_GRACE_S = 5.0  # calls in flight get this long to end when the server stops


def serve(spec: RunSpec, settings: AlpasimSettings, model: str) -> None:
    """Bind, load the model, serve until interrupted, then close everything."""
    from terra.alpasim.service import WorldModelServicer, bind, start

    server, port = bind(settings)  # before the model loads: a port in use is one line at once
    # torch and the model load only once the settings are known to be good and the port is ours
    from terra.alpasim.sessions import SessionTable
    from terra.pipeline import WorldModelPipeline
    from terra.run import resolve_run

    # a vLLM engine's decoding chosen for its most sessions, and its room
    run = resolve_run(spec, settings.max_sessions, max_rollouts=settings.max_sessions)
    pipeline = WorldModelPipeline.from_run(run)
    table = SessionTable(pipeline, settings, run.spec.sampling, run.spec.overlap, run.spec.resize)
    try:
        start(server, WorldModelServicer(table, model))
        print(f"terra-alpasim: {pipeline.backend.name} backend ready; WorldModelService on "
              f"{settings.address.rsplit(':', 1)[0]}:{port}", flush=True)
        server.wait_for_termination()
    finally:
        server.stop(STOP_GRACE_S).wait()
        table.shutdown()
        pipeline.close()


@hydra.main(config_path=CONFIG_PATH, config_name="alpasim", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(name)s: %(message)s")
    check_added_settings("terra-alpasim", allowed=("backend.options.",), cfg=cfg)
    spec, settings = alpasim_spec(cfg)
    serve(spec, settings, str(cfg.model.get("name", "world model")))


main = console_script(_main, "terra-alpasim", extras=("alpasim",))


if __name__ == "__main__":
    main()
