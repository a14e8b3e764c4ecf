"""The sampler draws from the model's law, and speculative decoding draws the same codes
(terra/generation/sampling.py, terra/generation/speculative.py).

A fake five-token frame over four codes whose logits depend on the position and the previous token (so guesses
and their refills matter), sampled with temperature, top-k and top-p. Its exact law under sequential decoding is
enumerated. From many seeds: (1) the Gumbel sampler's frames, decoded one token at a time, follow that law
(Pearson's chi-squared test on the joint law of all five positions, so every position's law given the ones
before it is tested at once); (2) speculative decoding gives, seed for seed, the sequential frame, and so the
same law; (3) the same test rejects deliberately wrong implementations: noise shared by all positions instead of
keyed by position, a guess accepted when it equals its row's noiseless argmax, one guess accepted too many.

False alarms: the correct implementations are tested three times (the sampler, speculative decoding at two
counts of draft tokens) at level 1e-3 / 3 each, so a correct implementation fails this file with probability at
most 1e-3 (the seeds are fixed, so in fact it passes or fails the same way on every run). The wrong ones must be
rejected at that same level.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from terra.config.sampling import SamplingConfig
from terra.generation import sampling, speculative
from terra.generation.sampling import gumbel_noise, image_token_scores, noise_keys, sample_image_tokens
from terra.generation.speculative import SpeculativeFrame, accepted_guesses, next_guesses

V, P = 4, 5  # codes, image tokens of the fake frame
WARPED = SamplingConfig(temperature=0.8, top_k=3, top_p=0.9)
GUESS = torch.tensor([0, 1, 2, 3, 0])  # the "previous frame": some guesses are outside the top-k, some likely
DRAWS = 4000
ALPHA = 1e-3 / 3  # per test: three tests of correct implementations share a false-alarm rate of 1e-3


def fake_logits(table: torch.Tensor, tokens: list[int], first: int, rows: int) -> torch.Tensor:
    """Rows ``first .. first + rows - 1`` of the fake model's logits for the token sequence ``tokens``: position
    ``i``'s logits are ``table[i, previous token]`` (a start token ``V`` before position 0)."""
    return torch.stack([table[i, tokens[i - 1] if i else V] for i in range(first, first + rows)])


@pytest.fixture(scope="module")
def table() -> torch.Tensor:
    return torch.randn(P + 1, V + 1, V, generator=torch.Generator().manual_seed(0)) * 1.5


@pytest.fixture(scope="module")
def exact_law(table) -> dict[tuple[int, ...], float]:
    """Every frame of non-zero probability under sequential decoding, with its probability."""
    law = {}
    for frame in itertools.product(range(V), repeat=P):
        p = 1.0
        for i, code in enumerate(frame):
            p *= float(image_token_scores(table[i, frame[i - 1] if i else V][None], V, WARPED).softmax(-1)[0, code])
        if p > 0:
            law[frame] = p
    return law


def sequential_frame(table: torch.Tensor, seed: int) -> tuple[int, ...]:
    """One frame decoded a token at a time with the Gumbel sampler (the rollout seeded ``seed``, frame 0)."""
    tokens: list[int] = []
    for i in range(P):
        noise = gumbel_noise(seed, 0, [i], V)
        tokens.append(int(sample_image_tokens(fake_logits(table, tokens, i, 1), V, WARPED, noise)[0]))
    return tuple(tokens)


def speculative_frame(table: torch.Tensor, seed: int, draft_tokens: int) -> tuple[int, ...]:
    frame = SpeculativeFrame(GUESS, draft_tokens, V, WARPED, seed, 0)
    while not frame.done:
        drafts = frame.drafts()
        tokens = frame.committed.tolist() + drafts.tolist()
        frame.advance(fake_logits(table, tokens, frame.count, len(drafts) + 1))
    return tuple(frame.committed.tolist())


def counts_of(frames) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for frame in frames:
        counts[frame] = counts.get(frame, 0) + 1
    return counts


def chi_squared_p_value(counts: dict, law: dict) -> float:
    """Pearson's test of ``counts`` against ``law`` (cells expecting fewer than 5 pooled); its p-value (0 when a
    frame of probability zero was drawn)."""
    if not set(counts) <= set(law):
        return 0.0
    draws = sum(counts.values())
    expected = {cell: draws * p for cell, p in law.items()}
    large = [cell for cell in expected if expected[cell] >= 5]
    small = [cell for cell in expected if expected[cell] < 5]
    stat = sum((counts.get(c, 0) - expected[c]) ** 2 / expected[c] for c in large)
    if small:
        pooled = sum(expected[c] for c in small)
        stat += (sum(counts.get(c, 0) for c in small) - pooled) ** 2 / pooled
    dof = len(large) + bool(small) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.fixture(scope="module")
def sequential_frames(table, single_thread) -> list[tuple[int, ...]]:
    return [sequential_frame(table, seed) for seed in range(DRAWS)]


def test_the_gumbel_sampler_follows_the_law(sequential_frames, exact_law):
    assert chi_squared_p_value(counts_of(sequential_frames), exact_law) > ALPHA


@pytest.mark.parametrize("draft_tokens", [2, P], ids=["draft_tokens_2", "whole_frame"])
def test_speculative_frames_are_the_sequential_frames(table, exact_law, sequential_frames, draft_tokens):
    frames = [speculative_frame(table, seed, draft_tokens) for seed in range(DRAWS)]
    assert frames == sequential_frames  # seed for seed
    assert chi_squared_p_value(counts_of(frames), exact_law) > ALPHA


def test_noise_shared_across_positions_is_rejected(table, exact_law, monkeypatch, single_thread):
    monkeypatch.setattr(sampling, "noise_keys", lambda seed, frame, positions: noise_keys(seed, frame, positions * 0))
    counts = counts_of(sequential_frame(table, seed) for seed in range(DRAWS // 2))
    assert chi_squared_p_value(counts, exact_law) < ALPHA


def _advance_accepting_the_noiseless_argmax(frame: SpeculativeFrame, logits: torch.Tensor) -> int:
    """:meth:`SpeculativeFrame.advance`, wrongly accepting a guess that equals its row's argmax without noise."""
    width = len(frame.drafts())
    rows = min(width + 1, frame.size - frame.count)
    drawn = sample_image_tokens(logits[:rows], V, WARPED, frame._rows(rows))
    samples = torch.full((1, width + 1), -1, dtype=torch.long)
    samples[0, :rows] = drawn
    argmax = torch.full((1, width + 1), -1, dtype=torch.long)
    argmax[0, :rows] = image_token_scores(logits[:rows], V, WARPED).argmax(dim=-1)
    num_guesses = torch.tensor([width])
    accepted = accepted_guesses(argmax, frame.guesses[None, :width], num_guesses)
    emitted = min(int(accepted[0]) + 1, rows)
    samples[0, : int(accepted[0])] = frame.guesses[: int(accepted[0])]
    frame._codes[frame.count : frame.count + emitted] = samples[0, :emitted]
    frame.count += emitted
    frame.guesses = next_guesses(samples, accepted, num_guesses, frame._later(frame.count, frame.draft_tokens)[None])[0]
    frame._noise = frame._noise[emitted:]
    return emitted


def _one_guess_too_many(samples, guesses, num_guesses):
    return torch.minimum(accepted_guesses(samples, guesses, num_guesses) + 1, num_guesses)


@pytest.mark.parametrize("rule", ["noiseless_argmax", "one_too_many"])
def test_a_wrong_speculative_rule_is_rejected(table, exact_law, rule, monkeypatch, single_thread):
    if rule == "noiseless_argmax":
        monkeypatch.setattr(SpeculativeFrame, "advance", _advance_accepting_the_noiseless_argmax)
    else:
        monkeypatch.setattr(speculative, "accepted_guesses", _one_guess_too_many)
    counts = counts_of(speculative_frame(table, seed, 3) for seed in range(DRAWS // 2))
    assert chi_squared_p_value(counts, exact_law) < ALPHA


def test_noise_is_keyed_by_seed_frame_and_position():
    rows = gumbel_noise(7, 2, [0, 5, 9], 1000)
    assert rows.shape == (3, 1000) and rows.dtype == torch.float32 and bool(torch.isfinite(rows).all())
    torch.testing.assert_close(gumbel_noise(7, 2, [9, 5], 1000), rows[[2, 1]], rtol=0, atol=0)  # order-free
    assert not torch.equal(gumbel_noise(7, 3, [0], 1000)[0], rows[0])  # another frame
    assert not torch.equal(gumbel_noise(8, 2, [0], 1000)[0], rows[0])  # another seed
    assert not torch.equal(gumbel_noise(7 + 2**32, 2, [0], 1000)[0], rows[0])  # the seed's high word counts
    assert abs(float(rows.mean()) - 0.5772) < 0.1 and abs(float(rows.var()) - torch.pi ** 2 / 6) < 0.3  # Gumbel
    # rows of several rollouts at once (the sequential step): each row as drawn alone
    mixed = gumbel_noise(torch.tensor([7, 8]), torch.tensor([2, 2]), torch.tensor([9, 0]), 1000)
    torch.testing.assert_close(mixed, torch.cat([rows[2:], gumbel_noise(8, 2, [0], 1000)]), rtol=0, atol=0)
    whole = gumbel_noise(2**62 - 1, 10**6, torch.arange(576), 4096)  # the largest seed, a long rollout
    assert bool(torch.isfinite(whole).all()) and len(set(whole[:, 0].tolist())) == 576
    assert abs(float(whole.mean()) - 0.5772) < 0.01 and abs(float(whole.var()) - torch.pi ** 2 / 6) < 0.02


def test_the_noise_hash_wraps_as_32_bit_words():
    """sampling._hash32 multiplies int32 words and relies on torch's products wrapping modulo 2^32: the same hash in
    Python's integers, over words that overflow in every step, on this machine's kernels (vectorised and not)."""
    def reference(word: int) -> int:
        word ^= word >> 16
        word = word * 0x21F0AAAD & 0xFFFFFFFF
        word ^= word >> 15
        word = word * 0x735A2D97 & 0xFFFFFFFF
        return word ^ word >> 15

    words = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 0x9E3779B9, *range(12345, 12345 + 997 * 61, 997)]
    as_int32 = torch.tensor([w - 2**32 if w >= 2**31 else w for w in words], dtype=torch.int64).to(torch.int32)
    hashed = sampling._hash32(as_int32.clone()).to(torch.int64) & 0xFFFFFFFF
    assert hashed.tolist() == [reference(w) for w in words]
    assert sampling._hash32(as_int32[:1].clone()).item() & 0xFFFFFFFF == reference(words[0])  # a one-element tensor


def test_greedy_pass_keeps_the_argmax_prefix_then_corrects():
    logits = torch.full((4, 6), -5.0)
    logits[torch.arange(4), torch.tensor([3, 1, 0, 4])] = 5.0
    logits[:, 5] = 50.0  # a non-image id (the action placeholder) never wins
    greedy = SamplingConfig(temperature=0)
    samples = sample_image_tokens(logits, 5, greedy, None)[None]
    assert samples.tolist() == [[3, 1, 0, 4]]
    accepted = accepted_guesses(samples, torch.tensor([[3, 1, 2]]), torch.tensor([3]))
    assert accepted.tolist() == [2]  # commits 3 1 0: two guesses and the draw at the mismatch
    assert accepted_guesses(samples, torch.tensor([[3, 1, 0]]), torch.tensor([3])).tolist() == [3]  # and the bonus
    assert accepted_guesses(samples, torch.tensor([[3, 1, 0]]), torch.tensor([2])).tolist() == [2]  # real ones only
    later = torch.tensor([[7, 8, 9]])
    assert next_guesses(samples, accepted, torch.tensor([3]), later).tolist() == [[4, 8, 9]]  # row 3, then later
