"""The training objective: next-token cross-entropy on image tokens, computed without the window's whole logits.

A window of ``W`` frames is ``W * (P + 6)`` positions (docs/ARCHITECTURE.md, "Token layout"); the logit at
position ``i`` predicts token ``i + 1``, which counts only when it is an image token of a frame after the first
(the first frame is context, unless ``loss_on_first_frame``). With Terra's 262,145-entry vocabulary one window's
logits would be 15 GB in float32, so :class:`WindowLoss` runs the backbone once and then the output layer and
the loss over ``chunk`` positions at a time, each chunk recomputed in the backward pass instead of kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from terra.generation.actions import NUM_ACTION_TOKENS
from terra.models import LlamaActionForCausalLM


def target_positions(patches: int, frames: int, loss_on_first_frame: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions whose logits are trained, and where their targets sit in the flat image tokens ``[W*P]``."""
    span = patches + NUM_ACTION_TOKENS
    nxt = torch.arange(1, frames * span)
    frame, slot = nxt // span, nxt % span
    keep = (slot < patches) & ((frame > 0) | loss_on_first_frame)
    return nxt[keep] - 1, (frame * patches + slot)[keep]


class WindowLoss(nn.Module):
    """The model's training forward over whole windows: loss and image-token accuracy of a batch.

    It is the module that data parallelism wraps (terra/training/distributed.py), so the model's own weights
    (embeddings, position tables, action projection, output layer) belong to the outermost shard unit.
    """

    def __init__(self, model: LlamaActionForCausalLM, frames: int, loss_on_first_frame: bool, chunk: int,
                 autocast_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.lm = model
        cfg = model.config
        keep, target_idx = target_positions(cfg.num_image_patches, frames, loss_on_first_frame)
        self.register_buffer("keep", keep, persistent=False)
        self.register_buffer("target_idx", target_idx, persistent=False)
        self.register_buffer("positions", torch.arange(frames * cfg.num_spatio_embeddings), persistent=False)
        self.chunk, self.codebook_size, self.autocast_dtype = chunk, cfg.codebook_size, autocast_dtype

    @property
    def targets_per_window(self) -> int:
        return len(self.keep)

    def forward(self, image_ids: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean loss and accuracy (greedy over the codebook) of windows ``[B, W*P]`` under actions ``[B, W*6, 3]``."""
        enabled = self.autocast_dtype is not None
        with torch.autocast(image_ids.device.type, dtype=self.autocast_dtype, enabled=enabled):
            ids, actions = self.lm.interleave(image_ids, actions)
            positions = self.positions.unsqueeze(0).expand(ids.shape[0], -1)
            embeds = self.lm.embed(ids, actions, positions)
            hidden = self.lm.model(inputs_embeds=embeds, position_ids=positions).last_hidden_state[:, self.keep]
            targets = image_ids[:, self.target_idx]
            loss = hidden.new_zeros((), dtype=torch.float32)
            correct = torch.zeros((), dtype=torch.int64, device=hidden.device)
            for lo in range(0, hidden.shape[1], self.chunk):
                part, hit = checkpoint(self._chunk, hidden[:, lo:lo + self.chunk], targets[:, lo:lo + self.chunk],
                                       use_reentrant=False)
                loss, correct = loss + part, correct + hit
        return loss / targets.numel(), correct.float() / targets.numel()

    def _chunk(self, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed cross-entropy and the count of correct greedy codes over a chunk of positions."""
        logits = self.lm.lm_head(hidden).float()
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
        with torch.no_grad():
            correct = (logits[..., : self.codebook_size].argmax(-1) == targets).sum()
        return loss, correct
