"""scripts/bench/benchmark_guesses.py on the demo model: every source's codes are sequential decoding's, each source's
guessing and the whole decode are timed, and the oracle ceiling sees its guesses (a frame guessed right takes one
pass); its warp experiment (scripts/bench/lib/first_guesses.py) moves the previous frame the way the ego motion moves
the view."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.conftest import SCRIPTS, load_script

if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))
from bench.lib.first_guesses import frame_grid, frame_motion, warp_index  # noqa: E402


def action(left: float, forward: float) -> np.ndarray:
    """An action whose path's first point (0.45 s ahead) is ``forward`` m ahead and ``left`` m to the left."""
    return np.array([[left * (k + 1), forward * (k + 1), 0.45 + 0.5 * k] for k in range(6)], dtype=np.float32)


def test_guess_benchmark_measures_each_source_on_manoeuvres_and_a_closed_loop_drive(tmp_path, single_thread):
    bench = load_script("bench/benchmark_guesses")
    out = tmp_path / "guesses.json"
    result = bench.main(["--frames", "2", "--manoeuvres", "curve_left", "--drive-seconds", "0.2",
                         "--temperatures", "0.9", "--draft-tokens", "frame", "--sources",
                         "previous,transitions,lookahead,warp", "--oracle-shares", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    previous, transitions, lookahead, warp, oracle = result["records"]
    assert [r["source"] for r in result["records"]] == ["previous", "transitions", "lookahead", "warp", "oracle_1"]
    assert list(previous["rollouts"]) == ["curve_left", "closed_loop_0.2s"]
    assert all(r["codes_equal_sequential"] and r["draft_tokens"] == 144 for r in result["records"])
    assert oracle["rollouts"] == {"curve_left": 1.0, "closed_loop_0.2s": 1.0}  # every guess right: one pass
    [live] = result["live_drives"]  # the drive as it ran, in a session under the default guesses
    assert live["source"] == "lookahead" and 1 <= live["passes_per_frame"] < 144
    assert previous["per_frame"] > 1 and min(r["guess_ms_per_frame"] for r in (transitions, warp)) > 0
    assert lookahead["guess_ms_per_frame"] > previous["guess_ms_per_frame"]  # its draws past the frame, on the clock
    assert all(r["cpu_s_per_frame"] > 0 for r in result["records"])
    assert oracle["first_guesses_right"] == 1 and 0 < previous["first_guesses_right"] < 1
    with pytest.raises(SystemExit):
        bench.parse_args(["--sources", "previous,nearest"])


def test_frame_grid_follows_the_camera_aspect():
    assert frame_grid(144) == (9, 16) and frame_grid(576) == (18, 32) and frame_grid(64) == (8, 8)


def test_frame_motion_scales_the_path_to_one_frame():
    forward, left, yaw = frame_motion(action(0.0, 4.5))
    assert forward == pytest.approx(1.0) and left == 0 and yaw == 0  # 4.5 m in 0.45 s: 1 m a frame
    forward, left, yaw = frame_motion(action(0.5, 4.5))
    assert yaw > 0 and left > 0 and forward == pytest.approx(1.0, abs=0.02)  # a left turn
    assert frame_motion(action(0.0, 0.0)) == (0.0, 0.0, 0.0)  # standing still


def test_warp_without_motion_is_the_identity():
    np.testing.assert_array_equal(warp_index(9, 16, (0.0, 0.0, 0.0)), np.arange(144))


def test_warp_flows_the_road_down_and_turns_shift_the_view():
    rows, columns = 9, 16
    ahead = warp_index(rows, columns, (3.0, 0.0, 0.0)).reshape(rows, columns) // columns
    assert (ahead[-1] < rows - 1).all()  # the bottom row's road was further ahead: a row up before
    assert (ahead[:3] == np.arange(3)[:, None]).all()  # the sky does not move when driving straight on
    column = warp_index(rows, columns, (0.0, 0.0, 0.15)).reshape(rows, columns) % columns
    assert (column[0, 4:] < np.arange(4, columns)).all()  # turning left: what is seen now was further left
