"""How image tokens are drawn: :class:`SamplingConfig` (temperature, top-k, top-p) and its documented ranges.

Light (no torch): apps check ``sampling`` before any model loads; the backends' samplers take the config as
it is (terra/generation/sampling.py for Transformers, vLLM's own for vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from terra.config.checks import Range, TerraInputError

SAMPLING = {  # SamplingConfig checks these
    "temperature": Range(0, 10, 1.0),
    "top_k": Range(0, 1 << 20, 0, whole=True),
    "top_p": Range(0, 1, 1.0, low_open=True),
}


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature (0 = greedy), top-k (0 = off) and top-p (1.0 = off); Terra's authors used 0.9 / 0 / 1.0."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        for name, limits in SAMPLING.items():
            limits.check(getattr(self, name), f"sampling.{name}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_mapping(cls, options: Any) -> "SamplingConfig":
        """The ``sampling`` settings (names of :data:`SAMPLING`) as a config; unknown names fail with one line."""
        if not isinstance(options, Mapping) or not set(options) <= set(SAMPLING):
            unknown = sorted(set(options) - set(SAMPLING)) if isinstance(options, Mapping) else options
            raise TerraInputError(f"sampling must be an object with some of {', '.join(SAMPLING)} "
                                  f"(got {unknown!r:.80})")
        return cls(**options)
