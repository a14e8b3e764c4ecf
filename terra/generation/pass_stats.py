"""The forward passes that drew a rollout's image tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from terra.config.sampling import SamplingConfig


@dataclass(frozen=True)
class PassStats:
    """How many forward passes generated how many frames (sequential decoding: one pass per image token)."""

    frames: int = 0
    passes: int = 0
    image_tokens: int = 0  # per frame

    def __add__(self, other: "PassStats") -> "PassStats":
        return PassStats(self.frames + other.frames, self.passes + other.passes,
                           max(self.image_tokens, other.image_tokens))

    @property
    def passes_per_frame(self) -> float | None:
        return self.passes / self.frames if self.frames else None

    @property
    def tokens_per_pass(self) -> float | None:
        """Image tokens committed per forward pass (1 for sequential decoding)."""
        return self.frames * self.image_tokens / self.passes if self.passes else None

    def as_dict(self, sampling: SamplingConfig | None = None) -> dict[str, Any]:
        """The figures for a sidecar, a manifest or a benchmark's JSON; with ``sampling``, the decoding that ran."""
        record: dict[str, Any] = {"frames": self.frames, "image_tokens": self.image_tokens,
                                  "forward_passes": self.passes, "passes_per_frame": _rounded(self.passes_per_frame),
                                  "tokens_per_pass": _rounded(self.tokens_per_pass)}
        if sampling is not None:
            record = {"decoding": sampling.decoding,
                      "draft_tokens": sampling.draft_tokens if sampling.decoding == "speculative" else None, **record}
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "PassStats":
        """The stats of an :meth:`as_dict` record (a manifest's, to sum a run)."""
        return cls(record["frames"], record["forward_passes"], record["image_tokens"])

    def line(self) -> str:
        if not self.passes:
            return "no frames generated"
        return (f"{self.passes_per_frame:.1f} forward passes per frame of {self.image_tokens} image tokens "
                f"({self.tokens_per_pass:.2f} tokens per pass)")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
