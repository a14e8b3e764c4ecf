"""scripts/bench/benchmark_defaults.py and scripts/bench/benchmark_host.py on the demo model, Transformers backend
(CPU)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script


def test_each_path_runs_at_its_defaults_and_at_another_block(tmp_path, single_thread):
    bench = load_script("bench/benchmark_defaults")
    out = tmp_path / "defaults.json"
    records = bench.main(["--paths", "generate", "--frames", "2", "--draft-tokens", "auto,8,48", "--by", "cpu_s",
                          "--out", str(out), "backend=hf", "device=cpu"])
    defaults, other = records  # the defaults ran block 48 (the CPU's auto): not run again
    assert (defaults["setting"], defaults["block"], other["block"]) == ("defaults", 48, 8)
    assert all(r["decoding"] == "speculative" and 1 <= r["passes_per_frame"] < 144 and r["seconds"] > 0
               and r["cpu_s"] > 0 for r in records)
    assert json.loads(out.read_text())["records"] == json.loads(json.dumps(records))


def test_bad_arguments_of_the_defaults_benchmark():
    bench = load_script("bench/benchmark_defaults")
    for argv in (["--paths", "drive"], ["--draft-tokens", "0"], ["--draft-tokens", "frame"], ["--frames", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
    assert bench.exit_2_on_input_error("benchmark_defaults")(bench.main)(["sampling.draft_tokens=64"]) == 2


def test_host_time_of_a_pass_is_split_into_its_parts(single_thread):
    bench = load_script("bench/benchmark_host")
    [record] = bench.main(["--rollouts", "1", "--frames", "2", "--draft-tokens", "16", "--guesses", "transitions"])
    parts = record["parts_ms_per_pass"]
    assert (record["draft_tokens"], record["guesses"]) == (16, "transitions")
    assert record["passes"] >= 2 and record["host_ms_per_pass"] > 0 and parts["forward"] > 0
    assert parts["noise"] > 0 and parts["rule"] > 0 and parts["transitions"] > 0
    assert sum(parts.values()) == pytest.approx(record["cpu_ms_per_pass"], rel=0.5)  # another run, the same work
    assert bench.exit_2_on_input_error("benchmark_host")(bench.main)(["--guesses", "best"]) == 2
