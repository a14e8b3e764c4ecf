"""Generation: the action contract, rollout requests and their windows, the token layout, sampling, and the
backends that run them.

:mod:`terra.generation.actions` states the model's action layout and rates; :mod:`terra.generation.rollout`
defines what a rollout is (:class:`RolloutRequest`, :class:`RolloutState`) and the :class:`WorldModelBackend`
interface; :mod:`terra.generation.backends` picks and builds a backend and decides ``decoding=auto`` once per run
(:mod:`terra.generation.decoding`, ``auto_decoding``); :mod:`terra.generation.hf_backend` (Transformers) and
:mod:`terra.generation.vllm_backend` (vLLM) implement it. Nothing outside :mod:`terra.generation.backends` names a
backend class. The names below load on first use, so the action contract is importable without torch.
"""

from __future__ import annotations

from terra.core.lazy import lazy_face

_HOMES = {
    "FrameCallback": "terra.generation.rollout",
    "RolloutRequest": "terra.generation.rollout",
    "RolloutState": "terra.generation.rollout",
    "WorldModelBackend": "terra.generation.rollout",
    "SamplingConfig": "terra.config.sampling",
}

__all__, __getattr__ = lazy_face(__name__, _HOMES)
