"""terra-drive's output folders on the one rule of every app (terra/config/output_dir.py), checked in its settings
before any model loads: never inside or holding what the run reads (a scenarios JSONL, its context frames, a
driving-log folder, the checkpoints, the estimator), never over a file the toolkit did not write, not a file; the
lock and the marker; strict JSON in every file written."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

from terra.apps.runner import CONF_DIR
from terra.closedloop.study.control_worlds import control_world
from terra.closedloop.study.report import run_study
from terra.closedloop.loop import DriveSpec, drive_specs, run_drives
from terra.closedloop.policies.builtin import reference_policy
from terra.closedloop.recording.files import write_drive, DriveWriters
from terra.closedloop.recording.run import RunSettings, even_chunks
from terra.closedloop.scenarios import scenario_source, synthetic_scenarios
from terra.closedloop.study.settings import terra_drive_settings
from terra.closedloop.worlds import TrueWorld
from terra.config.assets import ASSETS
from terra.core.atomic import MARKER, mark, marked
from terra.core.errors import TerraInputError
from terra.core.lock import output_lock
from terra.sim.logs import write_driving_logs
from tests.closedloop.conftest import drive_and_record
from tests.conftest import load_script

SIZE = (72, 128)
LANE = "synthetic-0-000__lane_follower"  # the first drive of the default synthetic scenarios


def settings(out: Path, *overrides: str):
    """terra-drive's settings of ``overrides`` with ``output_dir=out`` (the edge of the app, in process)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("drive", overrides=list(overrides))
    return terra_drive_settings(cfg, out)


def refused(out: Path, *overrides: str) -> str:
    with pytest.raises(TerraInputError) as caught:
        settings(out, *overrides)
    return str(caught.value)


@pytest.fixture
def samples(tmp_path) -> Path:
    """A JSONL of one sample (``data/s.jsonl``) whose context frames are in ``images/frames/``."""
    (tmp_path / "images" / "frames").mkdir(parents=True)
    for i, frame in enumerate(synthetic_scenarios(1, 5, SIZE)[0].images):
        Image.fromarray(frame).save(tmp_path / "images" / "frames" / f"f{i}.png")
    path = tmp_path / "data" / "s.jsonl"
    path.parent.mkdir()
    line = {"sample_id": "a", "context": "../images/frames", "manoeuvre": "straight"}
    path.write_text(json.dumps(line) + "\n")
    return path


def test_outputs_never_inside_or_holding_what_the_run_reads(tmp_path, samples):
    logs = write_driving_logs(tmp_path / "logs", 1, 8, *SIZE, seed=3, progress=False)
    assert "lies inside the driving-log folder" in refused(logs / "out", f"scenarios={logs}", "num_steps=2")
    assert "holds the scenarios file" in refused(samples.parent, f"scenarios={samples}")
    assert "lies inside the context" in refused(tmp_path / "images" / "frames" / "out", f"scenarios={samples}")
    assert "holds the context" in refused(tmp_path / "images", f"scenarios={samples}")
    estimator = tmp_path / "estimator"
    estimator.mkdir()
    (estimator / "config.json").write_text("{}")
    assert "lies inside the estimator folder" in refused(estimator / "out", f"estimator={estimator}")
    demo = ASSETS / "demo"
    assert "inside the world model" in refused(demo / "world_model" / "out", "world=both")
    assert "inside the tokenizer" in refused(demo / "tokenizer" / "out", "world=truth")
    assert not any(p.name == "out" for p in tmp_path.rglob("out"))  # refused before anything was made


def test_a_drives_fingerprint_starts_from_the_runs_rule(tmp_path):
    """A drive's inputs hold what every run's do (terra/config/spec.py, ``RunSpec.output_settings``: resize
    included), the checkpoints' digests and engine, and the vehicle: another resize makes the drives again on resume."""
    from terra.closedloop.recording.files import drive_inputs
    from terra.config.spec import fingerprint

    crop, stretch = settings(tmp_path / "a"), settings(tmp_path / "b", "tokenizer.resize=stretch")
    assert crop.model_settings.items() >= crop.run.output_settings().items()
    assert {"resize", "world_model", "tokenizer", "backend", "dtype"} <= set(crop.model_settings)
    [spec] = drive_specs(synthetic_scenarios(1, 0, SIZE), {"lane_follower": reference_policy("lane_follower")})
    prints = {fingerprint(drive_inputs(spec, "model", 4, "bicycle", drive.model_settings)) for drive in (crop, stretch)}
    assert len(prints) == 2 and all(len(p) == 32 for p in prints)
    assert fingerprint(drive_inputs(spec, "model", 4, "exact", crop.model_settings)) not in prints  # the vehicle too


def test_outputs_never_over_a_file_the_toolkit_did_not_write(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{LANE}.json").write_text("my notes")
    assert f"holds '{LANE}.json', which this run would overwrite" in refused(out)
    (tmp_path / "both" / "model").mkdir(parents=True)
    assert "holds 'model', which this run would overwrite" in refused(tmp_path / "both", "world=both")
    mark(tmp_path / "both", ["model", "truth"])  # as an earlier study left it
    (tmp_path / "both" / "model" / f"{LANE}.mp4").write_bytes(b"my video")
    assert f"output_dir/model={tmp_path / 'both' / 'model'} holds '{LANE}.mp4'" in refused(tmp_path / "both",
                                                                                           "world=both")
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "fidelity.md").write_text("my report")
    assert "fidelity.md" in refused(tmp_path / "report", "world=both")
    (tmp_path / "clash").mkdir()
    (tmp_path / "clash" / "truth").write_text("a file where the truth world's folder goes")
    assert "holds a file 'truth' where the run writes a folder" in refused(tmp_path / "clash", "world=both")
    (out / f"{LANE}.json").unlink()
    (out / "notes.txt").write_text("beside the outputs: kept")
    settings(out)  # a user's file under another name stays beside the outputs


def test_output_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "out").write_text("a file")
    assert "is not a folder" in refused(tmp_path / "out")
    assert "is not a folder" in refused(tmp_path / "out" / "below")


def test_the_app_refuses_before_any_model_loads(tmp_path):
    logs = write_driving_logs(tmp_path / "logs", 1, 8, *SIZE, seed=3, progress=False)
    result = subprocess.run([sys.executable, "-m", "terra.apps.drive", f"scenarios={logs}",
                             f"output_dir={logs / 'out'}"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("terra-drive: error: output_dir=") and "lies inside the driving-log folder" in line
    assert not (logs / "out").exists()


def test_a_run_marks_what_it_writes_holds_the_lock_and_writes_strict_json(tmp_path):
    scenarios = synthetic_scenarios(1, 0, SIZE)
    specs = [DriveSpec(scenarios[0], "lane_follower", reference_policy("lane_follower")),
             DriveSpec(scenarios[0], "broken", lambda: (_ for _ in ()).throw(ValueError("no such policy")))]
    run = RunSettings(tmp_path / "run", num_steps=2, progress=False)
    with output_lock(tmp_path / "run" / "manifest.jsonl", "output_dir"):  # another run holds the folder
        with pytest.raises(TerraInputError, match="in use by another run"):
            drive_and_record(TrueWorld(SIZE), specs, run)
    result = drive_and_record(TrueWorld(SIZE), specs, run)
    assert result.counts == {"ok": 1, "failed": 1, "skipped": 0}
    broken = f"{scenarios[0].id}__broken"
    names = {"manifest.jsonl", "manifest.summary.json", f"{LANE}.json", f"{LANE}.mp4", f"{LANE}.png",
             f"{broken}.json", f"{broken}.mp4", f"{broken}.png"}
    assert marked(tmp_path / "run") == names
    assert {p.name for p in (tmp_path / "run").iterdir()} == names - {f"{broken}.mp4", f"{broken}.png"} | {MARKER}
    for path in (tmp_path / "run").glob("*.json"):
        json.loads(path.read_text(), parse_constant=pytest.fail)  # no NaN or Infinity

    # a fidelity study whose every drive failed has no numbers to average: null, never NaN
    worlds = {"model": TrueWorld(SIZE), "truth": TrueWorld(SIZE)}
    report = run_study(worlds, specs[1:], RunSettings(tmp_path / "fid", num_steps=2, progress=False))
    text = (tmp_path / "fid" / "fidelity.json").read_text()
    row = json.loads(text, parse_constant=pytest.fail)["policies"]["broken"]
    assert row["model"]["time_in_lane"] is None and np.isnan(report.policies["broken"]["model"]["time_in_lane"])
    assert marked(tmp_path / "fid") == {"fidelity.json", "fidelity.md", "model", "truth"}


def test_writer_processes_write_what_the_loop_writes(tmp_path):
    """Drives measured and written by two processes beside the loop (three chunks of two, the last chunk's drives
    written while none drives) are the loop's own drives, in the manifest in the same order."""
    scenarios = synthetic_scenarios(2, 3, SIZE)
    specs = drive_specs(scenarios, {"lane_follower": reference_policy("lane_follower"),
                                    "lane_follower_noisy": reference_policy("lane_follower_noisy")})
    specs.append(DriveSpec(scenarios[0], "broken", lambda: (_ for _ in ()).throw(ValueError("no such policy"))))
    runs = {}
    for processes in (0, 2):
        run = RunSettings(tmp_path / str(processes), num_steps=12, max_concurrent=2, progress=False, videos=False,
                          measure=True, writer_processes=processes)
        result = drive_and_record(control_world("late", SIZE), specs, run)
        assert result.counts == {"ok": 4, "failed": 1, "skipped": 0}
        runs[processes] = result
    assert [r["drive"] for r in runs[0].records] == [r["drive"] for r in runs[2].records] == [s.id for s in specs]
    for drive in runs[0].drives:
        written = [json.loads((tmp_path / str(k) / f"{drive}.json").read_text()) for k in (0, 2)]
        assert {**written[0], "policy_s": None} == {**written[1], "policy_s": None}
    assert all(len(runs[2].drives[s.id]["fidelity"]["recovered"]) == 12 for s in specs[:4])  # measured there


def test_the_loop_writes_the_newest_drives_while_its_writer_takes_the_oldest(tmp_path):
    """Six drives handed to one writer process (spawned: still importing) and then waited for: the loop's process
    writes the newest, the writer the oldest; the records come in the order handed in, the files as the loop alone
    writes them."""
    scenarios = synthetic_scenarios(3, 3, SIZE)
    specs = drive_specs(scenarios, {"lane_follower": reference_policy("lane_follower"),
                                    "lane_follower_noisy": reference_policy("lane_follower_noisy")})
    drives = [drive.finished() for drive in run_drives(control_world("late", SIZE), specs, 6)]
    emitted = []
    with DriveWriters(1, lambda record, content: emitted.append(record)) as writers:
        for drive in drives:
            writers.write(1.0, tmp_path / "shared", drive, {"settings": "print"}, None, None, True)
        writers.wait(0)
    assert [r["drive"] for r in emitted] == [s.id for s in specs] and not writers.pending
    for drive in drives:
        write_drive(tmp_path / "loop", drive, {"settings": "print"}, None, None, True)
    shared = {spec.id: tmp_path / "shared" / f"{spec.id}.json" for spec in specs}
    assert all(path.read_text() == (tmp_path / "loop" / path.name).read_text() for path in shared.values())
    newest, oldest = (shared[spec.id].stat().st_mtime_ns for spec in (specs[-1], specs[0]))
    assert newest < oldest  # written here before the writer, still starting, had written the oldest


def test_a_writer_process_that_dies_leaves_its_drives_to_the_loop(tmp_path, capsys):
    scenarios = synthetic_scenarios(1, 3, SIZE)
    specs = drive_specs(scenarios, {"lane_follower": reference_policy("lane_follower"),
                                    "lane_follower_noisy": reference_policy("lane_follower_noisy")})
    drives = run_drives(control_world("late", SIZE), specs, 12)
    emitted = []
    with DriveWriters(1, lambda record, content: emitted.append(record)) as writers:
        writers.write(1.0, tmp_path, drives[0].finished(), {"settings": "print"}, None, None, True)
        pool = writers.pool
        for process in list(pool._processes.values()):  # killed while it starts (spawned: ~1 s of imports)
            process.kill()
        deadline = time.monotonic() + 60
        while not pool._broken and time.monotonic() < deadline:  # the executor has seen it die
            time.sleep(0.05)
        # refused by the broken pool
        writers.write(1.0, tmp_path, drives[1].finished(), {"settings": "print"}, None, None, True)
        writers.wait(0)
    assert [r["drive"] for r in emitted] == [s.id for s in specs] and writers.pool is None
    assert all(json.loads((tmp_path / f"{s.id}.json").read_text())["fidelity"]["recovered"] for s in specs)
    assert "a writer process died" in capsys.readouterr().err


def test_the_library_keeps_outputs_apart_from_the_scenarios_files(tmp_path, samples):
    [scenario] = scenario_source(samples).load(SIZE)
    specs = drive_specs([scenario], {"lane_follower": reference_policy("lane_follower")})
    with pytest.raises(TerraInputError, match="lies inside the context"):
        drive_and_record(TrueWorld(SIZE), specs, RunSettings(tmp_path / "images" / "frames" / "run", num_steps=1))
    with pytest.raises(TerraInputError, match="holds the scenarios file"):
        run_study({"model": TrueWorld(SIZE), "truth": TrueWorld(SIZE)}, specs,
                     RunSettings(samples.parent, num_steps=1))


def test_the_benchmark_claims_its_output_before_the_model_loads(tmp_path, capsys):
    bench = load_script("bench/benchmark_drive")
    demo = ASSETS / "demo"
    (tmp_path / "bench.json").write_text("my numbers")
    with pytest.raises(SystemExit) as exit_code:
        bench.main(["--drives", "1", "--steps", "1", "--out", str(tmp_path / "bench.json")])
    assert exit_code.value.code == 2 and "holds 'bench.json'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_code:
        bench.main(["--model", str(demo / "world_model"), "--out", str(demo / "world_model" / "bench.json")])
    assert exit_code.value.code == 2 and "lies inside the checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_code:
        bench.main(["--out", str(demo / "tokenizer" / "bench.json")])  # the demo model's folders are inputs
    assert exit_code.value.code == 2 and "lies inside the checkpoint" in capsys.readouterr().err


def test_chunks_are_as_few_as_hold_the_drives_and_even():
    sizes = {(n, most): [len(c) for c in even_chunks(list(range(n)), most)] for n, most in
             ((450, 32), (10, 4), (64, 64), (65, 64), (3, 8), (0, 8))}
    assert sizes == {(450, 32): [30] * 15, (10, 4): [3, 3, 4], (64, 64): [64], (65, 64): [32, 33], (3, 8): [3],
                     (0, 8): []}  # never a last chunk of 2 drives taking a whole chunk's time
    assert [x for c in even_chunks(list(range(450)), 32) for x in c] == list(range(450))


@pytest.mark.parametrize("overrides, plan", [
    ((), "16 drives: 4 policies x 4 scenarios, 20 steps each in the model world"),
    (("policies=[lane_follower]", "num_scenarios=1", "num_seeds=2", "num_steps=1", "world=truth"),
     "2 drives: 1 policy x 1 scenario x 2 seeds, 1 step each in the truth world"),
])
def test_a_run_says_its_plan_before_any_world_opens(tmp_path, monkeypatch, capsys, overrides, plan):
    """terra-drive's first line, printed before the world opens (a minute on a CPU for the world model): how many
    drives, as policies x scenarios (x seeds), their steps, the world and the folder."""
    from terra.closedloop.recording import drives

    class Opened(Exception):
        pass

    def start_drives(*args, **kwargs):
        raise Opened(capsys.readouterr().out)

    monkeypatch.setattr(drives, "start_drives", start_drives)
    with pytest.raises(Opened) as said:
        drives.drive(settings(tmp_path / "run", *overrides), progress=True)
    assert str(said.value) == f"terra-drive: {plan}, into {tmp_path / 'run'}; opening the world\n"
