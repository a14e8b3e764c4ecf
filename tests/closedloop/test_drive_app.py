"""terra-drive: --help, one-line user errors, a run on the true world and a short fidelity run with the demo model."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
from terra.closedloop.study.control_worlds import FrozenWorld, GrayWorld
from terra.closedloop.study.report import compare, run_study, study_plan
from terra.closedloop.loop import drive_specs
from terra.closedloop.policies.builtin import reference_policy
from terra.closedloop.recording.run import RunSettings
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.study.settings import StudySettings, terra_drive_settings
from terra.closedloop.worlds import TrueWorld
from terra.core.device import usable_cores
from tests.conftest import one_error_line

APP = [sys.executable, "-m", "terra.apps.drive"]


def drive(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*APP, *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def test_help_and_one_line_errors(tmp_path):
    result = drive("--help", cwd=tmp_path)
    assert result.returncode == 0 and "terra-drive" in result.stdout and "policies" in result.stdout
    for args, text in ((["policies=[no_such]"], "unknown policy 'no_such'"),
                       (["world=truth", "scenarios=/no/such/folder"], "does not exist"),
                       (["num_steps=0"], "num_steps"),
                       (["vehicle=car"], "unknown vehicle 'car'; choose one of: bicycle, exact"),
                       (["exploitability=true"], "exploitability=true is part of the fidelity study: it needs "
                                                 "world=both (got world=model)"),
                       (["world=both", "num_scenarios=1", "exploitability=true"], "it needs num_scenarios >= 2"),
                       (["world=both", "num_scenarios=2", "num_control_scenarios=3"],
                        "num_control_scenarios=3 is how many of the study's num_scenarios=2 the controls drive"),
                       (["num_control_scenarios=1"], "it needs world=both and at most num_scenarios (null: all)"),
                       (["shard_worlds=engine"], "shard_worlds=engine picks some of a fidelity study's worlds: it "
                                                 "needs world=both"),
                       (["world=both", "num_seeds=2", "num_control_seeds=3"],
                        "num_control_seeds=3 is how many of the study's num_seeds=2 the controls drive"),
                       (["policies=[navsim:no_such_module:Agent]"], "cannot load the NAVSIM agent"),
                       (["within_horizon=true"], "within_horizon=true judges a fidelity study's worlds within their "
                                                 "horizons: it needs world=both"),
                       (["shard_processes.scene=2"], "shard_processes runs a fidelity study as shards of this "
                                                     "machine: it needs world=both"),
                       (["until=decided"], "until=decided adds scenarios to a fidelity study until its verdict is "
                                           "decided: it needs world=both"),
                       (["world=both", "until=decided", "until_scenarios=4"],
                        "until_scenarios=4 leaves no room for a round beyond num_scenarios=4")):
        result = drive(*args, cwd=tmp_path)
        one_error_line(result, "terra-drive", text)


@pytest.mark.parametrize("args, why", [([], "no CUDA GPU is visible here"),
                                       (["device=cpu"], "device=cpu was asked for"),
                                       (["shard_processes.engine=0", "device=auto"], "no CUDA GPU is visible here"),
                                       (["shard_processes.engine=0", "shard_processes.scene=0", "device=cpu"],
                                        "device=cpu was asked for")])
def test_the_gpu_preset_is_refused_without_a_gpu_in_one_line_naming_the_cpu_preset(tmp_path, args, why):
    """On this CPU-only machine (CI's): before any model or engine starts, and no output folder is left; the
    preset needs the GPU whatever its shard settings and device say (a run that got past the check would drive the
    short study the last settings ask for, on the CPU)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: study=gpu runs")
    small = ["backend=hf", "num_scenarios=2", "num_steps=1", "policies=[constant_speed]", "controls=[frozen]",
             "num_control_scenarios=1", "exploitability=false", "num_threads=1"]
    result = drive("study=gpu", *args, *small, f"output_dir={tmp_path / 'out'}", cwd=tmp_path)
    line = one_error_line(result, "terra-drive", f"study=gpu runs the study's world model on a CUDA GPU, but {why}; "
                                                 "on a CPU run terra-drive study=cpu")
    assert "docs/fidelity.md" in line and not (tmp_path / "out").exists()


def test_the_fidelity_presets_are_one_setting_named_in_help(tmp_path):
    result = drive("--help", cwd=tmp_path)
    assert re.search(r"^ *study +cpu, gpu", result.stdout, re.M) and "terra-drive study=cpu" in result.stdout
    found = {}
    for preset in ("cpu", "gpu"):  # study=gpu with its GPU check passed (this machine may have none)
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            cfg = compose("drive", overrides=[f"study={preset}", "num_threads=1"])
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("terra.closedloop.study.settings.needs_gpu", lambda *args: None)
            found[preset] = terra_drive_settings(cfg, tmp_path / preset)
        assert isinstance(found[preset], StudySettings) and not found[preset].drive.videos
    cpu, gpu = found["cpu"], found["gpu"]
    pixel = [name for name in cpu.drive.policies if name not in ("route_follower", "constant_speed", "brake_hard")]
    assert len(cpu.drive.scenarios.ids) == 5 and len(pixel) == 4 and cpu.drive.num_steps == 25
    assert "brake_hard" in cpu.drive.policies and "route_follower" in cpu.drive.policies  # the open-loop horizon
    assert set(cpu.controls) == {"frozen", "gray", "mirrored", "late", "offset_camera", "fast", "slow",
                                 "under_turning", "over_turning", "stutter"}  # no second engine
    assert cpu.num_control_scenarios == 4 and cpu.shard_processes.all == usable_cores()  # a shard process a core
    assert cpu.drive.writer_processes == 0  # each shard measures its own drives: no process beside it
    assert len(gpu.drive.scenarios.ids) == 16 and gpu.drive.num_steps == 200 and gpu.exploitability
    assert len(gpu.drive.policies) == 15 and gpu.drive.run.backend == "vllm" and len(gpu.controls) == 14
    assert {"wrong_route", "no_route"} <= set(gpu.controls)  # all: the route controls too, for the route demo model
    assert gpu.shard_processes.groups == {"engine": 4, "scene": 6} and gpu.drive.writer_processes == 2
    assert gpu.drive.run.device == "cuda" and gpu.overrides == ()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):  # a setting after the preset overrides it
        cfg = compose("drive", overrides=["study=cpu", "num_scenarios=6", "num_threads=1"])
    assert len(terra_drive_settings(cfg, tmp_path / "six").drive.scenarios.ids) == 6


def test_the_study_says_what_it_will_draw_before_any_world_opens():
    line = study_plan({"model": ["a", "b"], "truth": ["a", "b"], "zero_actions": ["a"], "frozen": ["a"]}, 25)
    assert "frames per world: model 50, truth 50, zero_actions 25, frozen 25" in line
    assert "the world model draws 75 of them" in line and "\n" not in line


def test_the_fidelity_study_drives_20_s_by_default_and_the_demo_2_s(tmp_path):
    for k, (overrides, steps) in enumerate(((["world=both"], 200), (["world=truth"], 20), ([], 20),
                                            (["world=both", "num_steps=30"], 30), (["num_steps=7"], 7))):
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            cfg = compose("drive", overrides=["backend=hf", "num_threads=1", *overrides])
        settings = terra_drive_settings(cfg, tmp_path / str(k))
        run = settings.drive if isinstance(settings, StudySettings) else settings  # a study wraps its run's settings
        assert run.num_steps == steps, overrides


def test_runs_on_the_true_world_and_resumes(tmp_path):
    args = ["world=truth", "num_scenarios=2", "num_steps=3", "policies=[lane_follower,constant_speed]",
            f"output_dir={tmp_path / 'out'}"]
    first = drive(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "4 drives ok, 0 failed, 0 already complete" in first.stdout
    lines = first.stdout.splitlines()  # it ends with what it measured: a row per policy under the header
    header = next(i for i, line in enumerate(lines) if line.startswith("world  policy"))
    rows = {line.split()[1]: line.split() for line in lines[header + 1:header + 3]}
    assert set(rows) == {"lane_follower", "constant_speed"} and all(row[0] == "truth" for row in rows.values())
    assert all(row[2:4] == ["2", "ok"] and row[-3:] == ["0/2", "0/2", "2/2"] for row in rows.values()), rows
    assert lines[-1].startswith("in lane: share of frames")
    again = drive(*args, cwd=tmp_path)
    assert "0 drives ok, 0 failed, 4 already complete" in again.stdout
    summary = json.loads((tmp_path / "out" / "manifest.summary.json").read_text())
    assert summary["counts"]["skipped"] == 4


def test_the_controls_drive_the_first_scenarios_and_seeds_spread_over_the_shards(tmp_path):
    every = [f"synthetic-0-{i:03d}__{p}" + ("__seed1" if k else "") for i in range(3)
             for p in ("lane_follower", "constant_speed") for k in range(2)]
    controls = [d for d in every if "__seed1" not in d and "-002__" not in d]  # scenarios 0 and 1, seed 0
    assert len(every) == 12 and len(controls) == 4
    for shard in range(2):
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            cfg = compose("drive", overrides=["world=both", "num_scenarios=3", "num_control_scenarios=2", "num_seeds=2",
                                              "num_control_seeds=1", "policies=[lane_follower,constant_speed]",
                                              "controls=[frozen,gray]", f"shard_index={shard}", "num_shards=2"])
        settings = terra_drive_settings(cfg, tmp_path / f"out{shard}")
        worlds = settings.folders.drive_ids
        assert list(worlds) == ["model", "truth", "frozen", "gray"]
        # drive k of each world's list to shard k % 2: the seed-0 control drives split too, not all to shard 0
        assert worlds["model"] == worlds["truth"] == every[shard::2]
        assert worlds["frozen"] == worlds["gray"] == controls[shard::2]
        assert settings.drive.drive_ids == [d for d in every if d in every[shard::2] + controls[shard::2]]


def test_shard_worlds_split_the_study_by_what_its_worlds_need(tmp_path):
    seen = {}
    for part in ("engine", "scene", "all"):
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            cfg = compose("drive", overrides=["world=both", "num_scenarios=2", "controls=[frozen,zero_actions,late]",
                                              f"shard_worlds={part}"])
        folders = terra_drive_settings(cfg, tmp_path / "out").folders
        seen[part] = list(folders.drive_ids)
        assert list(folders.worlds) == seen[part] and folders.report == (part == "all")
        assert folders.lock == {"engine": "engine.manifest.jsonl", "scene": "scene.manifest.jsonl",
                                "all": "fidelity.json"}[part]  # shards of both kinds hold locks of their own
    assert seen == {"engine": ["model", "zero_actions"], "scene": ["truth", "frozen", "late"],
                    "all": ["model", "truth", "frozen", "zero_actions", "late"]}


def test_fidelity_with_the_demo_model(tmp_path):
    args = ["world=both", "num_scenarios=2", "num_control_scenarios=1", "num_steps=2",
            "policies=[lane_follower,constant_speed]", "controls=[frozen]", "backend=hf", "num_threads=1",
            "exploitability=true", f"output_dir={tmp_path / 'out'}"]
    result = drive(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "fidelity.json").read_text())
    assert set(report["policies"]) == {"lane_follower", "constant_speed"}
    assert [v["world"] for v in report["verdicts"]] == ["model", "frozen"] and set(report["separations"]) == {"frozen"}
    assert [v["drives"] for v in report["verdicts"]] == [4, 2]  # the control drives scenario 0 alone
    for world in ("model", "truth", "frozen"):
        assert (tmp_path / "out" / world / "manifest.jsonl").is_file()
    text = (tmp_path / "out" / "fidelity.md").read_text()
    assert "| statistic | band | model | frozen |" in text and "AlpaSim score (model / truth; model - truth)" in text
    assert "| path distance m | following gain dx (model) |" in text and "| constant_speed (reads no pixels) |" in text
    assert set(report["policies"]["lane_follower"]["following_gain_dx"]) >= {"estimate", "low", "high"}
    exploit = report["exploitability"]  # 9 candidates tuned on scenario 0 per metric, tested on scenario 1
    for metric in ("lane_offset", "scene_score"):
        tuned = exploit["tuned"][metric]
        assert len(tuned["candidates"]) == 9 and tuned["gap"]["estimate"] is not None
    assert exploit["brake_hard"]["gap"]["scene_score"]["estimate"] is not None
    assert "**Exploitability on minus the mean absolute lane offset (m)** (lane_follower_tuned: 9 candidates" in text
    assert "**Brake-hard probe** on AlpaSim's scene score" in text
    assert text.startswith("# Fidelity verdict\n\n- **model** stays a simulator for a median of at least its drives' "
                           "0.2 s")
    assert "**model** is undecided: nothing fails, but the study is too small to judge it (2 scenarios, fewer than " \
           "4)" in text  # 2 scenarios: nothing decided


class Faithful(TrueWorld):
    """The true world judged as if it were a model."""

    name = "model"


def test_the_same_world_twice_is_perfectly_faithful(tmp_path):
    scenarios = synthetic_scenarios(2, 9, (72, 128))
    policies = {name: reference_policy(name) for name in ("lane_follower", "lane_follower_bias_left", "constant_speed")}
    report = run_study({"model": Faithful((72, 128)), "truth": TrueWorld((72, 128))},
                       drive_specs(scenarios, policies), RunSettings(tmp_path / "f", num_steps=6, progress=False))
    for row in report.policies.values():
        assert row["difference"]["path_distance_m"].estimate == 0.0 and row["model"] == row["truth"]
        assert 0.0 <= row["model"]["scene_score"] <= 1.0 and row["drives"] == 2 and row["failed"] == 0
        assert all(row["difference"][key].high == 0.0 for key in ("time_in_lane", "off_road", "scene_score"))
        assert 0.8 < row["following_gain_dx"].low <= row["following_gain_dx"].high < 1.2  # the verdict's band
    assert [name for name, row in report.policies.items() if not row["reads_pixels"]] == ["constant_speed"]
    [model] = report.verdicts
    assert model.drives == 6 and not model.flagged_by
    assert model.values["lane_slope"].estimate == pytest.approx(1.0) and model.values["lane_error_10m_m"].high == 0.0
    assert model.values["lanes_found_difference"].estimate == 0.0
    # 6-step drives reach the horizons 1 and 5; the same frames: the PSNR cap, SSIM 1, no lane error, one path
    assert np.isnan(model.measured["kendall_tau"].estimate)  # 2 pixel policies: no ranking to measure
    assert {k: v.estimate for k, v in model.measured.items() if k != "kendall_tau"} == pytest.approx(
        {"path_distance_m": 0.0, "psnr_db_h1": 100.0, "ssim_h1": 1.0, "psnr_db_h5": 100.0,
         "ssim_h5": 1.0})
    assert {"truth.time_in_lane", "truth.mean_abs_lane_offset_m", "alpasim.score", "alpasim.dist_to_gt_trajectory",
            "progress.distance_m", "history_comfort.max_abs_jerk", "extended_comfort.score"} <= set(model.differences)
    assert all(v.estimate == 0.0 for v in model.differences.values()) and len(model.differences) > 30
    empty = compare({"model": {}, "truth": {}})  # no drives: every statistic undefined, nothing decided
    assert empty.verdicts[0].drives == 0 and set(empty.verdicts[0].decisions.values()) == {"inconclusive"}


class FrozenModel(FrozenWorld):
    """The last context frame forever, judged as if it were a model."""

    name = "model"


def test_each_policy_shows_where_a_frozen_model_stops_moving_with_the_car(tmp_path):
    scenarios = synthetic_scenarios(2, 9, (72, 128))
    policies = {name: reference_policy(name) for name in ("lane_follower", "constant_speed")}
    report = run_study({"model": FrozenModel((72, 128)), "truth": TrueWorld((72, 128))},
                       drive_specs(scenarios, policies), RunSettings(tmp_path / "f", num_steps=6, progress=False))
    for row in report.policies.values():
        assert abs(row["following_gain_dx"].estimate) < 0.05 and row["following_gain_dx"].high < 0.8



class BlankModel(GrayWorld):
    """Uniform gray frames, no lane in any of them, judged as if it were a model."""

    name = "model"


def test_a_model_whose_frames_show_no_lane_is_flagged_and_its_report_written(tmp_path):
    """The per-policy table shows the model's following gain as undefined, with why, where it ended the study in an
    internal error before any report was written; the verdict flags the model."""
    scenarios = synthetic_scenarios(4, 9, (72, 128))
    policies = {name: reference_policy(name) for name in ("lane_follower", "constant_speed")}
    report = run_study({"model": BlankModel((72, 128)), "truth": TrueWorld((72, 128))},
                       drive_specs(scenarios, policies), RunSettings(tmp_path / "f", num_steps=3, progress=False))
    text = (tmp_path / "f" / "fidelity.md").read_text()
    assert "n/a: no step's motion was recovered from the world's frames |" in text
    row = json.loads((tmp_path / "f" / "fidelity.json").read_text())["policies"]["lane_follower"]
    assert row["following_gain_dx"]["estimate"] is None and row["following_gain_dx"]["reason"] == (
        "no step's motion was recovered from the world's frames")
    [model] = report.verdicts
    assert model.state == "flagged" and "lanes_found_difference" in model.flagged_by, model.flagged_by

def test_a_rerun_opens_only_the_worlds_it_has_drives_to_make(tmp_path, monkeypatch):
    """The report step after a study's shards drives nothing: no world model is loaded (on vLLM, no engine starts);
    a world with a drive to make again is opened alone, or with the model when it is one of the model's."""
    from terra.closedloop.study.drives import terra_drive as run_drive

    out = tmp_path / "out"
    args = ["world=both", "num_scenarios=1", "num_steps=2", "policies=[lane_follower]", "backend=hf",
            "controls=[frozen,zero_actions]", "num_threads=1", "progress=false", "videos=false"]

    def settings():
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            return terra_drive_settings(compose("drive", overrides=args), out)

    assert run_drive(settings()).exit_code == 0

    def no_model(*args, **kwargs):
        raise AssertionError("the world model was loaded")

    monkeypatch.setattr("terra.pipeline.WorldModelPipeline.from_run", no_model)
    import terra.closedloop.recording.run

    reads, completed = [], terra.closedloop.recording.run.completed
    monkeypatch.setattr("terra.closedloop.recording.run.completed", lambda *a: reads.append(a[1].id) or completed(*a))
    again = run_drive(settings())
    assert again.exit_code == 0 and (out / "fidelity.md").is_file()
    assert len(reads) == 4  # each world's one drive read once: before the worlds open, and reused by the records
    assert sum("0 drives ok, 0 failed, 1 already complete" in line for line in again.lines) == 4
    drive_file = f"{synthetic_scenarios(1, 0, (144, 256))[0].id}__lane_follower.json"
    (out / "frozen" / drive_file).unlink()
    third = run_drive(settings())  # the frozen world alone is opened
    assert any(line.startswith("terra-drive: frozen world: 1 drives ok") for line in third.lines)
    (out / "zero_actions" / drive_file).unlink()
    with pytest.raises(AssertionError, match="the world model was loaded"):
        run_drive(settings())


def test_until_decided_adds_scenarios_in_rounds_keeping_every_drive_and_says_what_is_left(tmp_path):
    """2 scenarios decide nothing (every statistic needs 4): a round of 4, the first round's drives kept, then the
    budget (until_scenarios=4) is spent; the exploitability study once, on the last round's scenarios."""
    out = tmp_path / "out"
    args = ["world=both", "num_scenarios=2", "num_control_scenarios=1", "num_steps=2",
            "policies=[lane_follower,constant_speed]", "controls=[frozen]", "backend=hf", "num_threads=1",
            "exploitability=true", "until=decided", "until_scenarios=4", f"output_dir={out}"]
    result = drive(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rounds = [line for line in result.stdout.splitlines() if line.startswith("terra-drive: until=decided: ")]
    assert rounds[0].startswith("terra-drive: until=decided: 2 scenarios") and "undecided " in rounds[0]
    assert rounds[1].startswith("terra-drive: until=decided: 4 scenarios") and len(rounds) == 3
    assert rounds[2].startswith("terra-drive: until=decided: the budget left undecided: ") and "about" in rounds[2]
    records = [json.loads(line) for line in (out / "model" / "manifest.jsonl").read_text().splitlines()]
    assert len(records) == 8 and sum(r["status"] == "skipped" for r in records) == 8  # the last pass drove nothing
    written = {path.name: path.stat().st_mtime_ns for path in (out / "model").glob("synthetic-*.json")}
    first = [t for name, t in written.items() if "-000__" in name or "-001__" in name]
    assert len(first) == 4 and len(written) == 8 and max(first) < min(set(written.values()) - set(first))  # kept
    report = json.loads((out / "fidelity.json").read_text())
    assert report["verdicts"][0]["drives"] == 8 and report["exploitability"] is not None
    assert report["settings"]["scenarios"] == 4
    left = [name for name, s in report["verdicts"][0]["statistics"].items()
            if s["decision"] == "inconclusive" and s["reason"] is None]
    assert left and all(name in rounds[2] for name in left)  # every statistic left open is named with its cost


def test_a_rerun_redoes_the_drives_whose_model_or_maps_changed_in_place_or_whose_video_was_cut(tmp_path, capsys):
    """The world model's weights replaced in the same folder, then each scenario's map moved 3.5 m in its file: every
    drive is made again each time, said in one line; a drive whose video was cut short, or swapped for the other's, is
    made again too, the other kept."""
    from terra.closedloop.scenario_maps import export_maps
    from terra.closedloop.study.drives import terra_drive as run_drive
    from terra.roads import Lane, Road, read_clipgt, write_clipgt
    from tests.conftest import save_tiny_pair, tiny_model

    pair, out, maps = save_tiny_pair(tmp_path / "pair"), tmp_path / "out", tmp_path / "maps"
    export_maps(maps, num_scenarios=2, scenario_seed=0)
    args = ["world=model", "num_scenarios=2", "scenario_seed=0", f"road={maps}", "num_steps=1",
            "policies=[constant_speed]", "backend=hf", "device=cpu", "num_threads=1", "progress=false",
            f"model.world_model={pair / 'world_model'}", f"tokenizer.path={pair / 'tokenizer'}"]

    def rerun() -> str:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            outcome = run_drive(terra_drive_settings(compose("drive", overrides=args), out))
        assert outcome.exit_code == 0
        return capsys.readouterr().out + "\n".join(outcome.lines)

    assert "2 drives ok, 0 failed, 0 already complete" in rerun()
    tiny_model(seed=1).save_pretrained(pair / "world_model")  # other weights, the same folder
    said = rerun()
    assert "terra-drive: model world: 2 drives redone: the world model changed" in said
    assert "2 drives ok, 0 failed, 0 already complete" in said
    for path in sorted(maps.glob("*.zip")):  # the lanes and edges 3.5 m to the left, the same files
        road = read_clipgt(path)
        write_clipgt(Road([Lane(lane.points + [0.0, 3.5], lane.id, lane.successors) for lane in road.lanes],
                          [edge + [0.0, 3.5] for edge in road.boundaries]), path, clip_id=path.stem)
    said = rerun()
    assert "terra-drive: model world: 2 drives redone: the scenario's files changed" in said
    assert "2 drives ok, 0 failed, 0 already complete" in said
    video, other = sorted(out.glob("*.mp4"))
    video.write_bytes(video.read_bytes()[:64])
    said = rerun()
    assert "1 drive redone: its files are not whole" in said and "1 drives ok, 0 failed, 1 already complete" in said
    assert video.stat().st_size > 64
    whole = video.read_bytes()
    video.write_bytes(other.read_bytes())  # the other drive's video, whole, in its place
    said = rerun()
    assert "1 drive redone: its files are not whole" in said and "1 drives ok, 0 failed, 1 already complete" in said
    assert video.read_bytes() == whole
