"""The Transformers backend's speculative path: a forward pass per rollout per poll, its draft tokens in each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from terra.config.sampling import SamplingConfig
from terra.generation.kv import crop, kv_tensors, window_cache
from terra.generation.rollout import FrameDone, RolloutState
from terra.generation import speculative  # advance_frames through its module: benchmark_speculative.py profiles it
from terra.generation.speculative import SpeculativeFrame


@dataclass
class _Frame:
    """A frame in flight: its rollout, the speculative state, the rollout's cache and the first pass's inputs."""

    state: RolloutState
    frame: SpeculativeFrame
    cache: DynamicCache
    prefix_ids: torch.Tensor | None  # [L] the frame's prompt before its drafts (None once the first pass ran)
    prefix_conditions: torch.Tensor  # [slots, 3] values of the prefix's slots
    next_conditions: torch.Tensor | None  # [A + K, 3] of the frame's own slots, where a pass may run past its end
    start: int  # window position of the frame's first image token
    prompt_tokens: int
    window_start: bool
    length: int  # positions in the cache (the next pass's first position)
    placeholders: torch.Tensor  # [slots] the action slots' ids, fed where a pass runs past the frame's end


class SpeculativeRows:
    """The speculative frames of one :class:`HFBackend`; a rollout's ``cache`` holds its KV between frames."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self._frames: list[_Frame] = []

    def __len__(self) -> int:
        return len(self._frames)

    def add(self, state: RolloutState, sampling: SamplingConfig) -> None:
        layout = state.layout
        handed = state.cache.ahead  # a lookahead's handover; a frame decoded another way since leaves it stale
        if handed is not None and handed[0] == state.next_frame:
            later, noise = handed[1:]
        else:
            later, noise = torch.as_tensor(state.frames[-1], device=self.device), None
        lookahead = sampling.guesses == "lookahead" and state.next_frame + 1 < state.window.end
        frame = SpeculativeFrame(later, sampling.draft_tokens, layout.codebook_size, sampling, state.seed,
                                 state.next_frame, transitions=sampling.guesses == "transitions",
                                 lookahead=lookahead, noise=noise)
        next_conditions = (torch.from_numpy(state.conditions[state.next_frame]).to(self.device, self.model.dtype)
                           if lookahead else None)
        if state.window_starts:
            ids, conditions, _ = state.prompt()
            cache, prompt = window_cache(None, layout.window_positions), len(ids)
            prefix_conditions = torch.from_numpy(conditions).reshape(-1, layout.action_dim)
        else:
            kept = state.cache.window  # the window's cache this rollout wrote last, unless it has moved on since
            if kept is not None and kept[1] is state.cache.kv:
                cache = kept[0]
                crop(cache, state.cache.kv[0][0].shape[2])  # what a cancelled frame wrote past it goes
            else:
                cache = window_cache(state.cache.kv, layout.window_positions)
            ids = [int(state.frames[-1][-1])] + [layout.slot_token_id] * layout.slot_tokens
            prefix_conditions = torch.from_numpy(state.conditions[state.next_frame - 1])
            prompt = (state.next_frame - state.window.start) * layout.frame_span
        length = cache.get_seq_length()
        placeholders = torch.full((layout.slot_tokens,), layout.slot_token_id, device=self.device)
        self._frames.append(_Frame(state, frame, cache, torch.tensor(ids, device=self.device),
                                   prefix_conditions.to(self.device, self.model.dtype), next_conditions,
                                   length + len(ids), prompt, state.window_starts, length, placeholders))

    def cancel(self, states: Sequence[RolloutState]) -> None:
        drop = {id(s) for s in states}
        self._frames = [f for f in self._frames if id(f.state) not in drop]

    def step(self) -> list[FrameDone]:
        """One forward pass for every frame in flight, then acceptance and refill together; the frames completed."""
        entries = list(self._frames)
        if not entries:
            return []
        passes = [self._pass(entry) for entry in entries]
        speculative.advance_frames([entry.frame for entry in entries], *zip(*passes))
        done = []
        for entry in entries:
            entry.length = entry.start + entry.frame.count - 1  # the last committed token is the next pass's input
            crop(entry.cache, entry.length)
            if entry.frame.done:
                self._frames.remove(entry)
                done.append(self._finish(entry))
        return done

    def _pass(self, entry: _Frame) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits of the frame's rows and, where the pass ran past the frame's end, of the next frame's first
        positions."""
        frame = entry.frame
        drafts, ahead = frame.drafts(), frame.ahead_drafts()
        width, reach = drafts.shape[0], ahead.shape[0]  # (tensor.shape, not len(): a pass's host work is small)
        slots = entry.placeholders.shape[0] if reach else 0
        if entry.prefix_ids is not None:  # the frame's first pass: its prompt, then the drafts
            parts, conditions = [entry.prefix_ids, drafts], [entry.prefix_conditions]
            entry.prefix_ids = None
        else:
            parts, conditions = [frame.last_token(), drafts], []
        if slots:  # past the frame's end: its slots, then the next frame's first guesses
            parts += [entry.placeholders, ahead]
            conditions.append(entry.next_conditions)
        ids = torch.cat(parts)
        begin = entry.length
        out = self.model(
            input_ids=ids[None],
            conditions=torch.cat(conditions)[None] if conditions else None,
            position_ids=torch.arange(begin, begin + ids.shape[0], device=self.device)[None],
            cache=entry.cache,
            use_cache=True,
            logits_to_keep=width + 1 + slots + reach,
        )
        logits = out.logits[0]
        return logits[: width + 1], logits[width + slots:] if slots else None

    def _finish(self, entry: _Frame) -> FrameDone:
        state, frame = entry.state, entry.frame
        codes = frame.codes().cpu().numpy().astype(np.int64)
        state.add_frame(codes, passes=frame.passes)
        state.cache.ahead = frame.handover() if frame.lookahead else None
        kv = None if state.window_starts else kv_tensors(entry.cache)  # a new window starts from a fresh prompt
        state.cache.kv, state.cache.window = kv, None if kv is None else (entry.cache, kv)
        computed = entry.prompt_tokens if entry.window_start else state.layout.slot_tokens + 1
        return FrameDone(state, codes, entry.prompt_tokens, entry.prompt_tokens - computed, entry.window_start)

