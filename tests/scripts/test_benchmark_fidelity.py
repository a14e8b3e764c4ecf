"""Smoke test of scripts/bench/benchmark_fidelity.py: a few pairs and a short drive, the JSON it writes, bad
arguments."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import load_script


def test_the_fidelity_benchmark_measures_and_writes(tmp_path, monkeypatch, capsys):
    script = load_script("bench/benchmark_fidelity")
    out = tmp_path / "fidelity.json"
    monkeypatch.setattr(sys, "argv", ["benchmark_fidelity", "--pairs", "2", "--domains", "day,night", "--frames",
                                      "23", "--out", str(out)])
    script.main()
    result = json.loads(out.read_text())
    day, night = result["accuracy"]["day"], result["accuracy"]["night"]
    assert day["refused"] == 0 and day["dx"]["median_abs"] < 0.1 and "gain" in day["dyaw"] and "gain" not in day["dy"]
    assert night["refused"] == 2 and "dx" not in night  # night frames are refused
    assert set(result["cpu_ms_per_frame"]) == {"odometry", "lane_agreement", "temporal_lag", "psnr_ssim"}
    assert "night: 2 pairs, all refused" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["benchmark_fidelity", "--domains", "dusk"])
    with pytest.raises(SystemExit) as exit_:
        script.main()
    assert exit_.value.code == 2 and "argument --domains: a comma list whose every item takes one of day" in \
        capsys.readouterr().err
