"""Hostile inputs to the closed loop (terra-drive, its drivers and agents, the gymnasium envs), by class:

* one output folder, one app: a drive run into a rollout folder and the reverse are refused, nothing written;
* user code (policies, NAVSIM agents, gRPC drivers) behind one boundary: ``sys.exit``, exceptions and hangs in
  build, reset, plan and close fail that drive only, with one line naming the policy and the call; observations
  are read-only, so the recorded video is what the world made;
* deadlines: every gRPC call under ``policy_timeout_s``; a close that hangs after a good drive is a warning; a drive
  ends when the car leaves the scene;
* the gymnasium envs refuse bad scenarios, options, actions and seeds as gymnasium's own do, need ``reset()`` after
  the end, and step all or nothing;
* nonsense refused before any work (exit 2, one line, nothing written, no Hydra folder);
* one line per problem on stderr: no gRPC traceback or C-core lines, no argparse usage, no RuntimeWarning.

Everything runs on the synthetic world's true frames (``world=truth``: the renderer, fast) and tiny drives; a hang
test uses a small ``policy_timeout_s`` and bounds how long the drive took.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from terra.batch.config import APP as ROLLOUT
from terra.config.manifest import Manifest
from terra.config.output_dir import claim_output_dir
from terra.core.atomic import MARKER, owner

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)
TRUTH = ["world=truth", "num_scenarios=1", "num_steps=2", "policies=[constant_speed]", "progress=false"]


def app(module: str, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"terra.apps.{module}", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=ENV)


def refused(result: subprocess.CompletedProcess, prog: str, text: str) -> str:
    """The one line of a run refused before any work (exit 2, nothing on stdout)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and text in lines[0], result.stderr
    assert not result.stdout.strip(), result.stdout
    return lines[0]


# ---------------------------------------------------------------- one output folder, one app


def test_drives_and_rollouts_never_share_a_folder(tmp_path):
    rollout, legacy = tmp_path / "rollout", tmp_path / "legacy"
    claim_output_dir(rollout, "output.dir", files=["manifest.jsonl"], app=ROLLOUT).record()
    legacy.mkdir()  # a rollout folder from before owners were recorded: its manifest says whose it is
    (legacy / MARKER).write_text(json.dumps({"written_by": "terra-world-model", "names": ["manifest.jsonl"]}))
    for folder in (rollout, legacy):
        manifest = Manifest(folder / "manifest.jsonl")
        manifest.add({"sample_id": "a", "status": "ok"})
        manifest.close()
    for folder in (rollout, legacy):
        before = sorted(p.name for p in folder.iterdir()), (folder / "manifest.jsonl").read_bytes()
        result = app("drive", *TRUTH, f"output_dir={folder}", cwd=tmp_path)
        refused(result, "terra-drive", f"output_dir={folder} holds the outputs of terra-rollout")
        assert (sorted(p.name for p in folder.iterdir()), (folder / "manifest.jsonl").read_bytes()) == before
    drives = tmp_path / "drives"
    assert app("drive", *TRUTH, f"output_dir={drives}", cwd=tmp_path).returncode == 0
    assert owner(drives) == "terra-drive"
    (tmp_path / "s.jsonl").write_text('{"sample_id": "a", "context": "ctx", "manoeuvre": "straight"}\n')
    before = sorted(p.name for p in drives.iterdir())
    result = app("rollout", "samples=s.jsonl", f"output.dir={drives}", cwd=tmp_path)
    refused(result, "terra-rollout", f"output.dir={drives} holds the outputs of terra-drive")
    assert sorted(p.name for p in drives.iterdir()) == before
