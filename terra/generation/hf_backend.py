"""The Transformers backend: frame-by-frame generation with a KV cache per rollout, queued frames batched.

Each rollout keeps its own KV cache between frames (in :attr:`RolloutState.cache`). :meth:`HFBackend.poll`
generates one frame for up to ``max_batch_size`` queued rollouts at once. A frame starts with one forward pass:
the window's whole prompt at a window start, else the previous frame's last token together with its action
slots; rollouts whose caches are equally long share that pass. Then ``P`` single-token decode steps run for
all of them together, caches of unequal length left-padded and masked. Rollouts that advance in lock step (a
batch of equal window plans) never need padding, so their numbers are those of one batched rollout.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from terra.generation.layout import TokenLayout
from terra.generation.rollout import FrameDone, RolloutRequest, RolloutState, WorldModelBackend
from terra.generation.sampling import SamplingConfig, sample_image_tokens
from terra.models import LlamaActionConfig, LlamaActionForCausalLM

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, heads, length, head_dim]


@dataclass
class _Slot:
    """What a rollout keeps between frames: its KV cache (batch of one) and its random generator.

    The cache tensors are never written in place (a :class:`DynamicCache` grows by concatenation and merging
    copies), so a forked rollout may share them with its parent.
    """

    kv: KV | None
    generator: torch.Generator


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
        self._queue: list[tuple[RolloutState, SamplingConfig]] = []

    @property
    def name(self) -> str:
        return "transformers"

    def default_seed(self, request: RolloutRequest, index: int) -> int:
        return request.seed if request.seed is not None else secrets.randbits(63)

    def submit(self, state: RolloutState, sampling: SamplingConfig) -> None:
        if state.cache is None:
            state.cache = _Slot(None, torch.Generator(self.device).manual_seed(state.seed))
        self._queue.append((state, sampling))

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    def cancel(self, states: Sequence[RolloutState]) -> None:
        drop = {id(s) for s in states}
        self._queue = [(s, c) for s, c in self._queue if id(s) not in drop]

    def fork(self, state: RolloutState) -> RolloutState:
        twin = state.copy()
        if state.cache is not None:
            generator = torch.Generator(self.device)
            generator.set_state(state.cache.generator.get_state())
            twin.cache = _Slot(state.cache.kv, generator)
        return twin

    @torch.inference_mode()
    def poll(self) -> list[FrameDone]:
        """Generate one frame for each of the first ``max_batch_size`` queued rollouts."""
        batch, self._queue = self._queue[: self.max_batch_size], self._queue[self.max_batch_size :]
        if not batch:
            return []
        states = [s for s, _ in batch]
        logits, kv, prompt_tokens = [None] * len(states), [None] * len(states), [0] * len(states)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, s in enumerate(states):  # equal cache and input lengths share the first pass
            groups[(s.window_starts, len(s.prompt()[0]))].append(i)
        for members in groups.values():
            first, group_kv, tokens = self._first_pass([states[i] for i in members])
            for row, i in enumerate(members):
                logits[i], kv[i], prompt_tokens[i] = first[row], group_kv[row], tokens
        codes, kv = self._decode_frame(states, [c for _, c in batch], torch.stack(logits), kv)
        done = []
        for i, (state, frame) in enumerate(zip(states, codes)):
            window_start = state.window_starts
            computed = len(state.prompt()[0]) if window_start else self.layout.action_tokens + 1
            state.add_frame(frame)
            state.cache.kv = None if state.window_starts else kv[i]  # a new window starts from a fresh prompt
            done.append(FrameDone(state, frame, prompt_tokens[i], prompt_tokens[i] - computed, window_start))
        return done

    def _first_pass(self, states: list[RolloutState]) -> tuple[torch.Tensor, list[KV], int]:
        """The logits of the first token of each state's next frame and their caches after the pass.

        At a window start the pass is the window's prompt on an empty cache; otherwise it is the previous
        frame's last token and action slots (every state here has a cache of the same length).
        """
        layout = self.layout
        if states[0].window_starts:
            prompts = [s.prompt() for s in states]
            ids = torch.tensor([p[0] for p in prompts], device=self.device)
            actions = torch.from_numpy(np.stack([p[1] for p in prompts])).to(self.device).flatten(1, 2)
            positions = torch.from_numpy(prompts[0][2]).to(self.device).expand(len(states), -1)
            cache = DynamicCache()
        else:
            cache, _ = self._merge([s.cache.kv for s in states])
            last = torch.tensor([[int(s.frames[-1][-1])] for s in states], device=self.device)
            ids = torch.cat([last, torch.full((len(states), layout.action_tokens), layout.action_token_id,
                                              device=self.device)], dim=1)
            actions = torch.from_numpy(np.stack([s.actions[s.next_frame - 1] for s in states])).to(self.device)
            start = cache.get_seq_length()
            positions = torch.arange(start, start + ids.shape[1], device=self.device).expand(len(states), -1)
        logits = self._step(ids, actions, positions, cache, None)
        tokens = int(positions[0, -1]) + 1
        return logits, self._split(cache, [0] * len(states)), tokens

    def _decode_frame(
        self, states: list[RolloutState], samplings: list[SamplingConfig], logits: torch.Tensor, kv: list[KV]
    ) -> tuple[np.ndarray, list[KV]]:
        """Sample the ``P`` image tokens of every state's next frame; return them and the grown caches."""
        layout, n = self.layout, len(states)
        cache, pads = self._merge(kv)
        lengths = torch.tensor([k[0][0].shape[2] for k in kv], device=self.device)
        mask = None
        if any(pads):  # left padding: pad positions masked out of attention
            width = cache.get_seq_length()
            mask = (torch.arange(width, device=self.device)[None] >= torch.tensor(pads, device=self.device)[:, None])
            mask = mask.long()
        by_config: dict[SamplingConfig, list[int]] = defaultdict(list)
        for i, config in enumerate(samplings):
            by_config[config].append(i)
        generators = [s.cache.generator for s in states]
        frame = torch.empty(n, layout.image_tokens, dtype=torch.long, device=self.device)
        for i in range(layout.image_tokens):
            for config, rows in by_config.items():
                frame[rows, i] = sample_image_tokens(logits[rows], layout.codebook_size, config,
                                                     [generators[r] for r in rows])
            if i < layout.image_tokens - 1:
                if mask is not None:
                    mask = torch.cat([mask, mask.new_ones(n, 1)], dim=1)
                logits = self._step(frame[:, i : i + 1], None, (lengths + i)[:, None], cache, mask)
        return frame.cpu().numpy(), self._split(cache, pads)

    def _merge(self, kv: list[KV]) -> tuple[DynamicCache, list[int]]:
        """One batched cache from per-rollout caches, shorter ones left-padded; the padding of each."""
        longest = max(k[0][0].shape[2] for k in kv)
        pads = [longest - k[0][0].shape[2] for k in kv]
        cache = DynamicCache()
        for layer in range(len(kv[0])):
            keys = [torch.nn.functional.pad(k[layer][0], (0, 0, p, 0)) for k, p in zip(kv, pads)]
            values = [torch.nn.functional.pad(k[layer][1], (0, 0, p, 0)) for k, p in zip(kv, pads)]
            cache.update(torch.cat(keys), torch.cat(values), layer)
        return cache, pads

    @staticmethod
    def _split(cache: DynamicCache, pads: list[int]) -> list[KV]:
        """Per-rollout caches (batch of one, padding dropped) from a batched cache."""
        return [[(layer.keys[b : b + 1, :, pad:], layer.values[b : b + 1, :, pad:]) for layer in cache.layers]
                for b, pad in enumerate(pads)]

    def _step(self, ids: torch.Tensor, actions: torch.Tensor | None, positions: torch.Tensor, cache: DynamicCache,
              mask: torch.Tensor | None) -> torch.Tensor:
        """Run new tokens through the model with the cache; return the last position's logits ``[B, vocab]``."""
        out = self.model(
            input_ids=ids,
            actions=None if actions is None else actions.to(self.model.dtype),
            position_ids=positions,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1]
