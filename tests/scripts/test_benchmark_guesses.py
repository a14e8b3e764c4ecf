"""scripts/benchmark_guesses.py on the demo model: every source's codes are sequential decoding's, and the oracle
ceiling sees its guesses (a frame guessed right takes one pass)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script


def test_guess_benchmark_measures_each_source_on_manoeuvres_and_a_closed_loop_drive(tmp_path, single_thread):
    bench = load_script("benchmark_guesses")
    out = tmp_path / "guesses.json"
    result = bench.main(["--frames", "1", "--manoeuvres", "curve_left", "--drive-seconds", "0.2",
                         "--temperatures", "0.9", "--draft-tokens", "frame", "--sources", "previous,transitions",
                         "--oracle-shares", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    previous, transitions, oracle = result["records"]
    assert [r["source"] for r in result["records"]] == ["previous", "transitions", "oracle_1"]
    assert list(previous["rollouts"]) == ["curve_left", "closed_loop_0.2s"]
    assert all(r["codes_equal_sequential"] and r["draft_tokens"] == 144 for r in result["records"])
    assert oracle["rollouts"] == {"curve_left": 1.0, "closed_loop_0.2s": 1.0}  # every guess right: one pass
    assert previous["per_frame"] > 1 and transitions["guess_ms_per_frame"] > 0
    with pytest.raises(SystemExit):
        bench.parse_args(["--sources", "previous,nearest"])
