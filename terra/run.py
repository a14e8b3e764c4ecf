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
    """A checked ``RunSpec`` made concrete for ``streams`` rollouts in flight; ``model`` read if None."""
    place = "off" if spec.decoder == "tokenizer" else "after" if refine_after else "shared"
    run = resolve_backend_run(spec, streams, model, place, max_rollouts)
    return ResolvedRun(**vars(run), refiner=refiner_settings(run.spec, run.refiner_device))
