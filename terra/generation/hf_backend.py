"""The Transformers backend: frame-by-frame generation with a KV cache, several rollouts batched together.

Rollouts whose window plans are identical (same context length, frame count and overlap) run as one batch:
their sequences have the same layout, so no padding is needed. Per window: one prefill of the window's
frames, then for each new frame ``P`` single-token decode steps, then one step that feeds the frame's last
token together with its 6 action slots, whose last logits start the next frame.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, DynamicCache

from terra.generation.layout import TokenLayout
from terra.models import LlamaActionConfig, LlamaActionForCausalLM
from terra.generation.rollout import FrameCallback, RolloutRequest, RolloutState, WorldModelBackend
from terra.generation.sampling import SamplingConfig, sample_image_tokens


class HFBackend(WorldModelBackend):
    """Generate with a :class:`LlamaActionForCausalLM` in PyTorch (reference semantics, any device)."""

    def __init__(
        self,
        model: LlamaActionForCausalLM | str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        max_batch_size: int = 16,
        config: LlamaActionConfig | None = None,
    ) -> None:
        if not isinstance(model, torch.nn.Module):  # a folder; ``config``, when given, spares re-reading it
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype, config=config)
        self.model = model.to(device=device, dtype=dtype).eval()
        self.device = torch.device(device)
        self.layout = TokenLayout.from_config(self.model.config)
        self.max_batch_size = max_batch_size

    def generate(
        self,
        requests: Sequence[RolloutRequest],
        sampling: SamplingConfig,
        progress: bool = True,
        on_frame: FrameCallback | None = None,
    ) -> list[np.ndarray]:
        states = [RolloutState(r, self.layout) for r in requests]
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, s in enumerate(states):
            groups[tuple(s.windows)].append(i)
        total = sum(r.num_frames for r in requests)
        with tqdm(total=total, unit="frame", desc="generating (transformers)", disable=not progress) as bar:
            for members in groups.values():
                for b in range(0, len(members), self.max_batch_size):
                    batch = members[b : b + self.max_batch_size]
                    self._run_batch([states[i] for i in batch], batch, sampling, bar, on_frame)
        return [s.generated() for s in states]

    @torch.inference_mode()
    def _run_batch(
        self,
        states: list[RolloutState],
        indices: list[int],
        sampling: SamplingConfig,
        bar: tqdm,
        on_frame: FrameCallback | None,
    ) -> None:
        """Generate every frame of rollouts that share one window plan."""
        layout = self.layout
        generators = [
            torch.Generator(self.device).manual_seed(s.request.seed if s.request.seed is not None else secrets.randbits(63))
            for s in states
        ]
        while not states[0].finished:
            prompts = [s.prompt() for s in states]
            ids = torch.tensor([p[0] for p in prompts], device=self.device)
            actions = torch.from_numpy(np.stack([p[1] for p in prompts])).to(self.device).flatten(1, 2)
            positions = torch.from_numpy(prompts[0][2]).to(self.device).expand(len(states), -1)
            cache = DynamicCache()
            logits = self._step(ids, actions, positions, cache)
            window = states[0].window_index
            while not states[0].finished and states[0].window_index == window:
                frame = torch.empty(len(states), layout.image_tokens, dtype=torch.long, device=self.device)
                pos = positions[:, -1:] + 1
                for i in range(layout.image_tokens):
                    frame[:, i] = sample_image_tokens(logits, layout.codebook_size, sampling, generators)
                    if i < layout.image_tokens - 1:
                        logits = self._step(frame[:, i : i + 1], None, pos + i, cache)
                frame_index = states[0].next_frame
                codes = frame.cpu().numpy()
                for s, idx, c in zip(states, indices, codes):
                    s.add_frame(c)
                    if on_frame is not None:
                        on_frame(idx, frame_index - s.num_context, c)
                bar.update(len(states))
                if states[0].finished or states[0].window_index != window:
                    break
                # The frame's last token and its action slots in one step; the last logits start the next frame.
                tail = torch.cat(
                    [frame[:, -1:], torch.full((len(states), layout.action_tokens), layout.action_token_id, device=self.device)],
                    dim=1,
                )
                tail_actions = torch.from_numpy(np.stack([s.actions[frame_index] for s in states])).to(self.device)
                positions = pos + layout.image_tokens - 1 + torch.arange(layout.action_tokens + 1, device=self.device)
                logits = self._step(tail, tail_actions, positions, cache)

    def _step(
        self, ids: torch.Tensor, actions: torch.Tensor | None, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """Run new tokens through the model with the cache; return the last position's logits ``[B, vocab]``."""
        out = self.model(
            input_ids=ids,
            actions=None if actions is None else actions.to(self.model.dtype),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1]
