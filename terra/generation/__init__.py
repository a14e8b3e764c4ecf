"""Generation: rollout requests and their windows, sampling, and the backends that run them.

The model's contract (actions, routes, token layout) lives a floor below, in :mod:`terra.contract`; its modules' old
paths here (``terra.generation.actions``, ``.routes``, ``.layout``) still import until 0.2.0 (terra/core/lazy.py).
:mod:`terra.generation.rollout` defines what a rollout is (:class:`RolloutRequest`, :class:`RolloutState`) and the
:class:`WorldModelBackend` interface; :mod:`terra.generation.resolve` makes a run's backend settings concrete once
(``decoding=auto``: :mod:`terra.generation.decoding`, ``auto_decoding``) and :mod:`terra.generation.backends` builds the
backend they name; :mod:`terra.generation.hf_backend` (Transformers) and :mod:`terra.generation.vllm_backend` (vLLM)
implement it. Nothing outside :mod:`terra.generation.backends` names a backend class. The names below load on first use,
so importing the package loads no torch.
"""

from __future__ import annotations

from terra.core.lazy import lazy_face, moved_modules

_HOMES = {
    "FrameCallback": "terra.generation.rollout",
    "RolloutRequest": "terra.generation.rollout",
    "RolloutState": "terra.generation.rollout",
    "WorldModelBackend": "terra.generation.rollout",
    "SamplingConfig": "terra.config.sampling",
}

__all__, __getattr__ = lazy_face(__name__, _HOMES)
# the contract moved a floor down (terra/contract/): its old paths until this release
MOVED_MODULES = moved_modules(__name__, {name: name for name in ("actions", "layout", "routes")}, home="terra.contract")
