"""scripts/bench/benchmark_defaults.py and scripts/bench/benchmark_host.py on the demo model or a tiny one,
Transformers backend (CPU)."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import load_script, save_tiny_pair


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


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """A tiny world model (8x8 codes, windows of 6 frames) and the random LFQ tokenizer whose codes fit it, saved."""
    return save_tiny_pair(tmp_path_factory.mktemp("tiny_pair"))


ROW = re.compile(r"\| (generate|alpasim) \| (–|\d+) \| defaults \| (\d+) \| ([\d.]+) \| ([\d.]+) \| (–|[\d.]+) \| "
                 r"([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (s a frame|s an 8-frame chunk \(p50\)) \| "
                 r"(–) \| (–) \| ([\d.]+) \|$")  # no GPU busy share, no engine-core process: the client's CPU


def test_sessions_rows_and_terra_generate_in_one_run(tiny_pair, tmp_path, capsys, single_thread):
    """One run prints the card and commit, terra-generate's seconds a frame and a row for each count of AlpaSim
    sessions on one server (frames a second, chunk p50 and p90, real time: 0.8 s over the p50)."""
    pytest.importorskip("carla_driver_interface")
    bench = load_script("bench/benchmark_defaults")
    out = tmp_path / "defaults.json"
    records = bench.main(["--sessions", "1,2", "--frames", "2", "--chunks", "1", "--draft-tokens", "auto",
                          "--commit", "abc123", "--out", str(out), f"model.world_model={tiny_pair / 'world_model'}",
                          f"tokenizer.path={tiny_pair / 'tokenizer'}", "backend=hf", "device=cpu", "num_threads=1"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("card: none (cpu; CPU ") and "commit: abc123;" in printed[0]
    assert printed[1] == bench.HEADER
    rows = [m.groups() for m in map(ROW.match, printed[3:]) if m]
    assert [(path, sessions) for path, sessions, *_ in rows] == [("generate", "–"), ("alpasim", "1"), ("alpasim", "2")]
    generate, *sessions = records
    assert generate["seconds"] > 0 and generate["frames_per_s"] == pytest.approx(1 / generate["seconds"])
    assert generate["realtime_x"] == pytest.approx(generate["frames_per_s"] / 10)
    for record, count in zip(sessions, (1, 2)):
        assert (record["sessions"], record["engine_rollouts"], record["decoding"]) == (count, 64, "speculative")
        assert record["p90"] >= record["seconds"] > 0 and record["frames_per_s"] > 0
        assert record["realtime_x"] == pytest.approx(0.8 / record["seconds"])
        assert 1 <= record["passes_per_frame"] < 64  # the tiny model's 64 codes a frame, several a pass
    for (_, _, block, passes, seconds, p90, fps, realtime, _, _, _, _, client), record in zip(rows, records):
        assert (int(block), float(passes), float(seconds), float(fps), float(realtime)) == (
            record["block"], round(record["passes_per_frame"], 2), round(record["seconds"], 3),
            round(record["frames_per_s"], 1), round(record["realtime_x"], 2))
        assert p90 == ("–" if record["p90"] is None else f"{record['p90']:.3f}")
        # no GPU here, and the Transformers backend has no engine-core process: the client does all the work
        assert record["gpu_busy_pct"] is None and record["engine_core_cpu"] is None
        assert float(client) == round(record["client_cpu"], 2) and 0.1 < record["client_cpu"] <= 2.0
    written = json.loads(out.read_text())
    assert written["commit"] == "abc123" and written["records"] == json.loads(json.dumps(records))


def test_bad_arguments_of_the_defaults_benchmark(capsys):
    bench = load_script("bench/benchmark_defaults")
    for argv in (["--paths", "drive"], ["--draft-tokens", "0"], ["--draft-tokens", "frame"], ["--frames", "0"],
                 ["--sessions", "0"], ["--sessions", "1,x"], ["--out", "/no/such/folder/x.json"]):
        with pytest.raises(SystemExit) as exit_:
            bench.parse_args(argv)
        assert exit_.value.code == 2 and len(capsys.readouterr().err.splitlines()) == 1, argv
    assert bench.parse_args(["--sessions", "1,16,64"]).sessions == [1, 16, 64]
    assert bench.exit_2_on_input_error("benchmark_defaults")(bench.main)(["sampling.draft_tokens=64"]) == 2


def test_host_time_of_a_pass_is_split_into_its_parts(single_thread):
    bench = load_script("bench/benchmark_host")
    [record] = bench.main(["--rollouts", "1", "--frames", "2", "--draft-tokens", "16", "--guesses", "transitions"])
    parts = record["parts_ms_per_pass"]
    assert (record["draft_tokens"], record["guesses"]) == (16, "transitions")
    assert record["passes"] >= 2 and record["host_ms_per_pass"] > 0 and parts["forward"] > 0
    assert parts["noise"] > 0 and parts["rule"] > 0 and parts["transitions"] > 0
    assert sum(parts.values()) == pytest.approx(record["cpu_ms_per_pass"], rel=0.5)  # another run, the same work
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--guesses", "best"])
    assert exit_.value.code == 2
    assert bench.parse_args(["--sessions", "1,16,64"]).sessions == [1, 16, 64]


def test_host_time_of_a_step_with_sessions_in_flight(single_thread):
    """Sessions in flight: every rollout takes a pass each step (a poll), so a step's host time is its passes'."""
    bench = load_script("bench/benchmark_host")
    [record] = bench.main(["--rollouts", "1", "--sessions", "2", "--frames", "1", "--draft-tokens", "48"])
    assert (record["sessions"], record["rollouts"], record["frames"]) == (2, 2, 2)
    assert record["passes"] / 2 <= record["steps"] <= record["passes"]
    assert record["host_ms_per_step"] == pytest.approx(record["host_ms_per_pass"] * record["passes"]
                                                       / record["steps"], rel=1e-2)
