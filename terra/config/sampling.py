"""How image tokens are drawn: :class:`SamplingConfig` and its ranges. Light (no torch)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from terra.config.checks import Range, check_choice
from terra.core.errors import TerraInputError

DRAW_RULE = "gumbel-max, noise hashed from (seed, frame, position, code)"
DECODINGS = ("auto", "sequential", "speculative")
# a frame's speculative guesses; auto: what the backend runs (Transformers: lookahead; vLLM: previous)
GUESSES = ("auto", "previous", "transitions", "lookahead")
SAMPLING = {  # SamplingConfig checks these
    "temperature": Range(0, 10, 1.0),
    "top_k": Range(0, 1 << 20, 0, whole=True),
    "top_p": Range(0, 1, 1.0, low_open=True),
    "draft_tokens": Range(1, 4096, 32, whole=True),  # or auto
}


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature (0 = greedy), top-k (0 = off) and top-p (1.0 = off), and how tokens are decoded.

    ``decoding`` (sequential | speculative | auto), ``draft_tokens`` and ``guesses`` change speed only: for a seed a
    backend gives the same codes whatever they are.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    decoding: str = "auto"
    draft_tokens: int | str = "auto"
    guesses: str = "auto"

    def __post_init__(self) -> None:
        for name, limits in SAMPLING.items():
            value = getattr(self, name)
            if name == "draft_tokens" and isinstance(value, str):
                if value != "auto":
                    raise TerraInputError(f"sampling.draft_tokens must be auto or a whole number from {limits.low:g} "
                                          f"to {limits.high:g} (got {value!r}); e.g. sampling.draft_tokens=auto")
                continue
            limits.check(value, f"sampling.{name}")
        check_choice(self.decoding, "sampling.decoding", DECODINGS)
        check_choice(self.guesses, "sampling.guesses", GUESSES)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def draw_settings(self) -> dict[str, Any]:
        """What decides which codes a seed gives: temperature, top-k, top-p and the draw rule."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "rule": DRAW_RULE}

    def replace(self, **changes: Any) -> "SamplingConfig":
        """A copy with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, options: Any) -> "SamplingConfig":
        """The ``sampling`` settings (the fields above) as a config; unknown names fail with one line."""
        names = {field.name for field in dataclasses.fields(cls)}
        if not isinstance(options, Mapping) or not set(options) <= names:
            unknown = sorted(set(options) - names) if isinstance(options, Mapping) else options
            raise TerraInputError(f"sampling must be an object with some of {', '.join(sorted(names))} "
                                  f"(got {unknown!r:.80})")
        return cls(**options)
