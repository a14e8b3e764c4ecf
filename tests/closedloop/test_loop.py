"""The driving loop on the true world's frames (fast, no model): bad policies end their own drive with
one reason, a drive along the lane centre has zero lane offset, a recorded run resumes without repeating a drive."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from terra.closedloop.loop import DriveSpec, run_drives
from terra.closedloop.car.motion import VEHICLES, action_of
from terra.closedloop.policies.builtin import reference_policy
from terra.closedloop.recording.files import metrics_of
from terra.closedloop.recording.run import RunSettings
from terra.closedloop.scenarios import command_of, synthetic_scenarios
from terra.closedloop.worlds import TrueWorld
from terra.contract.actions import ACTION_TIMES
from terra.sim.renderer import render
from tests.closedloop.conftest import LaneCentre, drive_and_record

SIZE = (72, 128)




class Broken:
    """Fails as told at step 2: raise, hang (until released), NaN, wrong shape."""

    def __init__(self, how: str, release: threading.Event):
        self.name, self.how, self.release = f"broken_{how}", how, release

    def reset(self, scenario):
        pass

    def plan(self, obs):
        good = np.c_[8.0 * 0.5 * np.arange(1, 9), np.zeros((8, 2))]
        if obs.step < 2:
            return good
        if self.how == "raise":
            raise RuntimeError("boom")
        if self.how == "hang":
            self.release.wait()
            return good
        if self.how == "nan":
            good[3, 1] = np.nan
            return good
        return np.zeros((5, 7))

    def close(self):
        pass


@pytest.fixture(scope="module")
def scenarios():
    return synthetic_scenarios(2, 11, SIZE)


@pytest.mark.parametrize("vehicle, progress", [("bicycle", 23.87), ("exact", 24.0)])
def test_a_drive_along_the_lane_centre_has_zero_lane_offset(scenarios, vehicle, progress):
    """The exact vehicle drives the plans' 8 m/s from the first frame; the bicycle speeds up to it from the
    scenario's 7.65 m/s (0.13 m less in 3 s), both within 1 cm of the lane's centre."""
    [drive] = run_drives(TrueWorld(SIZE), [DriveSpec(scenarios[0], "lane_centre", LaneCentre)], 30, vehicle=vehicle)
    truth = metrics_of(drive)["truth"]
    assert drive.ok and drive.steps == 30
    assert truth["max_abs_lane_offset_m"] < 0.01 and truth["time_in_lane"] == 1.0
    assert truth["progress_along_road_m"] == pytest.approx(progress, abs=0.02)


@pytest.mark.parametrize("vehicle", VEHICLES)
def test_the_world_model_is_shown_the_motion_the_true_world_renders(scenarios, vehicle):
    """A drive's actions are its vehicle's forecasts and its poses its vehicle's steps (a fresh vehicle given the
    recorded plans makes both again), and the true world's frames are rendered at those poses."""
    [drive] = run_drives(TrueWorld(SIZE), [DriveSpec(scenarios[1], "lane_follower",
                                                     reference_policy("lane_follower"))], 6, vehicle=vehicle)
    car = VEHICLES[vehicle](scenarios[1].speed_kmh / 3.6)
    for k, plan in enumerate(drive.plans):
        np.testing.assert_array_equal(drive.actions[k], action_of(car.forecast(plan, ACTION_TIMES)))
        np.testing.assert_array_equal(drive.poses[k + 1], car.step(plan))
        assert drive.speeds[k + 1] == car.speed
    for frame, pose in zip(drive.frames[drive.num_context:], drive.world_poses()[1:]):
        np.testing.assert_array_equal(frame, render(scenarios[1].scene, pose, *SIZE))


class Watcher(LaneCentre):
    """The lane centre's plans, keeping every observation it was handed."""

    def reset(self, scenario):
        super().reset(scenario)
        self.seen = []

    def plan(self, obs):
        self.seen.append(obs)
        return super().plan(obs)


def test_a_policy_sees_the_route_ahead_of_the_newest_frames_pose(scenarios):
    """Each step's route (and the command read from it) is the scenario's route at the world pose of the drive's
    newest frame, its pose in the observation the ego frame's origin at that pose."""
    watcher = Watcher()
    [drive] = run_drives(TrueWorld(SIZE), [DriveSpec(scenarios[1], "watcher", lambda: watcher)], 12)
    world = drive.world_poses()
    assert drive.ok and len(watcher.seen) == 12
    for k, obs in enumerate(watcher.seen):
        np.testing.assert_array_equal(obs.route, scenarios[1].route(world[k]))
        np.testing.assert_array_equal(obs.pose, drive.poses[k])
        assert obs.ego.command == command_of(obs.route)


def test_bad_policies_end_their_own_drive_with_one_reason(scenarios):
    release = threading.Event()
    specs = [DriveSpec(scenarios[0], f"broken_{how}", lambda how=how: Broken(how, release))
             for how in ("raise", "hang", "nan", "shape")]
    specs.append(DriveSpec(scenarios[0], "lane_follower", reference_policy("lane_follower")))
    specs.append(DriveSpec(scenarios[1], "missing", lambda: (_ for _ in ()).throw(ValueError("no such policy"))))
    try:
        drives = {d.spec.policy: d for d in run_drives(TrueWorld(SIZE), specs, 5, policy_timeout_s=2.0)}
    finally:
        release.set()
    assert drives["lane_follower"].ok and drives["lane_follower"].steps == 5
    expected = {"broken_raise": "policy broken_raise failed in plan at step 2: RuntimeError: boom",
                "broken_hang": "policy broken_hang timed out after 2 s in plan at step 2",
                "broken_nan": "bad plan at step 2: plan pose 3 is (",
                "broken_shape": "bad plan at step 2: a plan array must be [6, 3]"}
    for name, text in expected.items():
        drive = drives[name]
        assert drive.stage == "policy" and text in drive.error and drive.steps == 2, (name, drive.error)
        assert len(drive.frames) == drive.num_context + 2
    assert drives["missing"].stage == "setup" and "no such policy" in drives["missing"].error


def test_recorded_run_resumes_without_repeating_a_drive(scenarios, tmp_path):
    calls = []

    class Counting(LaneCentre):
        def reset(self, scenario):
            calls.append(scenario.id)
            super().reset(scenario)

    specs = [DriveSpec(s, "lane_centre", Counting) for s in scenarios]
    settings = RunSettings(tmp_path / "run", num_steps=4, progress=False)
    first = drive_and_record(TrueWorld(SIZE), specs[:1], settings)
    assert first.counts == {"ok": 1, "failed": 0, "skipped": 0} and len(calls) == 1
    second = drive_and_record(TrueWorld(SIZE), specs, settings)
    assert second.counts == {"ok": 1, "failed": 0, "skipped": 1} and len(calls) == 2
    assert calls == [s.id for s in scenarios]
    record = json.loads((tmp_path / "run" / f"{specs[1].id}.json").read_text())
    assert record["status"] == "ok" and record["steps"] == 4 and len(record["plans"]) == 4
    assert len(record["poses"]) == 5 and record["metrics"]["truth"]["time_in_lane"] == 1.0
    assert (tmp_path / "run" / f"{specs[1].id}.mp4").stat().st_size > 0
    manifest = [json.loads(line) for line in (tmp_path / "run" / "manifest.jsonl").read_text().splitlines()]
    assert sorted(r["status"] for r in manifest) == ["ok", "skipped"]
    assert record["vehicle"] == "bicycle"
    exact = drive_and_record(TrueWorld(SIZE), specs, replace(settings, vehicle="exact"))  # another fingerprint
    assert exact.counts == {"ok": 2, "failed": 0, "skipped": 0} and len(calls) == 4
    assert json.loads((tmp_path / "run" / f"{specs[1].id}.json").read_text())["vehicle"] == "exact"


class Sleeper(LaneCentre):
    """A policy that holds the GIL (``gil_bound``), each plan taking ``sleep_s``; at step ``hang_at`` it waits until
    ``release`` is set instead. It notes the thread of every plan and whether two ever overlapped."""

    gil_bound = True
    running = 0
    overlapped = False
    threads: set = set()

    def __init__(self, sleep_s: float, hang_at: int = -1, release: threading.Event | None = None) -> None:
        self.sleep_s, self.hang_at, self.release = sleep_s, hang_at, release

    def plan(self, obs):
        Sleeper.threads.add(threading.current_thread().ident)
        if obs.step == self.hang_at:
            self.release.wait()
            return super().plan(obs)
        Sleeper.running += 1
        Sleeper.overlapped |= Sleeper.running > 1
        time.sleep(self.sleep_s)
        Sleeper.running -= 1
        return super().plan(obs)


def test_policies_that_hold_the_gil_plan_one_after_another_each_within_its_own_deadline(scenarios):
    """Three plans of 0.4 s a step under a 1 s deadline: one after another they take 1.2 s, so a deadline counted
    from the step's start would fail the third. A plan that hangs is left behind and the plans after it go on."""
    release = threading.Event()
    specs = [DriveSpec(scenarios[0], "slow_a", lambda: Sleeper(0.4)),
             DriveSpec(scenarios[1], "hangs", lambda: Sleeper(0.01, hang_at=1, release=release)),
             DriveSpec(scenarios[0], "slow_b", lambda: Sleeper(0.4)),
             DriveSpec(scenarios[1], "slow_c", lambda: Sleeper(0.4))]
    try:
        drives = {d.spec.policy: d for d in run_drives(TrueWorld(SIZE), specs, 3, policy_timeout_s=1.0)}
    finally:
        release.set()
    assert {name: d.steps for name, d in drives.items()} == {"slow_a": 3, "hangs": 1, "slow_b": 3, "slow_c": 3}
    assert drives["hangs"].error == "policy hangs timed out after 1 s in plan at step 1"
    assert all(d.ok for name, d in drives.items() if name != "hangs")
    assert not Sleeper.overlapped and len(Sleeper.threads) >= 2  # never at once; a new thread after the hang
