"""terra-drive split by hand (``shard_index`` / ``num_shards``): each shard makes drive k when k % num_shards is its
index, in the same folder with a manifest of its own; together they are the unsharded run, which then drives
nothing again (and with ``world=both`` writes the fidelity report)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
from terra.closedloop.study.processes import ShardProcesses, engine_cards, shard_command, visible_gpus
from terra.closedloop.study.drives import terra_drive as drive
from terra.closedloop.study.settings import terra_drive_settings
from terra.config.manifest import read_manifest
from terra.core.errors import TerraInputError

POLICIES = "policies=[lane_follower,constant_speed]"


def settings(out: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("drive", overrides=["num_threads=1", "backend=hf", "progress=false", *overrides])
    return terra_drive_settings(cfg, out)


def drives_of(manifest: Path) -> list[tuple[str, str]]:
    return [(r["drive"], r["status"]) for r in read_manifest(manifest)]


def comparable(path: Path) -> dict:
    """A drive's JSON without its timings."""
    content = json.loads(path.read_text())
    return {k: v for k, v in content.items() if k != "policy_s"}


def test_shards_split_the_drives_and_add_up_to_the_whole_run(tmp_path):
    args = ("world=truth", "num_scenarios=3", POLICIES, "num_steps=3")
    whole = settings(tmp_path / "whole", *args)
    assert drive(whole).exit_code == 0
    ids = whole.drive_ids
    assert len(ids) == 6
    shards = [settings(tmp_path / "split", *args, f"shard_index={i}", "num_shards=2") for i in range(2)]
    assert [s.drive_ids for s in shards] == [ids[0::2], ids[1::2]]
    for i, shard in enumerate(shards):
        outcome = drive(shard)
        assert outcome.exit_code == 0 and "3 drives ok" in outcome.lines[0]
        manifest = tmp_path / "split" / f"manifest.shard-{i}-of-2.jsonl"
        assert drives_of(manifest) == [(d, "ok") for d in ids[i::2]]
        summary = json.loads((tmp_path / "split" / f"manifest.shard-{i}-of-2.summary.json").read_text())
        assert summary["manifest"] == manifest.name and summary["counts"]["ok"] == 3
    for drive_id in ids:
        name = f"{drive_id}.json"
        assert comparable(tmp_path / "split" / name) == comparable(tmp_path / "whole" / name)
    outcome = drive(settings(tmp_path / "split", *args))  # the unsharded run over the shards' folder
    assert "0 drives ok, 0 failed, 6 already complete" in outcome.lines[0]
    assert drives_of(tmp_path / "split" / "manifest.jsonl") == [(d, "skipped") for d in ids]


def test_shards_of_a_fidelity_study_then_its_report(tmp_path):
    args = ("world=both", "num_scenarios=1", POLICIES, "num_steps=2", "controls=[frozen]")
    for i in range(2):
        outcome = drive(settings(tmp_path, *args, f"shard_index={i}", "num_shards=2"))
        assert outcome.exit_code == 0 and "writes the fidelity report once every shard is done" in outcome.lines[-1]
        for world in ("model", "truth", "frozen"):
            assert len(read_manifest(tmp_path / world / f"manifest.shard-{i}-of-2.jsonl")) == 1
    assert not (tmp_path / "fidelity.json").exists()
    outcome = drive(settings(tmp_path, *args))
    verdict = outcome.lines[-1]  # the verdict last, after the worlds' lines
    assert outcome.exit_code == 0 and verdict.startswith("Fidelity verdict (the whole report: fidelity.md)")
    assert re.search(r"^model +2 +>= 0.2 s +undecided", verdict, re.M)  # one scenario: too small to judge
    assert all("0 drives ok, 0 failed, 2 already complete" in line for line in outcome.lines[:3])
    report = json.loads((tmp_path / "fidelity.json").read_text())
    assert set(report["policies"]) == {"lane_follower", "constant_speed"}
    assert [(v["world"], v["drives"]) for v in report["verdicts"]] == [("model", 2), ("frozen", 2)]


def test_shard_settings_are_checked(tmp_path):
    for overrides, text in ((["shard_index=2", "num_shards=2"], "shard_index=2 must be below num_shards=2"),
                            (["num_scenarios=1", "policies=[lane_follower]", "shard_index=1", "num_shards=2"],
                             "has no drives (the run has 1); use at most 1 shards"),
                            (["executor=slurm"], "unknown executor 'slurm'"),
                            (["ray.num_actors=0"], "ray.num_actors")):
        with pytest.raises(TerraInputError, match=text.replace("(", r"\(").replace(")", r"\)")):
            settings(tmp_path, *overrides)


def test_a_ray_address_where_no_cluster_answers_is_one_line_before_any_output(tmp_path):
    run = settings(tmp_path / "out", "world=truth", "executor=ray", "ray.address=127.0.0.1:9")
    with pytest.raises(TerraInputError, match="ray.address=127.0.0.1:9: no Ray cluster answers there"):
        drive(run)
    assert not (tmp_path / "out").exists()


def test_the_study_runs_its_own_shard_processes_then_its_report(tmp_path):
    """``shard_processes`` (study=gpu's 4 engine and 6 scene shards): here 2 scene shards on the CPU, the engine's
    worlds left to the command's own process, which then writes the report; each shard got the command's settings,
    its own shard settings and none of shard_processes (terra/closedloop/study/processes.py)."""
    out = tmp_path / "study"
    result = subprocess.run(
        [sys.executable, "-m", "terra.apps.drive", "world=both", "policies=[lane_follower,constant_speed]",
         "num_scenarios=2", "num_steps=2", "controls=[frozen]", "backend=hf", "num_threads=1", "videos=false",
         "shard_processes.scene=2", f"output_dir={out}"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "terra-drive: 2 shard processes (2 scene) ended in" in result.stdout
    for world in ("truth", "frozen"):  # the scene worlds: two shards, two drives each (the control's two as well)
        made = [read_manifest(out / world / f"manifest.shard-{i}-of-2.jsonl") for i in range(2)]
        assert [len(m) for m in made] == [2, 2] and all(r["status"] == "ok" for m in made for r in m)
    assert all(r["status"] == "ok" for r in read_manifest(out / "model" / "manifest.jsonl"))  # made here
    assert all(r["status"] == "skipped" for r in read_manifest(out / "truth" / "manifest.jsonl"))
    report = json.loads((out / "fidelity.json").read_text())
    assert [v["world"] for v in report["verdicts"]] == ["model", "frozen"]
    assert result.stdout.rstrip().splitlines()[-1].startswith("- frozen stays a simulator")  # the verdict last


def _study_on(cores: set[int], out: Path) -> subprocess.CompletedProcess:
    """A tiny study of every world with ``shard_processes.all=cores`` (study=cpu's), run on ``cores`` alone."""
    return subprocess.run(
        [sys.executable, "-m", "terra.apps.drive", "world=both", "policies=[lane_follower]", "num_scenarios=2",
         "num_steps=2", "controls=[frozen]", "backend=hf", "videos=false", "shard_processes.all=cores",
         f"output_dir={out}"], capture_output=True, text=True, timeout=600,
        preexec_fn=lambda: os.sched_setaffinity(0, cores))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores to give a run one or two")
def test_the_study_of_every_world_takes_a_shard_process_per_core_and_reports_the_same(tmp_path):
    """``shard_processes.all=cores``: a run given two cores drives every world in two shard processes, a run given one
    in its own process, and both write the same report."""
    two, one = sorted(os.sched_getaffinity(0))[:2], {min(os.sched_getaffinity(0))}
    on_two, on_one = _study_on(set(two), tmp_path / "two"), _study_on(one, tmp_path / "one")
    assert on_two.returncode == 0 and on_one.returncode == 0, on_two.stderr + on_one.stderr
    assert "terra-drive: 2 shard processes (2 all) ended in" in on_two.stdout
    assert "shard processes" not in on_one.stdout
    for world in ("model", "truth", "frozen"):  # a drive of each world in each shard
        shards = [read_manifest(tmp_path / "two" / world / f"manifest.shard-{i}-of-2.jsonl") for i in (0, 1)]
        assert [len(records) for records in shards] == [1, 1]
    report = json.loads((tmp_path / "two" / "fidelity.json").read_text())
    assert report["verdicts"] and report == json.loads((tmp_path / "one" / "fidelity.json").read_text())


def test_shards_of_every_world_are_refused_beside_engine_or_scene_shards(tmp_path):
    with pytest.raises(TerraInputError, match="shard_processes.all shards every world alike: give it without"):
        settings(tmp_path / "out", "world=both", POLICIES, "shard_processes.all=2", "shard_processes.scene=2")
    with pytest.raises(TerraInputError, match="shard_processes.all must be cores"):
        settings(tmp_path / "out", "world=both", POLICIES, "shard_processes.all=many")
    assert not (tmp_path / "out").exists()


def test_a_shard_is_told_its_shard_and_its_engine_share():
    command = shard_command(["study=gpu", "shard_index=3", "shard_processes.engine=4", "output_dir=o"], 1, 4, 2, 2.0,
                            "engine")
    assert command[:3] == [sys.executable, "-m", "terra.apps.drive"] and "shard_index=3" not in command
    assert command[3:] == ["study=gpu", "output_dir=o", "shard_index=1", "num_shards=4", "num_threads=2",
                           "shard_worlds=engine", "shard_processes.engine=0", "shard_processes.scene=0",
                           "shard_processes.all=0", "progress=false",
                           f"++backend.options.kv_cache_memory_bytes={2 << 30}",
                           "++backend.options.gpu_memory_utilization=0.225"]
    scene = shard_command(["study=gpu"], 0, 6, 2, 2.0, "scene", per_card=4)
    assert not any("backend.options" in part for part in scene)  # no engine to size
    assert ShardProcesses(4, 6, 2.0).groups == {"engine": 4, "scene": 6} and ShardProcesses().groups == {}
    two_a_card = shard_command(["study=gpu"], 5, 8, 2, 2.0, "engine", per_card=2)
    assert two_a_card[-1] == "++backend.options.gpu_memory_utilization=0.45"


def test_engine_shards_are_dealt_over_the_visible_cards(monkeypatch):
    assert engine_cards(6, ["0", "1", "2", "3"]) == ["0", "1", "2", "3", "0", "1"]
    assert engine_cards(2, []) == [None, None] and engine_cards(0, ["0"]) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5")
    assert visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []
