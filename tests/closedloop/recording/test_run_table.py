"""The table terra-drive ends with (terra/closedloop/recording/drives.py): per world and policy what the drives' JSON
files measured, failed drives counted apart, ``-`` where nothing was measured."""

from __future__ import annotations

from terra.closedloop.recording.drives import HEADER, run_table
from terra.stats import Bootstrap


def content(scenario: str, policy: str, status: str = "ok", score: float = 1.0, distance: float = 10.0,
            in_lane: float = 1.0, off_road: bool = False, truth: bool = True) -> dict:
    """A drive's JSON content with the keys the table reads (terra/closedloop/recording/files.py)."""
    metrics = {"progress": {"distance_m": distance}, "history_comfort": {"comfortable": True}}
    if truth:
        metrics["truth"] = {"time_in_lane": in_lane, "off_road": off_road, "collision": False}
        metrics["alpasim"] = {"score": score, "failure_reason": None if score else "offroad"} | {
            name: 0.0 for name in ("collision_any", "collision_at_fault", "offroad", "wrong_lane", "progress",
                                   "progress_rel", "dist_to_gt_trajectory", "duration_frac_20s")}
    return {"scenario": scenario, "policy": policy, "status": status, "metrics": metrics}


def test_a_row_per_world_and_policy_with_what_its_drives_measured() -> None:
    model = [content("s0", "lane_follower", score=1.0, distance=12.0, in_lane=0.9),
             content("s1", "lane_follower", score=0.0, distance=8.0, in_lane=0.5, off_road=True),
             content("s0", "constant_speed"), content("s1", "constant_speed", status="failed", score=0.0)]
    logs = [content("clip", "lane_follower", truth=False)]
    lines = run_table({"model": model, "logs": logs}, Bootstrap(draws=50))
    assert lines[0].split()[:3] == list(HEADER[:3])
    rows = [line.split() for line in lines[1:4]]
    assert rows[0][:4] == ["model", "lane_follower", "2", "ok"]
    assert rows[0][4] == "0.50" and rows[0][-5:] == ["10.0", "70%", "1/2", "0/2", "2/2"]  # means, counts of 2
    assert rows[1][:6] == ["model", "constant_speed", "1", "ok,", "1", "failed"]  # the failed drive scores 0
    assert rows[1][6] == "0.50" and rows[1][-3:] == ["0/1", "0/1", "1/1"]  # its metrics are not counted
    assert rows[2] == ["logs", "lane_follower", "1", "ok", "-", "10.0", "-", "-", "-", "1/1"]  # no ground truth
    assert lines[-2].startswith("scene score:") and lines[-1].startswith("in lane:")


def test_columns_line_up_and_no_drive_is_no_table() -> None:
    lines = run_table({"truth": [content("s0", "a_very_long_policy_name"), content("s0", "b")]})[:3]
    assert len({len(line) for line in lines}) == 1  # every number right-aligned under its header
    assert run_table({"model": []}) == []
