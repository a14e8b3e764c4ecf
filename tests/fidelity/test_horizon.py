"""The fidelity horizon (terra/fidelity/horizon.py): which frames depart from the truth, when a drive's road departs
(a moment of departed frames, not one), and the survival curve over drives with its quantiles and intervals, censored
drives counted while they last."""

from __future__ import annotations

import numpy as np
import pytest

from terra.fidelity.agreement import LaneAgreement
from terra.fidelity.following import Following
from terra.fidelity.horizon import (
    DEPARTURE_LANE_M, MOMENT_STEPS, DriveHorizon, departed_frames, departure_frame, drive_horizon, survival,
)
from terra.stats import Bootstrap

STEPS = 40


def drive(lane_error: np.ndarray | float = 0.0, speed_share: np.ndarray | float = 1.0, lost: slice = slice(0, 0)):
    """A drive's lane readings and following: the world's lane ``lane_error`` m off the truth's, its forward motion
    ``speed_share`` of the commanded 0.8 m a step, no lane in the world's frames at ``lost``."""
    truth = np.linspace(-0.3, 0.3, STEPS)
    world = truth + lane_error
    world[lost] = np.nan
    commanded = np.tile([0.8, 0.0, 0.0], (STEPS, 1))
    recovered = commanded * np.c_[np.broadcast_to(speed_share, (STEPS,)), np.ones(STEPS), np.ones(STEPS)]
    return LaneAgreement(world, truth), Following(commanded, recovered, np.ones(STEPS))


def test_a_faithful_drive_never_departs_and_a_frozen_or_blank_one_at_once():
    assert not departed_frames(*drive(0.1)).any()  # within the jittered truth's reach
    assert drive_horizon(*drive(0.1)) == DriveHorizon(STEPS, None)
    assert drive_horizon(*drive(0.1)).seconds == pytest.approx(4.0)  # censored at the drive's end
    frozen = drive(speed_share=0.0)
    assert departed_frames(*frozen).all() and drive_horizon(*frozen).departure == 0
    assert drive_horizon(*frozen).seconds == pytest.approx(0.1)
    blank = drive(lost=slice(None))  # no lane where the truth shows one
    assert drive_horizon(*blank).departure == 0


def test_a_road_departs_after_a_moment_not_at_a_glitch():
    error = np.zeros(STEPS)
    error[5] = 2.0  # one misread frame
    error[10:13] = 1.0  # three
    error[20:] = DEPARTURE_LANE_M + 0.05  # from frame 20 on
    found = drive_horizon(*drive(error))
    assert found.departure == 20 and found.seconds == pytest.approx(2.1)
    stutter = np.ones(STEPS)
    stutter[4::5], stutter[5::5] = 0.0, 2.0  # every fifth frame repeated: its steps stall and catch up
    assert drive_horizon(*drive(speed_share=stutter)).departure is None
    assert drive_horizon(*drive(speed_share=0.9)).departure is None  # a speed error is the gain's to see
    assert departure_frame(np.r_[np.ones(MOMENT_STEPS - 1), 0, np.ones(MOMENT_STEPS)]) == MOMENT_STEPS


def test_the_survival_curve_counts_censored_drives_while_they_last():
    # 8 scenarios: in each, drives departing at 1.0 s and 3.0 s and one censored at 2.0 s
    horizons, scenarios = [], []
    for s in range(8):
        horizons += [DriveHorizon(40, 9), DriveHorizon(40, 29), DriveHorizon(20, None)]
        scenarios += [s] * 3
    found = survival(horizons, scenarios, Bootstrap(draws=200))
    # Kaplan-Meier: after 1 s 2/3 survive; the censored third leaves the risk set at 2 s; at 3 s the rest depart
    assert found.curve[9] == pytest.approx(2 / 3) and found.curve[28] == pytest.approx(2 / 3)
    assert found.curve[29] == pytest.approx(0.0)
    assert found.median.estimate == pytest.approx(3.0) and found.p10.estimate == pytest.approx(1.0)
    assert found.median.low == pytest.approx(3.0) and found.median.high == pytest.approx(3.0)  # every scenario alike
    assert (found.drives, found.departed, found.scenarios, found.longest_s) == (24, 16, 8, 4.0)


def test_a_quantile_beyond_the_drives_is_at_least_their_length_and_its_interval_reaches_it():
    rng = np.random.default_rng(3)
    horizons = [DriveHorizon(25, int(rng.integers(0, 25)) if rng.random() < 0.3 else None) for _ in range(40)]
    found = survival(horizons, [k // 4 for k in range(40)], Bootstrap(draws=500))
    assert found.median.estimate == np.inf and found.median.high == np.inf  # fewer than half departed
    assert np.isfinite(found.p10.estimate) and found.p10.low <= found.p10.estimate <= found.p10.high
    with pytest.raises(ValueError, match="one scenario label per drive"):
        survival(horizons, [0])
