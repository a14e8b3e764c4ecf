"""The block rule of speculative Jacobi decoding on vLLM: which guessed tokens a pass accepts, and the next guesses.

One engine step feeds a request ``[x_n, d_1, ..., d_K]`` at positions ``n .. n+K`` (``x_n`` the last sampled token,
``d_i`` the guesses for positions ``n+i``). Row ``i`` of the pass's logits predicts position ``n+i+1``; vLLM's own
sampler draws a token ``y_i`` from every row with Gumbel noise keyed by ``(request seed, n+i)``
(``vllm/v1/worker/gpu/sample/gumbel.py``), so ``y_i`` is exactly the token sequential decoding would draw at
that position once its prefix is the pass's input. Hence:

* **accept** ``d_{i+1}`` while it equals ``y_i`` (:func:`accepted_guesses`); the request emits
  ``y_0 .. y_a`` (``a`` accepted guesses plus the token at the first mismatch, or the bonus token). Every emitted
  token is the sequential sample at its position, so the codes are those of sequential decoding token for token,
  greedy or sampled, and the distribution is the model's whatever the guesses were;
* **refill** (:func:`next_guesses`) the guess for each later position ``q`` with ``y_{q-1-n}`` where the pass
  reached it: a Jacobi iterate drawn with the very noise that will verify position ``q`` next step (coupled
  drafts: it is accepted whenever the prefix it saw was right or the two distributions agree under that noise);
  beyond the pass, with the code at ``q - S`` (the same patch of the previous frame: video is temporally
  redundant).

Pure tensor code without host syncs: :mod:`terra.vllm.jacobi_state` runs it on the GPU inside vLLM's model runner,
the tests on the CPU.
"""

from __future__ import annotations

import torch


def accepted_guesses(samples: torch.Tensor, guesses: torch.Tensor, num_guesses: torch.Tensor) -> torch.Tensor:
    """Leading guesses equal to the sample of the row before them, per request.

    ``samples [R, K+1]``: the token drawn from each logits row (row ``i`` predicts the position of guess ``i+1``);
    ``guesses [R, K]``: the guessed tokens the pass was fed, of which the first ``num_guesses [R]`` are real.
    """
    width = guesses.shape[1]
    real = torch.arange(width, device=guesses.device)[None, :] < num_guesses[:, None]
    match = (guesses == samples[:, :width]) & real
    return match.to(torch.int32).cumprod(dim=1).sum(dim=1)


def previous_frame_codes(
    history: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, frame_span: int, known: torch.Tensor
) -> torch.Tensor:
    """The token one frame earlier than each of ``positions [R, K]`` (``history [slots, L]`` holds each request's
    tokens from position 0), or the request's last known token where that one is not known yet or lies before 0.

    ``known [R]`` is how many tokens of each request ``history`` holds.
    """
    earlier = positions - frame_span
    usable = (earlier >= 0) & (earlier < known[:, None])
    last = (known - 1).clamp(min=0)[:, None].expand_as(earlier)
    column = torch.where(usable, earlier, last).to(torch.int64)
    return history[slots[:, None].to(torch.int64), column].to(torch.int64)


def next_guesses(
    samples: torch.Tensor,
    accepted: torch.Tensor,
    num_guesses: torch.Tensor,
    first_position: torch.Tensor,
    history: torch.Tensor,
    slots: torch.Tensor,
    frame_span: int,
) -> torch.Tensor:
    """The ``K`` guesses each request is fed next step, for the positions after its last emitted token.

    The request emitted ``accepted + 1`` tokens, the last at position ``first_position + accepted + 1``
    (``first_position [R]``: the position of row 0, the last token sampled before this pass). Guess ``j`` (1-based)
    is for position ``q = first_position + accepted + 1 + j``: the pass's own sample of row ``accepted + j`` where
    that row exists (``<= num_guesses``), else the previous frame's code at ``q`` (:func:`previous_frame_codes`,
    ``history`` already holding the emitted tokens or not: only positions before the pass are read).
    """
    width = samples.shape[1] - 1
    step = torch.arange(1, width + 1, device=samples.device)[None, :]
    row = accepted[:, None].to(torch.int64) + step
    from_pass = samples.gather(1, row.clamp(max=width))
    positions = first_position[:, None].to(torch.int64) + accepted[:, None] + 1 + step
    known = first_position.to(torch.int64) + 1  # tokens before this pass: positions 0 .. first_position
    earlier = previous_frame_codes(history, slots, positions, frame_span, known)
    return torch.where(row <= num_guesses[:, None], from_pass, earlier)


__all__ = ["accepted_guesses", "next_guesses", "previous_frame_codes"]
