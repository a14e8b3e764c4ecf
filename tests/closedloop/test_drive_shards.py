"""terra-drive split by hand (``shard_index`` / ``num_shards``): each shard makes drive k when k % num_shards is its
index, in the same folder with a manifest of its own; together they are the unsharded run, which then drives
nothing again (and with ``world=both`` writes the fidelity report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
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
    assert outcome.exit_code == 0 and "| world | drives | state | failed | undecided |" in outcome.lines[0]
    assert "| model | 2 | undecided |" in outcome.lines[0]  # one scenario: too small to judge
    assert all("0 drives ok, 0 failed, 2 already complete" in line for line in outcome.lines[1:4])
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
