"""scripts/experiments/measure_decoding.py, the thin wrapper over terra/evaluation/decoding.py (tested there): its
command line becomes the checked settings, and it writes the report."""

from __future__ import annotations

import json

import pytest

from terra.config.assets import demo_checkpoints
from tests.conftest import load_script
from tests.evaluation.test_decoding import pair  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def measure():
    return load_script("experiments/measure_decoding")


def test_the_command_line_runs_the_measurement(measure, pair, tmp_path, single_thread, capsys):  # noqa: F811
    out = tmp_path / "decoding.json"
    measure.main(["--world-model", str(pair / "world_model"), "--tokenizer", str(pair / "tokenizer"), "--out",
                  str(out), "--rollouts", "1", "--context", "2", "--frames", "1", "--device", "cpu",
                  "--temperatures", "0.9", "--speculative", "decoding=speculative,draft_tokens=8"])
    report = json.loads(out.read_text())
    assert [(m["mode"], m["temperature"]) for m in report["modes"]] == [
        ("sequential", 0.9), ("decoding=speculative,draft_tokens=8", 0.9)]
    assert report["comparison"][0]["codes_equal"]
    assert f"wrote {out}" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--temperatures", "greedy"], "argument --temperatures: a comma list whose every item takes a number"),
    (["--speculative", "decoding"], "is not key=value"),
    (["--rollouts", "0"], "argument --rollouts: takes a whole number from 1 to 4096"),
])
def test_bad_arguments_are_one_line(measure, tmp_path, capsys, args, message):
    world_model, tokenizer = demo_checkpoints()
    with pytest.raises(SystemExit) as exit_:
        measure.parse_args(["--world-model", str(world_model), "--tokenizer", str(tokenizer), "--out",
                            str(tmp_path / "x.json"), *args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]
