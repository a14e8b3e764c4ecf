"""A run made concrete once for this process: :func:`resolve_run` and the :class:`ResolvedRun` the apps carry."""

from __future__ import annotations

from dataclasses import dataclass

from terra.config.spec import RunSpec
from terra.generation.resolve import BackendRun, resolve_backend_run
from terra.models import LlamaActionConfig
from terra.refiner import RefinerSettings, refiner_settings


@dataclass(frozen=True)
class ResolvedRun(BackendRun):
    """A run as this process makes it, once (:func:`resolve_run`): what :meth:`WorldModelPipeline.from_run` builds."""

    refiner: RefinerSettings | None  # decoder=refiner: its checked weights and device


def resolve_run(spec: RunSpec, streams: int = 1, model: LlamaActionConfig | None = None,
                refine_after: bool = False, max_rollouts: int | None = None) -> ResolvedRun:
    """Make a checked :class:`~terra.config.spec.RunSpec` concrete for this process, once per run and in the same
    order for every app: its backend's settings in one step (`resolve`, ``resolve_backend_run``: the model's
    config read and its window checked, unless ``model`` is that config as the run already read it (a Ray actor
    gets it from its driver), its token layout, threads, device, dtype and backend, the refiner's device,
    decoding, guesses and block for at most ``streams`` rollouts in flight of that model, vLLM's request path, the
    engine's options fitted to the ``memory`` preset with the refiner beside the engine unless ``refine_after``:
    the app refines once the engine is closed, as terra-generate does, and a vLLM engine's room for
    ``max_rollouts`` rollouts in flight with its passes a step; None: the backend's options decide), then
    ``decoder=refiner``'s settings checked on the device chosen."""
    place = "off" if spec.decoder == "tokenizer" else "after" if refine_after else "shared"
    run = resolve_backend_run(spec, streams, model, place, max_rollouts)
    return ResolvedRun(**vars(run), refiner=refiner_settings(run.spec, run.refiner_device))
