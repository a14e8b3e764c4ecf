"""Speculative decoding's ``transitions`` guesses: a refilled guess becomes the draw an earlier pass made at that
position after the same token.
"""

from __future__ import annotations

import torch

MEMORY_SLOTS = 4  # per position: the most recent distinct tokens before it whose draws Transitions keeps


class Transitions:
    """Per position of a frame, the tokens passes drew there after given tokens (the last :data:`MEMORY_SLOTS`)."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.before = torch.full((size, MEMORY_SLOTS), -1, dtype=torch.long, device=device)
        self.drawn = torch.full((size, MEMORY_SLOTS), -1, dtype=torch.long, device=device)
        self.next_slot = torch.zeros(size, dtype=torch.long, device=device)

    def record(self, positions: torch.Tensor, before: torch.Tensor, drawn: torch.Tensor) -> None:
        """A pass drew ``drawn [n]`` at ``positions [n]`` after ``before [n]`` (distinct positions)."""
        same = self.before[positions] == before[:, None]
        known = same.any(dim=1)
        slot = torch.where(known, same.to(torch.int8).argmax(dim=1), self.next_slot[positions])
        self.before[positions, slot] = before
        self.drawn[positions, slot] = drawn
        self.next_slot[positions] = torch.where(known, self.next_slot[positions],
                                                (self.next_slot[positions] + 1) % MEMORY_SLOTS)

    def recall(self, positions: torch.Tensor, before: torch.Tensor, guesses: torch.Tensor) -> torch.Tensor:
        """``guesses [n]`` at ``positions [n]``, each replaced by the draw made there after ``before [n]``, if any."""
        same = self.before[positions] == before[:, None]
        drawn = self.drawn[positions].gather(1, same.to(torch.int8).argmax(dim=1, keepdim=True))[:, 0]
        return torch.where(same.any(dim=1), drawn, guesses)
