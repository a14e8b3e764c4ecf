"""How image tokens are drawn: :class:`SamplingConfig` (temperature, top-k, top-p, and how the decoder walks a
frame) and its documented ranges.

Light (no torch): apps check ``sampling`` before any model loads; the backends' samplers take the config as
it is (terra/generation/sampling.py for Transformers, vLLM's own for vLLM).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import InitVar, dataclass
from typing import Any, Mapping

from terra.config.checks import Range, check_choice
from terra.config.moved import DRAFT_TOKENS, moved_value
from terra.core.errors import TerraInputError

DRAW_RULE = "gumbel-max, noise hashed from (seed, frame, position, code)"  # terra/generation/sampling.py
DECODINGS = ("auto", "sequential", "speculative")
# a frame's speculative guesses (terra/generation/speculative.py); auto: what the backend runs (Transformers:
# lookahead; vLLM: previous, all its engine guesses)
GUESSES = ("auto", "previous", "transitions", "lookahead")
SAMPLING = {  # SamplingConfig checks these
    "temperature": Range(0, 10, 1.0),
    "top_k": Range(0, 1 << 20, 0, whole=True),
    "top_p": Range(0, 1, 1.0, low_open=True),
    "draft_tokens": DRAFT_TOKENS.check,  # or auto; its old name, block_size, is checked against the same range
}


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature (0 = greedy), top-k (0 = off) and top-p (1.0 = off); Terra's authors used 0.9 / 0 / 1.0.

    ``decoding`` is how image tokens are decoded: ``sequential`` samples one per forward pass; ``speculative`` has
    a pass score ``draft_tokens`` guessed tokens past the committed ones (terra/generation/speculative.py);
    ``auto`` is speculative where that is faster, decided once per run (terra/generation/decoding.py,
    ``auto_decoding``; its numbers: benchmarks/decoding.md, "When decoding=auto is speculative"); ``draft_tokens=auto``
    is the block a pass-cost rule finds fastest for the model, the backend and the rollouts in flight, decided with
    it (``auto_draft_tokens``). They decide how fast the tokens come, not which: for the same seed a backend gives
    the same codes whatever ``decoding`` and ``draft_tokens`` are (:meth:`draw_settings` are the ones that shape the
    codes). ``guesses`` names where a speculative pass's guesses past the pass come from
    (terra/generation/guesses.py), again speed only; ``auto`` is what the backend runs (vLLM's engine runs
    ``previous`` only, and refuses the others: terra/generation/decoding.py, ``resolve_decoding``).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    decoding: str = "auto"
    draft_tokens: int | str = "auto"
    guesses: str = "auto"
    block_size: InitVar[int | None] = None  # draft_tokens' old name, taken until 0.2.0

    def __post_init__(self, block_size: int | None) -> None:
        if block_size is not None:
            object.__setattr__(self, "draft_tokens", moved_value(DRAFT_TOKENS, block_size))
        for name, limits in SAMPLING.items():
            value = getattr(self, name)
            if name == "draft_tokens" and isinstance(value, str):
                if value != "auto":
                    raise TerraInputError(f"sampling.draft_tokens must be auto or a whole number from 1 to 4096 "
                                          f"(got {value!r}); e.g. sampling.draft_tokens=auto")
                continue
            limits.check(value, f"sampling.{name}")
        check_choice(self.decoding, "sampling.decoding", DECODINGS)
        check_choice(self.guesses, "sampling.guesses", GUESSES)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def draw_settings(self) -> dict[str, Any]:
        """What decides which codes a seed gives (temperature, top-k, top-p and the draw rule): ``decoding``,
        ``draft_tokens`` and ``guesses`` only change the speed (a batch run's fingerprint leaves them out). ``rule``
        names the noise of terra/generation/sampling.py, so files drawn by an earlier rule are made again, not kept
        on resume."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "rule": DRAW_RULE}

    def replace(self, **changes: Any) -> "SamplingConfig":
        """A copy with ``changes`` (checked again: a config is never out of range)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, options: Any) -> "SamplingConfig":
        """The ``sampling`` settings (the fields above) as a config; unknown names fail with one line."""
        names = {field.name for field in dataclasses.fields(cls)}
        taken = set(inspect.signature(cls).parameters)  # the fields and old names still taken (block_size)
        if not isinstance(options, Mapping) or not set(options) <= taken:
            unknown = sorted(set(options) - taken) if isinstance(options, Mapping) else options
            raise TerraInputError(f"sampling must be an object with some of {', '.join(sorted(names))} "
                                  f"(got {unknown!r:.80})")
        return cls(**options)
