"""scripts/recipes/retrain_lane_routes.sh refuses, in one line and before any stage, a missing or existing output
folder, a work folder it did not make and a setting that is not a number (its end-to-end run on the CPU, ``SMOKE=1``,
takes minutes: run by hand)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "recipes" / "retrain_lane_routes.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                          text=True, timeout=60)


def test_a_bad_call_is_one_line_and_exit_2_before_any_stage(tmp_path):
    existing = tmp_path / "out"
    existing.mkdir()
    for args, env, text in (((), {}, "give the folder to export the retrained model into"),
                            ((str(existing),), {}, "already exists; give a new folder"),
                            ((str(tmp_path / "new"),), {"WM_STEPS": "many"}, "WM_STEPS=many is not a whole number"),
                            ((str(tmp_path / "new"),), {"MINUTES": "0"}, "MINUTES=0 is not a number of minutes"),
                            ((str(tmp_path / "new"),), {"RUN": str(existing)}, "is not this recipe's work folder")):
        done = run(*args, **{"RUN": str(tmp_path / "run"), **env})
        assert done.returncode == 2 and done.stdout == "", (args, done.stdout)
        assert len(done.stderr.splitlines()) == 1 and text in done.stderr, done.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "new").exists() and not any(existing.iterdir())
