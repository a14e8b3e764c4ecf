"""``python -m terra.closedloop.study.processes``: one terra-drive command as shards in processes of this machine,
then its manifest, in the true world on the CPU (no model to load)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def shards(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "terra.closedloop.study.processes", *args], capture_output=True,
                          text=True, timeout=300)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_shards_split_the_drives_and_the_run_records_them_once(tmp_path):
    out = tmp_path / "drives"
    done = shards("--processes", "2", "--", "world=truth", "policies=[lane_follower,constant_speed]",
                  "num_scenarios=3", "num_steps=3", "videos=false", f"output_dir={out}")
    assert done.returncode == 0, done.stdout + done.stderr
    first, second = (lines(out / f"manifest.shard-{i}-of-2.jsonl") for i in range(2))
    ids = {record["drive"] for record in first}, {record["drive"] for record in second}
    assert ids[0] and ids[1] and not ids[0] & ids[1] and len(ids[0] | ids[1]) == 6  # every drive once
    assert all(record["status"] == "ok" for record in first + second)
    final = lines(out / "manifest.jsonl")  # the unsharded run: the shards' drives, none driven again
    assert {record["drive"] for record in final} == ids[0] | ids[1]
    assert all(record["status"] == "skipped" for record in final)
    assert sorted(path.name for path in out.glob("*.log")) == []  # the shards' output stays out of the run's folder


def test_a_refused_setting_stops_before_the_report(tmp_path):
    out = tmp_path / "drives"
    done = shards("--processes", "2", "--", "world=truth", "num_steps=0", f"output_dir={out}")
    assert done.returncode == 1
    assert "shard 0 (all worlds) ended with exit code 2: terra-drive: error: num_steps" in done.stderr
    assert not (out / "manifest.jsonl").exists()
    assert "output_dir" in shards("--processes", "2", "--", "world=truth").stderr  # every shard needs the same one
    assert shards("--processes", "2", "--", "shard_index=1", f"output_dir={out}").returncode == 2
    assert shards("--processes", "2", "--", "shard_worlds=scene", f"output_dir={out}").returncode == 2


def test_the_scene_worlds_drive_beside_the_engine_worlds_then_the_report(tmp_path):
    out = tmp_path / "study"
    done = shards("--processes", "1", "--scene-processes", "2", "--", "world=both", "policies=[constant_speed]",
                  "num_scenarios=2", "num_steps=2", "controls=[frozen,zero_actions]", "backend=hf", "videos=false",
                  f"output_dir={out}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 shards ended" in done.stdout and "the model told from frozen by" in done.stdout
    engine = {w: lines(out / w / "manifest.jsonl") for w in ("model", "zero_actions")}  # its one shard's, rewritten
    for world in ("truth", "frozen"):  # the scene worlds: two shards, one drive each
        made = [lines(out / world / f"manifest.shard-{i}-of-2.jsonl") for i in range(2)]
        assert [len(m) for m in made] == [1, 1] and all(r["status"] == "ok" for m in made for r in m)
        assert not list((out / "model").glob("manifest.shard-*"))  # nor did an engine shard drive a scene world
    assert all(len(records) == 2 and all(r["status"] == "skipped" for r in records) for records in engine.values())
    report = json.loads((out / "fidelity.json").read_text())
    assert [v["world"] for v in report["verdicts"]] == ["model", "frozen", "zero_actions"]
