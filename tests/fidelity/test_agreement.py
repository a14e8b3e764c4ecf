"""Perception agreement, frame fidelity and the temporal lag against the true renders at the same poses, on the true
frames themselves (perfect agreement) and on broken worlds made from them (frozen, gray, mirrored, a second late)."""

from __future__ import annotations

import numpy as np
import pytest

from terra.fidelity.agreement import (HORIZONS, MAX_LAG, frame_fidelity, horizon_summary, lag_summary,
                                      lane_agreement, lane_reading, lane_summary, temporal_lag)
from terra.fidelity.agreement import frame_changes, repeated
from terra.stats import FAIL, PASS, Bootstrap, decide
from terra.metrics import PSNR_CAP_DB
from tests.fidelity.drives import frozen, gray, late, mirrored, weaving_drive

STEPS = 40
SLOPE_BAND = (0.8, 1.2)
BOOT = Bootstrap(draws=500)
WORLDS = {"faithful": lambda f: f, "frozen": frozen, "gray": gray, "mirrored": mirrored,
          "late": lambda f: late(f, 10)}


@pytest.fixture(scope="module")
def drives():
    """Two drives: the true frames after the start (horizons 1..STEPS) and each world's frames at the same poses."""
    out = []
    for seed in (4, 9):
        _, _, frames = weaving_drive(seed, STEPS)
        out.append({name: np.ascontiguousarray(make(frames)[1:]) for name, make in WORLDS.items()} | {
            "truth": frames[1:]})
    return out


@pytest.fixture(scope="module")
def lanes(drives):
    return {name: lane_summary([lane_agreement(d[name], d["truth"]) for d in drives], ["a", "b"], BOOT)
            for name in WORLDS}


def test_the_true_frames_agree_perfectly(drives, lanes):
    lane = lanes["faithful"]
    assert lane.slope.estimate == pytest.approx(1.0) and lane.mean_abs_error_m.high == 0.0
    assert lane.found_world.low == 1.0 and decide(lane.slope, SLOPE_BAND) == PASS
    fidelity = frame_fidelity(drives[0]["faithful"], drives[0]["truth"])
    assert set(fidelity) == set(HORIZONS) - {h for h in HORIZONS if h > STEPS}
    assert all(v == {"psnr_db": PSNR_CAP_DB, "ssim": pytest.approx(1.0)} for v in fidelity.values())
    lag = temporal_lag(drives[0]["faithful"], drives[0]["truth"])
    assert lag.lag == 0 and lag.curve[MAX_LAG] == PSNR_CAP_DB and len(lag.lags) == 2 * MAX_LAG + 1


def test_broken_worlds_are_caught_by_the_lane_reading(lanes):
    """Frozen: the lane never moves (slope 0 within each drive); mirrored: the reading is negated (slope -1); gray:
    no lane is ever found; a second late: the reading lags the car (slope -0.1 on these weaving drives)."""
    assert abs(lanes["frozen"].slope.estimate) < 0.05 and decide(lanes["frozen"].slope, SLOPE_BAND) == FAIL
    assert lanes["mirrored"].slope.estimate == pytest.approx(-1.0, abs=0.05)
    assert decide(lanes["mirrored"].slope, SLOPE_BAND) == FAIL
    assert lanes["gray"].found_world.high == 0.0 and lanes["gray"].found_truth.low == 1.0
    assert decide(lanes["gray"].found_world, (0.9, 1.0)) == FAIL
    assert np.isnan(lanes["gray"].slope.estimate) and decide(lanes["gray"].slope, SLOPE_BAND) != PASS
    assert decide(lanes["late"].slope, SLOPE_BAND) == FAIL and lanes["late"].mean_abs_error_m.low > 0.3
    assert lanes["late"].as_dict()["frames"] == 2 * STEPS


def test_the_temporal_lag_of_broken_worlds(drives):
    """A second late: lag 10 in every drive and in the summary; the true frames: 0. A frozen world matches no
    moment of the drive much better than another: its curve is flat (under 1 dB from best to median), so its lag
    (15 on one drive, 1 on the other) means nothing, and the lag is no test of it."""
    def summary(name):
        return lag_summary([temporal_lag(d[name], d["truth"]) for d in drives], ["a", "b"], BOOT)

    delayed = summary("late")
    assert (delayed.estimate, delayed.low, delayed.high) == (10, 10, 10)
    assert decide(summary("faithful"), (0, 0)) == PASS
    assert decide(delayed, (0, 0)) == FAIL
    for d in drives:
        assert temporal_lag(d["frozen"], d["truth"]).prominence_db < 1.0
        assert temporal_lag(d["faithful"], d["truth"]).prominence_db > 50.0


def test_frame_fidelity_by_horizon(drives):
    per_drive = [frame_fidelity(d["frozen"], d["truth"]) for d in drives]
    summary = horizon_summary(per_drive, ["a", "b"], BOOT)
    assert set(summary) == {1, 5, 10, 20}
    assert 10.0 < summary[20]["psnr_db"].estimate < summary[1]["psnr_db"].estimate  # the car moves away from it
    assert summary[1]["ssim"].estimate < 1.0
    assert frame_fidelity(drives[0]["truth"][:3], drives[0]["truth"][:3]).keys() == {1}
    uneven = horizon_summary([per_drive[0], {1: per_drive[1][1]}], ["a", "b"], BOOT)
    assert uneven[20]["psnr_db"].estimate == per_drive[0][20]["psnr_db"]  # only the drive that reaches it


def test_bad_inputs_are_named(drives):
    truth = drives[0]["truth"]
    with pytest.raises(ValueError, match="both be \\[T, H, W, 3\\]"):
        lane_agreement(truth[:5], truth[:4])
    with pytest.raises(ValueError, match="too short"):
        temporal_lag(truth[:22], truth[:22])
    assert temporal_lag(truth[:23], truth[:23]).lag == 0
    with pytest.raises(ValueError, match="one cluster label per drive"):
        lane_summary([], [])
    assert np.isnan(lane_reading(np.full_like(truth[0], 128)))


def test_a_repeated_frame_is_one_that_changed_far_less_than_the_true_frame():
    frames = np.zeros((6, 8, 8, 3), np.uint8)
    for k in range(6):
        frames[k, :, k] = 200  # a bar that moves a column a step
    truth = frame_changes(frames)
    assert truth.shape == (5,) and (truth > 0).all()
    stutter = frames.copy()
    stutter[3] = stutter[2]  # the third step shows its frame again
    world = frame_changes(stutter)
    moving = np.array([0.8, 0.8, 0.8, 0.8, 0.1])  # the last step hardly moves the car: not judged
    found = repeated(world, truth, moving)
    assert found[:4].tolist() == [0.0, 0.0, 1.0, 0.0] and np.isnan(found[4])
    assert np.isnan(repeated(world, np.zeros(5), moving)).all()  # a truth that does not change: nothing to repeat
