"""What a drive's measurement makes once: the odometry of a frame shown again (a stalled world, the same step's frame in
the world and in the truth) is made once and is the same motion to the last bit (terra/fidelity/odometry.py,
``estimate_series``), and the temporal lag's squared differences are the exact sums (terra/fidelity/agreement.py)."""

from __future__ import annotations

import numpy as np
import pytest

from terra.fidelity import odometry
from terra.fidelity.agreement import _lagged_squares
from tests.fidelity.drives import frozen, weaving_drive

STEPS = 12


@pytest.fixture(scope="module")
def frames():
    return weaving_drive(4, STEPS)[2]  # [STEPS + 1, H, W, 3] true renders


def counted(monkeypatch) -> list:
    """The motions estimated from now on (the odometry's pair estimate, wrapped)."""
    calls, motion = [], odometry._motion
    monkeypatch.setattr(odometry, "_motion", lambda *args: calls.append(args) or motion(*args))
    return calls


def as_numbers(motions) -> bytes:
    return np.array([np.nan * np.ones(5) if m is None else (m.dx, m.dy, m.dyaw, m.match, m.cells)
                     for m in motions]).tobytes()


def test_a_series_of_frames_shown_again_is_estimated_once_and_the_same(frames, monkeypatch):
    stalled = frames.copy()
    stalled[3::3] = stalled[2::3][:len(stalled[3::3])]  # every third frame the one before again
    alone = [odometry.estimate_motions(f) for f in (frames, stalled, frozen(frames))]
    calls = counted(monkeypatch)
    world, truth = odometry.estimate_series([stalled, frames])
    assert as_numbers(world) == as_numbers(alone[1]) and as_numbers(truth) == as_numbers(alone[0])
    shared = sum(1 for t in range(STEPS) if (stalled[t:t + 2] == frames[t:t + 2]).all())
    assert 0 < shared < STEPS and len(calls) == 2 * STEPS - shared  # a pair both series show: once
    calls.clear()
    [still] = odometry.estimate_series([frozen(frames)])
    assert as_numbers(still) == as_numbers(alone[2]) and len(calls) == 1  # one frame throughout: one estimate


def test_the_temporal_lags_squares_are_the_exact_sums(frames):
    world, truth = frames[1:].reshape(STEPS, -1), frames[1:, :, ::-1].reshape(STEPS, -1)
    squares = _lagged_squares(world, truth, 4, block=5)  # blocks that end inside the drive
    for t in range(STEPS):
        for k in range(-4, 5):
            if 0 <= t - k < STEPS:
                assert squares[t, k + 4] == np.sum((world[t].astype(np.int64) - truth[t - k]) ** 2)
            else:
                assert np.isnan(squares[t, k + 4])
