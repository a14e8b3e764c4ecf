"""terra-drive with ``executor=ray`` (terra/closedloop/recording/ray_executor.py) on a local Ray cluster of 2 CPUs, the
demo model on the Transformers backend: two actors write what one process writes, each drive recorded once by the
driver; an actor that dies mid-share is restarted and its share runs again; a share that keeps losing its actor
fails with the cause. The fidelity study on Ray: tests/closedloop/study/test_study_ray.py."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
from terra.closedloop.study.drives import terra_drive as drive
from terra.closedloop.policies.builtin import reference_policy
from terra.closedloop.study.settings import terra_drive_settings
from terra.config.manifest import read_manifest

pytestmark = pytest.mark.slow
ARGS = ("num_scenarios=2", "policies=[lane_follower,constant_speed]", "num_steps=2", "max_concurrent=1")


def settings(out: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("drive", overrides=["num_threads=1", "backend=hf", "device=cpu", "progress=false", *ARGS,
                                          *overrides])
    return terra_drive_settings(cfg, out)


def comparable(path: Path) -> dict:
    content = json.loads(path.read_text())
    return {k: v for k, v in content.items() if k != "policy_s"}


def test_two_actors_write_what_one_process_writes(tmp_path, ray_cluster, capsys):
    local = settings(tmp_path / "local")
    assert drive(local).exit_code == 0
    on_ray = settings(tmp_path / "ray", "executor=ray", "ray.num_actors=2")
    outcome = drive(on_ray)
    assert outcome.exit_code == 0 and "4 drives ok" in outcome.lines[0], outcome.lines
    records = read_manifest(tmp_path / "ray" / "manifest.jsonl")
    assert sorted(r["drive"] for r in records) == sorted(local.drive_ids)  # each exactly once
    assert {r["actor"] for r in records} == {0, 1} and all(r["status"] == "ok" for r in records)
    for drive_id in local.drive_ids:  # one drive at a time in either: the same frames, plans and poses
        assert comparable(tmp_path / "ray" / f"{drive_id}.json") == comparable(tmp_path / "local" / f"{drive_id}.json")
        video = f"{drive_id}.mp4"
        assert (tmp_path / "ray" / video).read_bytes() == (tmp_path / "local" / video).read_bytes()
    summary = json.loads((tmp_path / "ray" / "manifest.summary.json").read_text())
    assert summary["frames"] == 8 and summary["timings_s"]["generate"] > 0 and summary["plan_s"]["count"] == 8
    again = drive(on_ray)  # resumed on the actors: nothing driven again
    assert "0 drives ok, 0 failed, 4 already complete" in again.lines[0]
    video = tmp_path / "ray" / f"{local.drive_ids[0]}.mp4"
    video.write_bytes(video.read_bytes()[:64])  # cut short: made again, and said so
    capsys.readouterr()
    again = drive(on_ray)
    assert "1 drive redone: its files are not whole" in capsys.readouterr().out
    assert "1 drives ok, 0 failed, 3 already complete" in again.lines[0] and video.stat().st_size > 64


def test_a_dead_actor_restarts_and_its_share_runs_again(tmp_path, ray_cluster):
    marker = tmp_path / "died-once"

    def dying():  # the actor's process ends at the first plan of its first try (defined here: pickled by value)
        policy = reference_policy("lane_follower")()
        plan = policy.plan

        def plan_or_die(observation):
            if not marker.exists():
                marker.write_text("x")
                os._exit(1)
            return plan(observation)

        policy.plan = plan_or_die
        return policy

    base = settings(tmp_path / "out", "executor=ray", "ray.num_actors=1", "policies=[lane_follower]")
    outcome = drive(dataclasses.replace(base, policies={"lane_follower": dying}))
    assert outcome.exit_code == 0, outcome.lines
    records = read_manifest(tmp_path / "out" / "manifest.jsonl")
    assert [(r["status"], r["attempts"]) for r in records] == [("ok", 2), ("ok", 2)]

    never = settings(tmp_path / "never", "executor=ray", "ray.num_actors=1", "policies=[lane_follower]",
                     "ray.max_retries=1")

    def always_dying():
        os._exit(1)

    outcome = drive(dataclasses.replace(never, policies={"lane_follower": always_dying}))
    assert outcome.exit_code == 1
    records = read_manifest(tmp_path / "never" / "manifest.jsonl")
    assert len(records) == 2 and all(r["status"] == "failed" and "its Ray actor died 2 times" in r["error"]
                                     for r in records)

