"""The Transformers backend: a KV cache per rollout, and continuous batching of the frames in flight."""

from __future__ import annotations

import secrets
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from terra.config.sampling import SamplingConfig
from terra.contract.layout import TokenLayout
from terra.generation.decoding import backend_guesses
from terra.generation.speculative import SpeculativeRows
from terra.generation.kv import KV, kv_cache, kv_tensors
from terra.generation.rollout import FrameDone, RolloutRequest, RolloutState, WorldModelBackend
from terra.generation.sampling import gumbel_noise, sample_image_tokens
from terra.models import LlamaActionConfig, LlamaActionForCausalLM


@dataclass
class _Slot:
    """What a rollout keeps between frames: its KV cache (batch of one)."""

    kv: KV | None
    # the frame they are for, its first guesses and the noise of its first positions, drawn by the previous frame's
    # passes; None: start from the previous codes
    ahead: tuple[int, torch.Tensor, torch.Tensor] | None = None
    # the speculative path's window cache and the ``kv`` it holds: its next frame writes on into it while ``kv`` is
    # still that one; never a fork's (its twin would write there too)
    window: tuple[DynamicCache, KV] | None = None


@dataclass
class _Row:
    """A frame in flight: its rollout, sampling, tokens so far and what :class:`FrameDone` reports."""

    state: RolloutState
    sampling: SamplingConfig
    prompt_tokens: int
    window_start: bool
    tokens: list[torch.Tensor] = field(default_factory=list)


class HFBackend(WorldModelBackend):
    """Generate with a :class:`LlamaActionForCausalLM` in PyTorch (reference semantics, any device)."""

    name = "transformers"

    def __init__(
        self,
        model: LlamaActionForCausalLM | str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        max_batch_size: int = 16,
        config: LlamaActionConfig | None = None,
        *,
        layout: TokenLayout,
        decoding: str,
        draft_tokens: int,
    ) -> None:
        if not isinstance(model, torch.nn.Module):  # a folder; ``config``, when given, spares re-reading it
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype, config=config)
        self.model = model.to(device=device, dtype=dtype).eval()
        self.device = torch.device(device)
        self.layout = layout
        self.max_batch_size = max_batch_size
        self._queue: list[tuple[RolloutState, SamplingConfig]] = []
        self._rows: list[_Row] = []  # frames in flight, in the order of the batch
        self._cache = DynamicCache()  # their batched cache
        self._pads: list[int] = []  # left padding of each row in it
        self._logits: torch.Tensor | None = None  # [rows, vocab] of each row's next token
        self._speculative = SpeculativeRows(self.model, self.device)  # frames of sampling.decoding=speculative
        self.decoding = decoding
        self.draft_tokens = draft_tokens

    def as_run(self, sampling: SamplingConfig) -> SamplingConfig:
        """``sampling`` with ``auto`` ``decoding``, ``draft_tokens`` and ``guesses`` made the run's choices."""
        sampling = super().as_run(sampling)
        if sampling.draft_tokens == "auto" or sampling.guesses == "auto":
            block = self.draft_tokens if sampling.draft_tokens == "auto" else sampling.draft_tokens
            sampling = sampling.replace(draft_tokens=block,
                                        guesses=backend_guesses("hf", sampling.decoding, sampling.guesses))
        return sampling

    def default_seed(self, request: RolloutRequest, index: int) -> int:
        return request.seed if request.seed is not None else secrets.randbits(63)

    def _request(self, state: RolloutState, sampling: SamplingConfig, frames: int) -> int:
        sampling = self.as_run(sampling)
        if state.cache is None:
            state.cache = _Slot(None)
        if sampling.decoding == "speculative":
            self._speculative.add(state, sampling)
        else:
            self._queue.append((state, sampling))
        return 1

    @property
    def num_queued(self) -> int:
        return len(self._queue) + len(self._rows) + len(self._speculative)

    def _cancel(self, states: Sequence[RolloutState]) -> None:
        self._speculative.cancel(states)
        drop = {id(s) for s in states}
        self._queue = [(s, c) for s, c in self._queue if id(s) not in drop]
        self._keep([i for i, row in enumerate(self._rows) if id(row.state) not in drop])

    def fork(self, state: RolloutState) -> RolloutState:
        twin = state.copy()
        if state.cache is not None:
            twin.cache = _Slot(state.cache.kv, state.cache.ahead)
        return twin

    @torch.inference_mode()
    def _poll(self) -> list[FrameDone]:
        """One pass for every speculative frame; admit queued frames, then one decode step for every sequential one."""
        done = self._speculative.step()
        self._admit()
        if not self._rows:
            return done
        layout = self.layout
        tokens = torch.empty(len(self._rows), dtype=torch.long, device=self.device)
        by_config: dict[SamplingConfig, list[int]] = defaultdict(list)
        for i, row in enumerate(self._rows):
            by_config[row.sampling].append(i)
        for config, rows in by_config.items():
            noise = None if config.greedy else self._noise([self._rows[i] for i in rows])
            tokens[rows] = sample_image_tokens(self._logits[rows], layout.codebook_size, config, noise)
        for row, token in zip(self._rows, tokens):
            row.tokens.append(token)
        done += [self._finish(i) for i, row in enumerate(self._rows) if len(row.tokens) == layout.image_tokens]
        going = [i for i, row in enumerate(self._rows) if len(row.tokens) < layout.image_tokens]
        self._keep(going)
        if self._rows:  # feed the sampled token; a finished frame's last token waits for its action slots
            self._logits = self._decode_step(tokens[going][:, None])
        return done

    def _noise(self, rows: list[_Row]) -> torch.Tensor:
        """The Gumbel noise ``[len(rows), codebook_size]`` of the tokens ``rows`` sample now."""
        keys = torch.tensor([(row.state.seed, row.state.next_frame, len(row.tokens)) for row in rows],
                            device=self.device).T
        return gumbel_noise(keys[0], keys[1], keys[2], self.layout.codebook_size, self.device)

    def _finish(self, index: int) -> FrameDone:
        """Hand a complete frame to its state, with the state's own cache cut out of the batch."""
        row, pad = self._rows[index], self._pads[index]
        state = row.state
        codes = torch.stack(row.tokens).cpu().numpy()
        state.add_frame(codes)
        kv = [(k[index : index + 1, :, pad:].clone(), v[index : index + 1, :, pad:].clone())
              for k, v in kv_tensors(self._cache)]
        state.cache.kv = None if state.window_starts else kv  # a new window starts from a fresh prompt
        computed = row.prompt_tokens if row.window_start else self.layout.slot_tokens + 1
        return FrameDone(state, codes, row.prompt_tokens, row.prompt_tokens - computed, row.window_start)

    def _admit(self) -> None:
        """First passes of queued frames (equal lengths together); they join the batch with their logits."""
        room = self.max_batch_size - len(self._rows)
        admitted, self._queue = self._queue[:room], self._queue[room:]
        if not admitted:
            return
        groups: dict[tuple, list[tuple[RolloutState, SamplingConfig]]] = defaultdict(list)
        for state, sampling in admitted:
            groups[(state.window_starts, len(state.prompt()[0]))].append((state, sampling))
        parts = [(kv_tensors(self._cache), self._pads)] if self._rows else []
        logits = [self._logits] if self._rows else []
        for (window_start, prompt_tokens), members in groups.items():
            group_logits, kv = self._first_pass([s for s, _ in members])
            parts.append((kv, [0] * len(members)))
            logits.append(group_logits)
            self._rows += [_Row(s, c, prompt_tokens, window_start) for s, c in members]
        kv, self._pads = self._join(parts)
        self._cache = kv_cache(kv)
        self._logits = torch.cat(logits)

    def _first_pass(self, states: list[RolloutState]) -> tuple[torch.Tensor, KV]:
        """Logits of the first token of each state's next frame, and the group's cache after the pass."""
        layout = self.layout
        if states[0].window_starts:
            prompts = [s.prompt() for s in states]
            ids = torch.tensor([p[0] for p in prompts], device=self.device)
            conditions = torch.from_numpy(np.stack([p[1] for p in prompts])).to(self.device).flatten(1, 2)
            return self._forward_new(ids, conditions, torch.from_numpy(prompts[0][2]).to(self.device), [])
        kv, _ = self._join([(s.cache.kv, [0]) for s in states])
        last = torch.tensor([[int(s.frames[-1][-1])] for s in states], device=self.device)
        ids = torch.cat([last, last.new_full((len(states), layout.slot_tokens), layout.slot_token_id)], dim=1)
        conditions = torch.from_numpy(np.stack([s.conditions[s.next_frame - 1] for s in states])).to(self.device)
        start = kv[0][0].shape[2]
        return self._forward_new(ids, conditions, torch.arange(start, start + ids.shape[1], device=self.device), kv)

    def _forward_new(self, ids: torch.Tensor, conditions: torch.Tensor, positions: torch.Tensor,
                     kv: KV) -> tuple[torch.Tensor, KV]:
        cache = kv_cache(kv)
        logits = self._model(ids, conditions, positions.expand(len(ids), -1), cache, None)
        return logits, kv_tensors(cache)

    def _decode_step(self, ids: torch.Tensor) -> torch.Tensor:
        """One token per row on the batched cache (left padding masked); the next logits."""
        length = self._cache.get_seq_length()
        pad = torch.tensor(self._pads, device=self.device)
        positions = (length - pad)[:, None]  # each row's own position: its unpadded cache length
        mask = (torch.arange(length + 1, device=self.device)[None] >= pad[:, None]).long() if any(self._pads) else None
        return self._model(ids, None, positions, self._cache, mask)

    def _keep(self, rows: list[int]) -> None:
        """Keep only these rows of the batch (and drop left padding that every remaining row has)."""
        if len(rows) == len(self._rows):
            return
        self._rows = [self._rows[i] for i in rows]
        if not rows:
            self._cache, self._pads, self._logits = DynamicCache(), [], None
            return
        index = torch.tensor(rows, device=self.device)
        trim = min(self._pads[i] for i in rows)
        self._cache = kv_cache([(k[index, :, trim:], v[index, :, trim:]) for k, v in kv_tensors(self._cache)])
        self._pads = [self._pads[i] - trim for i in rows]
        if self._logits is not None:
            self._logits = self._logits[index]

    @staticmethod
    def _join(parts: list[tuple[KV, list[int]]]) -> tuple[KV, list[int]]:
        """One batched cache from several (each with its rows' left padding), shorter ones padded on the left."""
        longest = max(kv[0][0].shape[2] for kv, _ in parts)
        pads = [p + longest - kv[0][0].shape[2] for kv, part_pads in parts for p in part_pads]
        padded = [[[torch.nn.functional.pad(tensor, (0, 0, longest - kv[0][0].shape[2], 0)) for tensor in pair]
                   for pair in kv] for kv, _ in parts]
        return [tuple(torch.cat(tensors) for tensors in zip(*layer)) for layer in zip(*padded)], pads

    def _model(self, ids: torch.Tensor, conditions: torch.Tensor | None, positions: torch.Tensor,
               cache: DynamicCache, mask: torch.Tensor | None) -> torch.Tensor:
        """Run new tokens (``conditions``: their slots' values) through the model; the last logits ``[B, vocab]``."""
        out = self.model(
            input_ids=ids,
            conditions=None if conditions is None else conditions.to(self.model.dtype),
            position_ids=positions,
            attention_mask=mask,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1]

