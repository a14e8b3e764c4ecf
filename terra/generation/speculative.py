"""Speculative Jacobi decoding (SJD, arXiv 2410.01699) with Gumbel-coupled drafts (SCD, arXiv 2510.24211): several image
tokens per forward pass, the codes of sequential decoding for the same seed; the rule for both backends and the
Transformers backend's step loop over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache

from terra.config.sampling import SamplingConfig
from terra.generation.guesses import Transitions
from terra.generation.kv import crop, kv_cache, kv_tensors
from terra.generation.rollout import FrameDone, RolloutState
from terra.generation.sampling import gumbel_noise, sample_image_tokens


def accepted_guesses(samples: torch.Tensor, guesses: torch.Tensor, num_guesses: torch.Tensor) -> torch.Tensor:
    """Per request: how many leading ``guesses [R, K]`` equal ``samples [R, K+1]``, at most ``num_guesses`` (int32)."""
    match = guesses == samples[:, : guesses.shape[1]]
    leading = match.cumprod(dim=1, dtype=torch.int32).sum(dim=1, dtype=torch.int32)
    return torch.minimum(leading, num_guesses)  # the slots past a request's guesses never count


def next_guesses(samples: torch.Tensor, accepted: torch.Tensor, num_guesses: torch.Tensor,
                 later: torch.Tensor) -> torch.Tensor:
    """The ``[R, K]`` guesses after each request's last committed token: the pass's draw, else ``later``."""
    row = accepted[:, None] + _steps(later.shape[1], samples.device)  # int64
    from_pass = samples.gather(1, row.clamp(max=samples.shape[1] - 1))
    return torch.where(row <= num_guesses[:, None], from_pass, later)


@lru_cache(maxsize=8)
def _steps(width: int, device: torch.device) -> torch.Tensor:
    return torch.arange(1, width + 1, device=device)


NOISE_ELEMENTS = 1 << 20  # a frame's noise is drawn at least this many values at a time, never past its last position


class SpeculativeFrame:
    """One frame decoded speculatively by one rollout: its committed tokens and its guesses between passes.

    Args:
        later: ``[P]`` long, each position's first guess (the previous frame's codes or a handover).
        seed: with ``frame`` (the frame's index in the rollout), keys the Gumbel noise of its positions.
    """

    def __init__(self, later: torch.Tensor, draft_tokens: int, codebook_size: int, sampling: SamplingConfig,
                 seed: int, frame: int, transitions: bool = False, lookahead: bool = False,
                 noise: torch.Tensor | None = None) -> None:
        self.later = later
        self.size = len(later)
        self.draft_tokens = draft_tokens
        self.codebook_size = codebook_size
        self.sampling = sampling
        self.seed, self.frame = seed, frame
        self._codes = torch.empty(self.size, dtype=torch.long, device=later.device)  # committed: [:count]
        self.count = 0  # tokens committed
        self.guesses = self._later(0, draft_tokens).clone()  # refilled in place by transitions
        self.passes = 0
        # the noise of positions count .. count + rows - 1 (``noise``: the first rows, drawn by the previous frame)
        self._noise = torch.empty(0, codebook_size, device=later.device) if noise is None else noise
        self._memory = Transitions(self.size, later.device) if transitions else None
        self.lookahead = lookahead  # passes may run past the frame's end into the next frame (the backend decides)
        self.ahead = torch.empty(0, dtype=torch.long, device=later.device)  # latest draws, next frame's 0 .. n-1
        self._nothing = self.ahead  # no guesses
        self._ahead_noise = torch.empty(0, codebook_size, device=later.device)

    @property
    def done(self) -> bool:
        return self.count == self.size

    @property
    def committed(self) -> torch.Tensor:
        """The tokens committed so far ``[count]``."""
        return self._codes[: self.count]

    def drafts(self) -> torch.Tensor:
        """The guesses the next pass scores: at most ``draft_tokens``, never past the frame's last image token."""
        return self.guesses[: min(self.draft_tokens, self.size - self.count)]

    def last_token(self) -> torch.Tensor:
        """``[1]``: the last committed token, or the codebook's size (no code) before the frame's first."""
        if self.count:
            return self._codes[self.count - 1 : self.count]
        return torch.full((1,), self.codebook_size, dtype=torch.long, device=self.later.device)

    def ahead_drafts(self) -> torch.Tensor:
        """With ``lookahead``: the next frame's guesses a pass feeds after this frame's last guess and action slots."""
        room = min(self.draft_tokens - (self.size - self.count), self.size - 1) if self.lookahead else 0
        return self._next_frame_guesses(room) if room > 0 else self._nothing

    def _next_frame_guesses(self, count: int) -> torch.Tensor:
        reached = self.ahead.shape[0]
        if reached >= count:
            return self.ahead[:count]
        mine = torch.cat([self.committed, self.guesses[: self.size - self.count]])
        return torch.cat([self.ahead, mine[reached:count]])

    def handover(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Once :attr:`done`: the next frame's index, first guesses and noise drawn so far (None if greedy)."""
        return self.frame + 1, self._next_frame_guesses(self.size), self._ahead_noise

    def advance(self, logits: torch.Tensor, ahead_logits: torch.Tensor | None = None) -> int:
        """Take one pass's logits ``[len(drafts) + 1, vocab]``; return the number of tokens committed."""
        return advance_frames([self], [logits], [ahead_logits])[0]

    def _positions(self, start: int, count: int) -> torch.Tensor:
        return torch.arange(start, start + count, device=self.later.device).clamp(max=self.size - 1)

    def _later(self, start: int, count: int) -> torch.Tensor:
        if start + count <= self.size:
            return self.later[start : start + count]
        return self.later[self._positions(start, count)]

    def _ahead_rows(self, rows: int) -> torch.Tensor | None:
        """The noise of the next frame's positions ``0 .. rows - 1``, drawn once and handed over."""
        if self.sampling.greedy:
            return None
        self._ahead_noise = self._grown(self._ahead_noise, self.frame + 1, 0, rows)
        return self._ahead_noise[:rows]

    def _rows(self, rows: int) -> torch.Tensor | None:
        if self.sampling.greedy:
            return None
        self._noise = self._grown(self._noise, self.frame, self.count, rows)
        return self._noise[:rows]

    def _grown(self, kept: torch.Tensor, frame: int, first: int, rows: int) -> torch.Tensor:
        have = kept.shape[0]
        if have >= rows:
            return kept
        end = first + min(max(rows, NOISE_ELEMENTS // self.codebook_size), self.size - first)
        fresh = gumbel_noise(self.seed, frame, range(first + have, end), self.codebook_size, kept.device)
        return torch.cat([kept, fresh])


def advance_frames(frames: Sequence[SpeculativeFrame], logits: Sequence[torch.Tensor],
                   ahead_logits: Sequence[torch.Tensor | None]) -> list[int]:
    """One pass of each of ``frames``: rows drawn with each frame's own noise, then acceptance and refill at once."""
    _draw_ahead([(frame, rows) for frame, rows in zip(frames, ahead_logits) if rows is not None])
    widths = [min(frame.draft_tokens, frame.size - frame.count) for frame in frames]
    rows = [min(width + 1, frame.size - frame.count) for frame, width in zip(frames, widths)]  # none past the end
    drawn = [sample_image_tokens(scores if count == scores.shape[0] else scores[:count], frame.codebook_size,
                                 frame.sampling, frame._rows(count))
             for frame, scores, count in zip(frames, logits, rows)]
    device = drawn[0].device
    columns = max(widths) + 1  # a frame's last pass has no row after its last guess: -1 there
    samples = _stacked(drawn, -1)
    if samples.shape[1] < columns:
        samples = torch.nn.functional.pad(samples, (0, columns - samples.shape[1]), value=-1)
    fed = _stacked([frame.guesses[:width] for frame, width in zip(frames, widths)])
    num_guesses = torch.tensor(widths, dtype=torch.int32, device=device)
    accepted = accepted_guesses(samples, fed, num_guesses)
    emitted = [min(a + 1, r) for a, r in zip(accepted.tolist(), rows)]
    for frame, width, count, tokens, taken in zip(frames, widths, rows, drawn, emitted):
        if frame._memory is not None and taken < count:  # row j drew position count + j after the token fed there
            before = torch.cat([frame.last_token(), frame.guesses[:width]])  # rows before ``taken``: committed
            frame._memory.record(frame._positions(frame.count + taken, count - taken), before[taken:count],
                                 tokens[taken:count])
        frame._codes[frame.count : frame.count + taken] = tokens[:taken]
        frame.count += taken
    later = _stacked([frame._later(frame.count, frame.draft_tokens) for frame in frames])
    refilled = next_guesses(samples, accepted, num_guesses, later)
    for frame, guesses, taken in zip(frames, refilled, emitted):
        frame.guesses = guesses[: frame.draft_tokens]
        if frame._memory is not None and not frame.done:
            scored = min(frame.draft_tokens, frame.size - frame.count)  # the guesses the next pass feeds
            before = torch.cat([frame.last_token(), frame.guesses[: scored - 1]])
            frame.guesses[:scored] = frame._memory.recall(frame._positions(frame.count, scored), before,
                                                          frame.guesses[:scored])
        frame._noise = frame._noise[taken:]
        frame.passes += 1
    return emitted


def _draw_ahead(ahead: list[tuple[SpeculativeFrame, torch.Tensor]]) -> None:
    """Each frame's next frame's first guesses, drawn from the rows a pass ran past its end."""
    for frame, rows in ahead:
        tokens = sample_image_tokens(rows, frame.codebook_size, frame.sampling, frame._ahead_rows(rows.shape[0]))
        frame.ahead = torch.cat([tokens, frame.ahead[rows.shape[0]:]])


def _stacked(rows: list[torch.Tensor], fill: int = 0) -> torch.Tensor:
    return rows[0][None] if len(rows) == 1 else pad_sequence(rows, batch_first=True, padding_value=fill)


@dataclass
class _FrameInFlight:
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
        self._frames: list[_FrameInFlight] = []

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
            cache, prompt = kv_cache(None, layout.window_positions), len(ids)
            prefix_conditions = torch.from_numpy(conditions).reshape(-1, layout.action_dim)
        else:
            kept = state.cache.window  # the window's cache this rollout wrote last, unless it has moved on since
            if kept is not None and kept[1] is state.cache.kv:
                cache = kept[0]
                crop(cache, state.cache.kv[0][0].shape[2])  # what a cancelled frame wrote past it goes
            else:
                cache = kv_cache(state.cache.kv, layout.window_positions)
            ids = [int(state.frames[-1][-1])] + [layout.slot_token_id] * layout.slot_tokens
            prefix_conditions = torch.from_numpy(state.conditions[state.next_frame - 1])
            prompt = (state.next_frame - state.window.start) * layout.frame_span
        length = cache.get_seq_length()
        placeholders = torch.full((layout.slot_tokens,), layout.slot_token_id, device=self.device)
        self._frames.append(_FrameInFlight(state, frame, cache, torch.tensor(ids, device=self.device),
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
        advance_frames([entry.frame for entry in entries], *zip(*passes))
        done = []
        for entry in entries:
            entry.length = entry.start + entry.frame.count - 1  # the last committed token is the next pass's input
            crop(entry.cache, entry.length)
            if entry.frame.done:
                self._frames.remove(entry)
                done.append(self._finish(entry))
        return done

    def _pass(self, entry: _FrameInFlight) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits of the frame's rows and, where the pass ran past its end, of the next frame's first positions."""
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

    def _finish(self, entry: _FrameInFlight) -> FrameDone:
        state, frame = entry.state, entry.frame
        codes = frame.committed.cpu().numpy().astype(np.int64)
        state.add_frame(codes, passes=frame.passes)
        state.cache.ahead = frame.handover() if frame.lookahead else None
        kv = None if state.window_starts else kv_tensors(entry.cache)  # a new window starts from a fresh prompt
        state.cache.kv, state.cache.window = kv, None if kv is None else (entry.cache, kv)
        computed = entry.prompt_tokens if entry.window_start else state.layout.slot_tokens + 1
        return FrameDone(state, codes, entry.prompt_tokens, entry.prompt_tokens - computed, entry.window_start)

