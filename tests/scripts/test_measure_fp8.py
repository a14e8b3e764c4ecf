"""scripts/experiments/measure_fp8.py's arithmetic (its GPU run is the script's own; the CPU smoke run takes minutes of
vLLM's CPU engine and is not a test): the KL of two engines' listed log-probabilities is exact when they list every code
and a lower bound when they list the top few, it sees a difference of the target's size, and the interval covers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def fp8():
    return load_script("experiments/measure_fp8")


def distribution(rng: np.random.Generator, codes: int, sharpness: float) -> np.ndarray:
    logits = rng.normal(0, sharpness, codes)
    return logits - np.logaddexp.reduce(logits)


def listed(logp: np.ndarray, k: int) -> dict[int, float]:
    top = np.argsort(logp)[::-1][:k]
    return {int(c): float(logp[c]) for c in top}


def exact_kl(lp: np.ndarray, lq: np.ndarray) -> float:
    return float((np.exp(lp) * (lp - lq)).sum())


def test_kl_is_exact_with_every_code_and_a_lower_bound_with_the_top_k(fp8):
    """200 random pairs of 1024-code distributions, Q a perturbation of P: all codes listed, the KL equals numpy's
    to 1e-9; the top 64 listed, it never exceeds the exact KL and still holds most of it for peaked P."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        lp = distribution(rng, 1024, 3.0)
        lq = lp + rng.normal(0, 0.05, 1024)
        lq -= np.logaddexp.reduce(lq)
        exact = exact_kl(lp, lq)
        full, mass = fp8.kl_from_top(listed(lp, 1024), listed(lq, 1024))
        assert full == pytest.approx(exact, rel=1e-9, abs=1e-12) and mass == pytest.approx(1.0)
        bound, mass = fp8.kl_from_top(listed(lp, 64), listed(lq, 64))
        assert bound <= exact + 1e-12
        assert 0.3 * exact <= bound and mass > 0.5


def test_kl_sees_a_difference_of_the_targets_size(fp8):
    """Control: identical lists give 0; Q with every logit moved by noise of 0.2 gives KL of about 0.02 nats
    (0.2^2 / 2), above the 0.01 target; noise of 0.05 gives about 0.00125, below it."""
    rng = np.random.default_rng(1)
    lp = distribution(rng, 1024, 1.0)
    assert fp8.kl_from_top(listed(lp, 1024), listed(lp, 1024))[0] == 0.0
    for sigma, expected in ((0.2, 0.02), (0.05, 0.00125)):
        lq = lp + rng.normal(0, sigma, 1024)
        lq -= np.logaddexp.reduce(lq)
        kl = fp8.kl_from_top(listed(lp, 1024), listed(lq, 1024))[0]
        assert kl == pytest.approx(expected, rel=0.3)
        assert (kl > fp8.TARGET_KL) == (sigma == 0.2)


def test_bootstrap_interval_covers_the_mean(fp8):
    """Over 200 samples of 8 values from N(0.005, 0.002), the 95 % interval holds the true mean about 95 % of
    the time (percentile bootstrap is a little narrow at n=8: at least 80 %; false alarm under 1e-6 by binomial)."""
    rng = np.random.default_rng(2)
    hits = sum(lo <= 0.005 <= hi for lo, hi in (fp8.bootstrap_interval(rng.normal(0.005, 0.002, 8), seed=i)
                                                 for i in range(200)))
    assert hits >= 160
    assert fp8.bootstrap_interval(np.array([0.003])) == [0.003, 0.003]


def test_a_verdict_needs_the_exact_kl(fp8):
    """Two engines' runs whose per-position KL is ~0.00125 nats: with every code listed the exact KL's verdict is that
    the target is met; from the top few codes (a lower bound) the bound has no verdict, however small, and the
    report's verdict is the sampled estimate's; a setting 0.2 off fails the target."""
    rng = np.random.default_rng(3)

    def run(shift: float) -> dict:
        return {"codes": [np.zeros((2, 4), dtype=int)] * 4, "s_per_frame_one_rollout": 1.0,
                "frames_per_s_batch": 1.0, "startup_s": 1.0, "logprobs": [], "shift": shift,
                "sampled_codes": [np.zeros(7, dtype=int)] * 4}

    reference, close, far = run(0), run(0.05), run(0.2)
    for _ in range(4):  # rollouts of 6 positions
        positions = [distribution(rng, 256, 1.0) for _ in range(6)]
        for record in (reference, close, far):
            noisy = [lp + rng.normal(0, record["shift"], 256) if record["shift"] else lp for lp in positions]
            record["logprobs"].append([listed(lp - np.logaddexp.reduce(lp), 256) for lp in noisy])
    for record in (reference, close, far):
        record["sampled_logprobs"] = record["logprobs"]
    assert fp8.compare(reference, close, None, None, exact=True)["kl_nats"]["meets_target"] is True
    assert fp8.compare(reference, far, None, None, exact=True)["kl_nats"]["meets_target"] is False
    listed_only = fp8.compare(reference, close, None, None, exact=False)
    assert listed_only["kl_nats"]["meets_target"] is None
    assert listed_only["meets_target"] == listed_only["kl_sampled_nats"]["meets_target"]


def test_the_sampled_estimate_is_unbiased_and_greedy_tokens_are_not(fp8):
    """The sampled KL's 95 % interval covers the mean exact KL of 1024-code distributions (only the top 16 codes and
    the token listed, as vLLM lists them for Terra's codebook) in at least 48 of 60 runs of 8 rollouts x 64
    positions (90 % seen: percentile bootstrap at n=8 runs a little narrow; a correct estimator covering 90 % falls
    below 48 with probability ~0.5 %, and the seeds are fixed); the same estimator fed each position's most likely
    token instead of a sampled one (a wrong implementation) covers it in at most 20."""
    rng = np.random.default_rng(4)
    codes = 1024

    def rollouts(pick):
        exact, ref, oth, toks = [], [], [], []
        for _ in range(8):
            r, o, t = [], [], []
            for _ in range(64):
                lp = distribution(rng, codes, 2.0)
                lq = lp + rng.normal(0, 0.15, codes)
                lq -= np.logaddexp.reduce(lq)
                exact.append(exact_kl(lp, lq))
                x = pick(lp)
                r.append({**listed(lp, 16), x: float(lp[x])})
                o.append({**listed(lq, 16), x: float(lq[x])})
                t.append(x)
            ref.append(r), oth.append(o), toks.append(np.array(t + [0]))  # the last token has no position
        return np.mean(exact), fp8.sampled_kl(ref, oth, toks)

    covered = wrong = 0
    for run in range(60):
        truth, sampled = rollouts(lambda lp: int(rng.choice(codes, p=np.exp(lp) / np.exp(lp).sum())))
        lo, hi = fp8.bootstrap_interval(sampled, seed=run)
        covered += lo <= truth <= hi
        truth, greedy = rollouts(lambda lp: int(np.argmax(lp)))
        lo, hi = fp8.bootstrap_interval(greedy, seed=run)
        wrong += lo <= truth <= hi
    assert covered >= 48 and wrong <= 20
