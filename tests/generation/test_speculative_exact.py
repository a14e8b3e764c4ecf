"""Speculative decoding draws what sequential decoding draws (terra/generation/speculative.py).

The verdict of one pass on hand-made logits (greedy), and a statistical test on a model whose next-token
distributions are known exactly: a fake five-token frame over four codes whose logits depend on the position and
the previous token (so the Jacobi drafts and their coupling matter), sampled with temperature, top-k and top-p.
The frame's exact law under sequential decoding is enumerated; speculative decoding is run from many seeds and
its frames compared with it by a chi-squared test on the joint law of all five positions (so every position's
law, given the ones before it, is tested at once), and the same test must reject two deliberately wrong rules.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from terra.config.sampling import SamplingConfig
from terra.generation import speculative
from terra.generation.sampling import image_token_probs
from terra.generation.speculative import SpeculativeFrame, verify_block

V, P = 4, 5  # codes, image tokens of the fake frame
WARPED = SamplingConfig(temperature=0.8, top_k=3, top_p=0.9, decoding="speculative")
GUESS = torch.tensor([0, 1, 2, 3, 0])  # the "previous frame": some guesses are outside the top-k, some likely
DRAWS = 4000
# False-alarm rate of the whole file's correct-rule tests: 1e-3, Bonferroni over its tests (two block sizes, one
# joint test each); the wrong rules must be rejected at that same per-test level.
ALPHA = 1e-3 / 2


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
            p *= float(image_token_probs(table[i, frame[i - 1] if i else V][None], V, WARPED)[0, code])
        if p > 0:
            law[frame] = p
    return law


def speculative_frames(table: torch.Tensor, block_size: int, draws: int) -> dict[tuple[int, ...], int]:
    """How often each frame came out of speculative decoding, one seeded generator per draw."""
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(draws):
        frame = SpeculativeFrame(GUESS, block_size, V, WARPED, torch.Generator().manual_seed(seed))
        while not frame.done:
            block = frame.block()
            tokens = (frame.codes().tolist() if frame.committed else []) + block.tolist()
            frame.advance(fake_logits(table, tokens, frame.count, len(block) + 1))
        key = tuple(frame.codes().tolist())
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi_squared_p_value(counts: dict, law: dict, draws: int) -> float:
    """Pearson's test of ``counts`` against ``law`` (cells expecting fewer than 5 pooled); its p-value."""
    assert set(counts) <= set(law), "a frame of probability zero was drawn"
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


@pytest.mark.parametrize("block_size", [2, P], ids=["block_2", "whole_frame"])
def test_speculative_frames_follow_the_sequential_law(table, exact_law, block_size, single_thread):
    p_value = chi_squared_p_value(speculative_frames(table, block_size, DRAWS), exact_law, DRAWS)
    assert p_value > ALPHA, p_value


def _resample_from_target(target: torch.Tensor, proposal: torch.Tensor) -> torch.Tensor:
    return target.clone()  # wrong: a rejected draft redrawn from p instead of (p - q)+


def _stale_proposals(real):
    """``verify_block`` that, wrongly, keeps the old proposal of a draft the coupling kept."""
    def wrong(drafts, draft_probs, logits, codebook_size, sampling, generator):
        verdict = real(drafts, draft_probs, logits, codebook_size, sampling, generator)
        start, count = len(verdict.tokens), min(len(verdict.drafts), len(drafts) - len(verdict.tokens))
        old = (torch.nn.functional.one_hot(drafts, V).float() if draft_probs is None else draft_probs)
        probs = verdict.draft_probs.clone()
        kept = verdict.drafts[:count] == drafts[start : start + count]
        probs[:count][kept] = old[start : start + count][kept]
        return dataclasses.replace(verdict, draft_probs=probs)
    return wrong


@pytest.mark.parametrize("rule", ["resample_from_target", "stale_proposals"])
def test_the_same_test_rejects_a_wrong_rule(table, exact_law, rule, monkeypatch, single_thread):
    if rule == "resample_from_target":
        monkeypatch.setattr(speculative, "residual", _resample_from_target)
    else:
        monkeypatch.setattr(speculative, "verify_block", _stale_proposals(speculative.verify_block))
    draws = DRAWS // 2
    p_value = chi_squared_p_value(speculative_frames(table, 2, draws), exact_law, draws)
    assert p_value < ALPHA, p_value


def test_greedy_verdict_keeps_the_argmax_prefix_then_corrects():
    logits = torch.full((4, 6), -5.0)
    logits[torch.arange(4), torch.tensor([3, 1, 0, 4])] = 5.0
    logits[:, 5] = 50.0  # a non-image id (the action placeholder) never wins
    verdict = verify_block(torch.tensor([3, 1, 2]), None, logits, 5, SamplingConfig(temperature=0), None)
    assert verdict.tokens.tolist() == [3, 1, 0] and verdict.num_accepted == 2
    assert verdict.drafts.tolist() == [4] and verdict.draft_probs is None
    ends = verify_block(torch.tensor([3, 1, 0]), None, logits[:3], 5, SamplingConfig(temperature=0), None)
    assert ends.tokens.tolist() == [3, 1, 0] and ends.num_accepted == 3 and not len(ends.drafts)  # no bonus row
    bonus = verify_block(torch.tensor([3, 1, 0]), None, logits, 5, SamplingConfig(temperature=0), None)
    assert bonus.tokens.tolist() == [3, 1, 0, 4] and bonus.num_accepted == 3


def test_a_draft_whose_distribution_did_not_change_is_kept():
    logits = torch.randn(7, V, generator=torch.Generator().manual_seed(1))
    probs = image_token_probs(logits, V, WARPED)
    drafts = torch.multinomial(probs[:6], 1, generator=torch.Generator().manual_seed(2))[:, 0]
    for seed in range(20):
        verdict = verify_block(drafts, probs[:6], logits, V, WARPED, torch.Generator().manual_seed(seed))
        assert verdict.num_accepted == 6 and verdict.tokens[:6].tolist() == drafts.tolist()
