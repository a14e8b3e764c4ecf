"""Generation: rollout requests and their windows, the token layout, sampling, and the backends that run them.

:mod:`terra.generation.rollout` defines what a rollout is (:class:`RolloutRequest`, :class:`RolloutState`)
and the :class:`WorldModelBackend` interface; :mod:`terra.generation.backends` picks and builds a backend;
:mod:`terra.generation.hf_backend` (Transformers) and :mod:`terra.generation.vllm_backend` (vLLM) implement
it. Nothing outside :mod:`terra.generation.backends` names a backend class.
"""

from terra.generation.rollout import FrameCallback, RolloutRequest, RolloutState, WorldModelBackend
from terra.generation.sampling import SamplingConfig

__all__ = ["FrameCallback", "RolloutRequest", "RolloutState", "SamplingConfig", "WorldModelBackend"]
