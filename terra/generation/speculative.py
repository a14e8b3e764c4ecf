"""Speculative Jacobi decoding with coupled drafts: several image tokens per forward pass, same distribution.

A frame's ``P`` image tokens are decoded left to right. Past the committed prefix sits a *block* of up to
``block_size`` guessed tokens (drafts); one forward pass scores the whole block (row ``j`` of its logits is the
model's next-token distribution after the prefix and drafts ``0 .. j-1``), :func:`verify_block` decides how many
tokens that pass commits, and the block is refilled from the same pass's predictions (Jacobi iteration, SJD:
arXiv 2410.01699). Each refilled draft is *coupled* to the draft it replaces (Speculative Coupled Decoding,
arXiv 2510.24211): it keeps the old token with probability ``min(1, p(d) / q(d))`` and else draws from the
residual, so a position whose distribution did not change keeps its token and the block settles instead of
being redrawn every pass. Drafts of positions that enter the block are the previous frame's codes at the same
positions, as point masses (video is temporally redundant). A block never crosses the frame's end, so frames
stay whole and no action slot is ever sampled.

Exactness. Let ``p_i = p(. | x_<i)`` be the warped distribution (temperature, top-k, top-p:
terra/generation/sampling.py, ``image_token_probs``) of image position ``i`` after the committed tokens.
Speculative decoding commits each ``x_i`` with law ``p_i`` given ``x_<i``, as sequential decoding draws it:

1. *Ownership.* Everything random that concerns position ``i`` (its guess, and in every pass the coin and the
   residual draw of the coupling below) is drawn fresh for ``i``; nothing at positions below ``i`` (the logits
   there, what is committed, where the block ends) reads anything at or above ``i``: the model is causal and
   the rule goes left to right. Let ``H_i`` be the whole history of the positions below ``i``.
2. *Invariant.* Whenever position ``i`` holds a draft ``d`` with recorded proposal ``q`` (fixed by ``H_i``),
   ``d ~ q`` given ``H_i``. A guess is a point mass (``q = delta_g``). A pass computes a target ``p`` for
   the position from the tokens below it (fixed by ``H_i``) and replaces ``d`` by ``Y``: ``Y = d`` when a fresh
   uniform ``u`` has ``u q(d) < p(d)``, else a draw from the residual ``(p - q)+`` normalised. For ``d ~ q``
   this gives ``Y ~ p`` exactly (the maximal coupling of ``q`` and ``p``), so ``p``, the law ``Y`` was drawn
   from, is recorded as ``Y``'s proposal and the invariant holds again. The coin that produced ``Y`` is spent;
   the next pass tests ``Y`` with a fresh one. (Keeping ``q`` as the proposal of a kept token would be wrong:
   given that it survived the coin, the token no longer has law ``q``.)
3. *Commit.* In a pass, the first position past the committed prefix has the true ``p_i`` as its target (every
   input below it is committed), so its ``Y ~ p_i`` is committed. The next position's target is true again if
   and only if the draft below was kept (``Y = d``), and so on: the pass commits every ``Y`` up to and
   including the first rejected position (at which ``Y`` is the residual draw), or all drafts and then one
   token drawn straight from the row after the block (the bonus row, when the block ends before the frame).
   Conditioned on ``H_i``, which fixes ``x_<i`` and whether ``i`` is committed in this pass, ``x_i = Y ~ p_i``;
   averaging over ``H_i`` gives the claim. Uncommitted ``Y`` stay as the next pass's drafts (step 2).

Temperature 0 makes every ``p`` a point mass at the argmax: a draft is kept iff it is the argmax, every
refilled draft is the argmax, no random number is drawn, and the frame equals greedy sequential decoding token
for token. Each rollout draws from its own seeded generator, so its tokens do not depend on what it is batched
with (tests/generation/test_speculative_exact.py tests all of this).

The core is backend-agnostic plain torch: :func:`verify_block` is one pass's decision on any device, and
:class:`SpeculativeFrame` keeps one frame's block between passes; a backend only runs the forward passes
(terra/generation/hf_speculative.py for Transformers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from terra.config.sampling import SamplingConfig
from terra.generation.sampling import image_token_probs


@dataclass(frozen=True)
class BlockVerdict:
    """What one pass decided for one block (see :func:`verify_block`)."""

    tokens: torch.Tensor  # [m] committed tokens, in order: accepted drafts, then the resampled or bonus token
    num_accepted: int  # drafts accepted: the first num_accepted of ``tokens``
    drafts: torch.Tensor  # [r] refilled drafts of the positions right after the committed ones
    draft_probs: torch.Tensor | None  # [r, V] the law each refilled draft was drawn from; None: point masses


def verify_block(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, logits: torch.Tensor,
                 codebook_size: int, sampling: SamplingConfig, generator: torch.Generator | None) -> BlockVerdict:
    """One pass of speculative decoding for one block: accept, resample at the first rejection, refill.

    Inputs (``n`` drafts, image codebook of ``V = codebook_size`` codes):

    * ``draft_tokens [n]`` (long): the guesses for the ``n`` positions right after the committed prefix;
    * ``draft_probs [n, V]``: the distribution each draft was drawn from (a one-hot row for a point mass, e.g. a
      previous-frame guess), or None when every draft is a point mass. A draft must lie in its law's support.
    * ``logits [n + 1, vocab]`` or ``[n, vocab]``: row ``j`` is the model's logits for block position ``j``
      given the committed prefix and drafts ``0 .. j-1`` (the row of the last committed token, then one row per
      draft). The extra row ``n`` (the bonus row) is the position after the block; leave it out when the block
      ends the frame (that position is an action slot). Columns from ``codebook_size`` on are never sampled.
    * ``sampling``: temperature (0: greedy), top-k, top-p; the warped distribution is the target.
    * ``generator``: the rollout's own generator (unused when greedy).

    Returns a :class:`BlockVerdict`: the ``m >= 1`` committed tokens (``m = num_accepted + 1``, or ``n`` when
    every draft is accepted and there is no bonus row), and the refilled drafts of block positions
    ``m .. rows - 1`` with the laws they were drawn from (coupled to the old drafts; the bonus row's a fresh
    draw), to be scored by the next pass after the new committed tokens. Random numbers drawn: ``n`` uniforms,
    one residual draw per rejected draft, one draw from the bonus row; none when greedy.
    """
    n, rows = len(draft_tokens), logits.shape[0]
    if rows not in (n, n + 1):
        raise ValueError(f"a block of {n} drafts needs {n} or {n + 1} rows of logits, got {rows}")
    if sampling.greedy:  # every target a point mass at the argmax: keep a draft iff it is the argmax
        target = logits[:, :codebook_size].float().argmax(dim=-1)
        kept = torch.cat([target[:n] == draft_tokens, target.new_zeros(1, dtype=torch.bool)])
        accepted = int(kept.long().argmin())
        committed = min(accepted + 1, rows)
        tokens = torch.cat([draft_tokens[:accepted], target[accepted:committed]])
        return BlockVerdict(tokens, accepted, target[committed:], None)
    probs = image_token_probs(logits, codebook_size, sampling)
    index = draft_tokens[:, None]
    p_draft = probs[:n].gather(1, index)[:, 0]
    q_draft = torch.ones_like(p_draft) if draft_probs is None else draft_probs.gather(1, index)[:, 0]
    coin = torch.rand(n, generator=generator, device=probs.device)
    kept = coin * q_draft < p_draft  # probability min(1, p(d) / q(d))
    refilled = draft_tokens.clone()
    rejected = (~kept).nonzero()[:, 0]
    if len(rejected):
        old = (torch.nn.functional.one_hot(draft_tokens[rejected], probs.shape[1]).to(probs.dtype)
               if draft_probs is None else draft_probs[rejected])
        refilled[rejected] = torch.multinomial(residual(probs[rejected], old), 1, generator=generator)[:, 0]
    if rows > n:
        refilled = torch.cat([refilled, torch.multinomial(probs[n], 1, generator=generator)])
    accepted = int(torch.cat([kept, kept.new_zeros(1)]).long().argmin())
    committed = min(accepted + 1, rows)
    return BlockVerdict(refilled[:committed], accepted, refilled[committed:], probs[committed:])


def residual(target: torch.Tensor, proposal: torch.Tensor) -> torch.Tensor:
    """Rows of ``(target - proposal)+``: what a rejected draft is redrawn from (unnormalised; ``torch.multinomial``
    normalises). Where rounding leaves a row empty (``target <= proposal`` everywhere), the target itself."""
    rows = (target - proposal).clamp(min=0)
    empty = rows.sum(dim=1) <= 0
    rows[empty] = target[empty]
    return rows


class SpeculativeFrame:
    """One frame being decoded speculatively: its committed tokens and its block of drafts between passes.

    ``guess [P]`` (long) holds the previous frame's codes: the point-mass draft of every position when it enters
    the block. Each pass, a backend feeds the last committed token (or, in the frame's first pass, the frame's
    prompt) followed by :meth:`block`, and hands the logits of those ``len(block) + 1`` positions to
    :meth:`advance`; only :attr:`scores_bonus` says whether the last of them is wanted (the block ends before the
    frame's end) or dropped (it would be an action slot).
    """

    def __init__(self, guess: torch.Tensor, block_size: int, codebook_size: int, sampling: SamplingConfig,
                 generator: torch.Generator | None) -> None:
        self.guess = guess
        self.block_size = block_size
        self.codebook_size = codebook_size
        self.sampling = sampling
        self.generator = generator
        self.committed: list[torch.Tensor] = []
        self.count = 0  # tokens committed
        self.drafts = guess.new_empty(0)
        self.draft_probs: torch.Tensor | None = None
        self.passes = 0
        self.accepted = 0  # drafts accepted over all passes

    @property
    def done(self) -> bool:
        return self.count == len(self.guess)

    def block(self) -> torch.Tensor:
        """The drafts the next pass scores: the refilled ones, topped up with guesses to ``block_size`` drafts (at
        most the frame's remaining tokens)."""
        size = min(self.block_size, len(self.guess) - self.count)
        have = len(self.drafts)
        if have < size:
            new = self.guess[self.count + have : self.count + size]
            self.drafts = torch.cat([self.drafts, new])
            if self.draft_probs is not None:
                point = torch.nn.functional.one_hot(new, self.draft_probs.shape[1]).to(self.draft_probs.dtype)
                self.draft_probs = torch.cat([self.draft_probs, point])
        return self.drafts

    @property
    def scores_bonus(self) -> bool:
        """Whether the position after the block is an image token of this frame (its row is used)."""
        return self.count + len(self.drafts) < len(self.guess)

    def advance(self, logits: torch.Tensor) -> int:
        """Take one pass's logits ``[len(block) + 1, vocab]`` (the last row is ignored unless
        :attr:`scores_bonus`); commit what :func:`verify_block` accepts; return the number of tokens committed."""
        rows = len(self.drafts) + self.scores_bonus
        verdict = verify_block(self.drafts, self.draft_probs, logits[:rows], self.codebook_size, self.sampling,
                               self.generator)
        self.committed.append(verdict.tokens)
        self.count += len(verdict.tokens)
        self.drafts, self.draft_probs = verdict.drafts, verdict.draft_probs
        self.passes += 1
        self.accepted += verdict.num_accepted
        return len(verdict.tokens)

    def codes(self) -> torch.Tensor:
        """The frame's ``P`` committed codes (once :attr:`done`)."""
        return torch.cat(self.committed)
