"""The training objective: next-token cross-entropy on image tokens, computed without the window's whole logits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from terra.models import LlamaActionForCausalLM

ALIGNED_ROWS = 64  # the output layer's rows are padded to a multiple of this (16-byte alignment needs 8)


def target_positions(patches: int, frames: int, loss_on_first_frame: bool,
                     span: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions whose logits are trained, and where their targets sit in the flat image tokens ``[W*P]``."""
    nxt = torch.arange(1, frames * span)
    frame, slot = nxt // span, nxt % span
    keep = (slot < patches) & ((frame > 0) | loss_on_first_frame)
    return nxt[keep] - 1, (frame * patches + slot)[keep]


class WindowLoss(nn.Module):
    """The model's training forward over whole windows: loss and image-token accuracy of a batch."""

    def __init__(self, model: LlamaActionForCausalLM, frames: int, loss_on_first_frame: bool, chunk: int,
                 autocast_dtype: torch.dtype | None, compile_softmax: bool = False, input_noise: float = 0.0) -> None:
        super().__init__()
        self.lm = model
        self.input_noise = input_noise
        cfg = model.config
        keep, target_idx = target_positions(cfg.num_image_patches, frames, loss_on_first_frame,
                                            cfg.num_spatio_embeddings)
        self.register_buffer("keep", keep, persistent=False)
        self.register_buffer("target_idx", target_idx, persistent=False)
        self.register_buffer("target_frame", target_idx // cfg.num_image_patches, persistent=False)
        self.register_buffer("positions", torch.arange(frames * cfg.num_spatio_embeddings), persistent=False)
        self.chunk, self.codebook_size, self.autocast_dtype = chunk, cfg.codebook_size, autocast_dtype
        self.softmax_step = torch.compile(softmax_step, dynamic=False) if compile_softmax else softmax_step

    @property
    def targets_per_window(self) -> int:
        return len(self.keep)

    def forward(self, image_ids: torch.Tensor, actions: torch.Tensor, routes: torch.Tensor | None = None,
                first_target_frame: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean loss and accuracy of windows ``[B, W*P]``, actions ``[B, W*6, 3]``, routes ``[B, W*K, 3]`` or None."""
        enabled = self.autocast_dtype is not None
        inputs = noisy_inputs(image_ids, self.input_noise, self.codebook_size) if self.training else image_ids
        with torch.autocast(image_ids.device.type, dtype=self.autocast_dtype, enabled=enabled):
            ids, conditions = self.lm.interleave(inputs, actions, routes)
            positions = self.positions.unsqueeze(0).expand(ids.shape[0], -1)
            embeds = self.lm.embed(ids, conditions, positions)
            hidden = self.lm.model(inputs_embeds=embeds, position_ids=positions).last_hidden_state[:, self.keep]
        targets = image_ids[:, self.target_idx]
        if first_target_frame is not None:  # held-back targets are -1: no loss, no gradient (softmax_step)
            targets = targets.masked_fill(self.target_frame < first_target_frame[:, None], -1)
        counted = (targets >= 0).sum().clamp(min=1)
        head = HeadLoss(self.autocast_dtype or self.lm.lm_head.weight.dtype, self.chunk, self.codebook_size,
                        torch.is_grad_enabled(), self.softmax_step)
        loss, correct = FusedHeadLoss.apply(hidden.flatten(0, 1), self.lm.lm_head.weight, targets.flatten(), head)
        return loss / counted, correct.float() / counted


def noisy_inputs(image_ids: torch.Tensor, most: float, codebook: int) -> torch.Tensor:
    """``image_ids [B, N]`` with a share of each window's codes, uniform in ``[0, most]``, replaced by random codes."""
    if most <= 0.0:
        return image_ids
    share = torch.rand(image_ids.shape[0], 1, device=image_ids.device) * most
    hit = torch.rand(image_ids.shape, device=image_ids.device) < share
    return torch.where(hit, torch.randint_like(image_ids, codebook), image_ids)


def softmax_step(logits: torch.Tensor, targets: torch.Tensor, vocab: int, codebook: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed cross-entropy, correct count and logits gradient of ``[N, V']`` logits; a -1 target counts nowhere."""
    columns = torch.arange(logits.shape[1], device=logits.device)
    z = logits.to(torch.promote_types(torch.float32, logits.dtype)).masked_fill(columns >= vocab, float("-inf"))
    lse = torch.logsumexp(z, -1)
    counted = targets >= 0
    loss = torch.where(counted, lse - z.gather(1, targets.clamp(min=0)[:, None]).squeeze(1), 0.0).sum()
    correct = ((z[:, :codebook].argmax(-1) == targets) & counted).sum()
    probs = torch.exp(z - lse[:, None])
    grad = torch.where(counted[:, None], torch.where(columns == targets[:, None], probs - 1.0, probs), 0.0)
    return loss, correct, grad.to(logits.dtype)


@dataclass(frozen=True)
class HeadLoss:
    """How :class:`FusedHeadLoss` runs: matmuls in ``dtype``, ``chunk`` positions at a time, gradients if ``grads``."""

    dtype: torch.dtype
    chunk: int
    codebook: int
    grads: bool
    step: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class FusedHeadLoss(torch.autograd.Function):
    """Summed cross-entropy of ``hidden [N, D] @ weight[V, D].T`` against ``targets [N]``, gradients in the forward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, head: HeadLoss
                ) -> tuple[torch.Tensor, torch.Tensor]:
        want_hidden, want_weight = (head.grads and ctx.needs_input_grad[i] for i in (0, 1))
        vocab = weight.shape[0]
        w = weight.new_zeros((-(-vocab // ALIGNED_ROWS) * ALIGNED_ROWS, weight.shape[1]), dtype=head.dtype)
        w[:vocab] = weight
        acc = torch.promote_types(torch.float32, head.dtype)  # loss and weight gradient: float32 or wider
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(w, dtype=acc) if want_weight else None
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        correct = torch.zeros((), dtype=torch.int64, device=hidden.device)
        for lo in range(0, hidden.shape[0], head.chunk):
            h = hidden[lo:lo + head.chunk].to(head.dtype)
            part, hits, grad = head.step(h @ w.T, targets[lo:lo + head.chunk], vocab, head.codebook)
            loss += part
            correct += hits
            if want_hidden:
                grad_hidden[lo:lo + head.chunk] = grad @ w
            if want_weight:
                grad_weight += grad.T @ h
        ctx.save_for_backward(grad_hidden, None if grad_weight is None else grad_weight[:vocab])
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_correct: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = lambda g: None if g is None else g * grad_loss.to(g.dtype)  # noqa: E731
        return scale(grad_hidden), scale(grad_weight), None, None
