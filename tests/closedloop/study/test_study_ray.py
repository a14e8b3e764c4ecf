"""The fidelity study on a Ray cluster (``executor=ray``: terra/closedloop/study/ray_shards.py) on a local cluster of 2
CPUs, the demo model on the Transformers backend: an engine shard and two scene shards as Ray tasks, the
exploitability study beside them and the report on a worker write the report of the study in one process; a worker
killed mid-shard has its shard run again, and with no retry left the run stops in one line and the same command again
resumes it, every finished drive kept."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
from terra.closedloop.policies.builtin import reference_policy
from terra.closedloop.study.drives import terra_drive as drive
from terra.closedloop.study.processes import ShardProcesses
from terra.closedloop.study.ray_shards import ray_groups, task_options
from terra.closedloop.study.settings import StudySettings, study_shard, terra_drive_settings
from terra.config.manifest import read_manifest
from terra.core.errors import TerraInputError

pytestmark = pytest.mark.slow
STUDY = ("num_threads=1", "backend=hf", "device=cpu", "progress=false", "world=both", "num_scenarios=2",
         "policies=[lane_follower,constant_speed]", "num_steps=2", "max_concurrent=1", "controls=[frozen,zero_actions]",
         "num_control_scenarios=1", "videos=false", "writer_processes=0")
RAY = ("executor=ray", "shard_processes.engine=1", "shard_processes.scene=2")
WORLDS = ("model", "truth", "frozen", "zero_actions")


def settings(out: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("drive", overrides=[*STUDY, *overrides])
    return terra_drive_settings(cfg, out)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """The study in one process, the exploitability study included."""
    out = tmp_path_factory.mktemp("local")
    assert drive(settings(out, "exploitability=true")).exit_code == 0
    return out


def test_the_shards_per_gpu_and_what_each_task_asks_of_the_cluster():
    assert ray_groups(ShardProcesses(4, 6, 2.0), 2, 240) == ({"engine": 8, "scene": 12}, 4)  # study=gpu on 2 GPUs
    assert ray_groups(ShardProcesses(), 3, 240) == ({"all": 3}, 1)  # one shard of every world per GPU
    assert ray_groups(ShardProcesses(0, 2), 1, 240) == ({"engine": 1, "scene": 2}, 1)
    assert ray_groups(ShardProcesses(4, 6), 2, 5) == ({"engine": 5, "scene": 5}, 4)  # none without drives
    cluster = SimpleNamespace(options={"num_cpus": 2, "num_gpus": 1, "max_restarts": 3}, settings=SimpleNamespace(
        max_retries=2))
    assert task_options(cluster, 4) == {"engine": {"num_cpus": 2, "max_retries": 2, "num_gpus": 0.25, "max_calls": 1},
                                        "scene": {"num_cpus": 2, "max_retries": 2, "num_gpus": 0}}


def test_a_ray_shard_is_the_shard_its_own_command_checks(tmp_path):
    whole = settings(tmp_path, "executor=ray", "exploitability=true")
    assert isinstance(whole, StudySettings) and whole.exploitability  # the exploitability study on Ray too
    shard = study_shard(whole, "scene", 1, 2)
    own = settings(tmp_path, "shard_index=1", "num_shards=2", "shard_worlds=scene")
    assert (shard.drive.drives, shard.drive.worlds, shard.folders) == (own.drive.drives, own.drive.worlds, own.folders)
    assert shard.drive.executor == "local" and not shard.exploitability and not shard.folders.report
    with pytest.raises(TerraInputError, match="shard_processes and executor=ray make the study's shards themselves"):
        settings(tmp_path, "executor=ray", "num_shards=2")
    for device in ("cuda", "cpu"):  # study=gpu on Ray: the cluster's GPUs, counted as it is joined; not the CPU
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            cfg = compose("drive", overrides=["study=gpu", "executor=ray", f"device={device}", "num_threads=1"])
        if device == "cpu":
            with pytest.raises(TerraInputError, match="study=gpu runs the study's world model on a CUDA GPU, but "
                                                      "device=cpu was asked for"):
                terra_drive_settings(cfg, tmp_path / "gpu", preset="gpu")
        else:
            assert terra_drive_settings(cfg, tmp_path / "gpu", preset="gpu").drive.executor == "ray"


def records(out: Path) -> dict[str, dict]:
    """Every drive's JSON record of every world, without its timings."""
    return {f"{world}/{path.name}": {k: v for k, v in json.loads(path.read_text()).items() if k != "policy_s"}
            for world in WORLDS for path in sorted((out / world).glob("*__*.json"))}


def report(out: Path, exploitability: bool = True) -> dict:
    found = json.loads((out / "fidelity.json").read_text())
    return found if exploitability else {k: v for k, v in found.items() if k != "exploitability"}


def test_the_study_on_ray_writes_the_report_of_one_process(tmp_path, ray_cluster, one_process):
    outcome = drive(settings(tmp_path, *RAY, "exploitability=true"))
    assert outcome.exit_code == 0, outcome.lines
    assert outcome.lines[0].startswith("terra-drive: 3 Ray shards (1 engine, 2 scene) ended in")
    assert outcome.lines[-1].startswith("Fidelity verdict")  # the report step's lines, its verdict last
    assert report(tmp_path) == report(one_process) and report(tmp_path)["exploitability"]["tuned"]
    assert (tmp_path / "fidelity.md").read_text() == (one_process / "fidelity.md").read_text()
    assert records(tmp_path) == records(one_process) and len(records(tmp_path)) == 12
    ids = settings(tmp_path / "ids").folders.drive_ids  # the scene shards' share: drive k to shard k % 2
    for world in ("truth", "frozen"):
        assert [[r["drive"] for r in read_manifest(tmp_path / world / f"manifest.shard-{i}-of-2.jsonl")]
                for i in range(2)] == [ids[world][0::2], ids[world][1::2]]
    for world in WORLDS:  # the report step drove nothing again: the engine shard drove the model's worlds
        assert {r["status"] for r in read_manifest(tmp_path / world / "manifest.jsonl")} == {"skipped"}


def killing(base, marker: Path, once: bool):
    """``base`` with constant_speed killing its worker's process as its drive of the last scenario starts (``once``:
    only the first such drive, of whichever shard comes first)."""
    last = base.drive.scenarios.ids[-1]

    def dying():  # defined here: pickled by value into the workers
        policy = reference_policy("constant_speed")()
        reset = policy.reset

        def reset_or_die(scenario):
            if scenario.id == last:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))  # one process only, however many race
                    os._exit(1)
                except FileExistsError:
                    if not once:
                        os._exit(1)
            return reset(scenario)

        policy.reset = reset_or_die
        return policy

    return dataclasses.replace(base, drive=dataclasses.replace(
        base.drive, policies={**base.drive.policies, "constant_speed": dying}))


def test_a_killed_worker_reruns_its_shard_and_a_lost_shard_resumes_on_the_same_command(tmp_path, ray_cluster,
                                                                                      one_process):
    out = tmp_path / "out"
    lost = killing(settings(out, *RAY, "ray.max_retries=0"), tmp_path / "lost", once=False)
    with pytest.raises(TerraInputError, match=r"^shard \d of \d \((engine|scene) worlds\) lost its Ray worker \(.*\); "
                                              "the same command again resumes the study, every finished drive kept$"):
        drive(lost)
    assert not (out / "fidelity.json").exists()
    kept = {path: path.stat().st_mtime_ns for world in WORLDS for path in (out / world).glob("*__*.json")}
    assert kept  # the first scenario's drives, finished before the workers died
    again = killing(settings(out, *RAY, "ray.max_retries=1"), tmp_path / "again", once=True)
    outcome = drive(again)  # a worker dies once more: its shard runs again on Ray, then the report
    assert outcome.exit_code == 0 and (tmp_path / "again").exists(), outcome.lines
    assert {path: path.stat().st_mtime_ns for path in kept} == kept  # not driven again
    assert report(out, exploitability=False) == report(one_process, exploitability=False)
    assert records(out) == records(one_process)
