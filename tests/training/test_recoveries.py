"""Recovery clips (terra/sim/recoveries.py) from the dataset to training: their context frames are seen from the
offset camera and the rest from the car's pose, with the car's poses, actions and routes; terra-train draws the
asked share of its windows from them (their first frames, always with their routes), holds the last clips out and
scores them with and without their route."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from terra.core.errors import TerraInputError
from terra.inputs.ego_motion import compose
from terra.sim.dataset import ClipDataset, write_dataset
from terra.sim.long_drives import random_long_drive
from terra.sim.recoveries import CONTEXT_FRAMES, MAX_LATERAL_M, MAX_YAW_DEG, camera_offset, random_recovery
from terra.sim.renderer import render
from terra.sim.tokens import save_tokens
from terra.training.data import WindowSampler, load_training_data
from terra.training.tokenize import tokenize_dataset
from tests.training.test_train import train, train_config
from tests.training.test_train_world_model import H, W, PoolTokenizer

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread

ROOT = Path(__file__).resolve().parents[2]
FRAMES = 4  # the tiny model's window (tests/training/test_train.py)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """Long drives and recovery clips of the tiny sizes, tokenized: (drives file, recoveries file, recoveries)."""
    root = tmp_path_factory.mktemp("recoveries")
    out = {}
    for recipe, clips, frames in (("long_drives", 6, 8), ("recoveries", 10, FRAMES)):
        data = ClipDataset(write_dataset(root / recipe, clips, frames, H, W, seed=3, clips_per_shard=16,
                                         recipe=recipe, progress=False))
        out[recipe] = (save_tokens(root / f"{recipe}.safetensors", tokenize_dataset(
            data, PoolTokenizer(), batch_size=16, progress=False)), data)
    return out["long_drives"][0], out["recoveries"][0], out["recoveries"][1]


def test_a_recovery_sees_its_context_from_the_offset_camera_and_the_rest_from_the_car():
    """Frames 0-2 are the scene rendered from the car's pose composed with one offset (exactly), the later ones from
    the car's pose; poses, actions and routes are the long drive's of the same draw."""
    recovery = random_recovery(np.random.default_rng([0, 1]), 6)
    clip = recovery.render(6, 36, 64)
    plain = random_long_drive(np.random.default_rng([0, 1]), 6).render(6, 36, 64)
    offset = recovery.camera_offsets[0]
    assert np.all(recovery.camera_offsets[:CONTEXT_FRAMES] == offset) and not recovery.camera_offsets[3:].any()
    for t in range(6):
        camera = compose(clip.poses[t], offset) if t < CONTEXT_FRAMES else clip.poses[t]
        np.testing.assert_array_equal(clip.frames[t], render(recovery.scene, camera, 36, 64))
    np.testing.assert_array_equal(clip.frames[3:], plain.frames[3:])
    assert not np.array_equal(clip.frames[:3], plain.frames[:3])
    for name in ("poses", "actions", "routes"):
        np.testing.assert_array_equal(getattr(clip, name), getattr(plain, name))
    assert recovery.manoeuvre.startswith("recovery(") and recovery.manoeuvre.endswith(plain.manoeuvre)


def test_camera_offsets_span_their_stated_ranges():
    offsets = np.stack([camera_offset(np.random.default_rng(i)) for i in range(2000)])
    assert not offsets[:, 0].any()
    assert np.abs(offsets[:, 1]).max() <= MAX_LATERAL_M and np.abs(offsets[:, 1]).max() > 0.9 * MAX_LATERAL_M
    assert np.degrees(np.abs(offsets[:, 2])).max() <= MAX_YAW_DEG + 1e-9
    assert 0.5 < np.abs(offsets[:, 1]).mean() / 0.6 / np.sqrt(2 / np.pi) < 1.1  # about the stated sd


def test_a_share_of_windows_are_recovery_clips_first_frames_with_their_routes(tokens):
    """train.recovery_share 0.3 over 4,000 windows lands within +-0.03 (4.1 standard deviations: a correct sampler
    fails with probability 4e-5 for a random seed); 0.2 lands there with probability < 1e-9 and does not. Recovery
    windows are their clips' frames 0..W-1 and never lose their route; the others are blanked as before."""
    drives, recoveries, _ = tokens
    data = load_training_data(str(drives), 2, str(recoveries)).for_route_slots(4)
    first = {tuple(data.recoveries.window(i, 0, FRAMES)[0].flatten().tolist()) for i in range(len(data.recoveries))}

    def drawn(share: float) -> tuple[torch.Tensor, torch.Tensor]:
        windows = WindowSampler(data.train, FRAMES, 5, 0.5, data.recoveries, share).sample(4000)
        codes = windows.codes.reshape(4000, -1)
        from_recoveries = torch.tensor([tuple(c.tolist()) in first for c in codes])
        blank = torch.isnan(windows.routes).reshape(4000, FRAMES, 4, 3)[:, 0].all(-1).all(-1)
        return from_recoveries, blank

    picked, blank = drawn(0.3)
    assert abs(picked.float().mean().item() - 0.3) < 0.03
    assert abs(drawn(0.2)[0].float().mean().item() - 0.3) >= 0.03
    assert not blank[picked].any() and abs(blank[~picked].float().mean().item() - 0.5) < 0.05
    assert not drawn(0.0)[0].any()


def test_recovery_clips_are_held_out_and_scored_with_and_without_their_route(tokens, tmp_path):
    drives, recoveries, _ = tokens
    data = load_training_data(str(drives), 2, str(recoveries))
    assert (len(data.recoveries), len(data.val_recoveries)) == (8, 2)
    train(train_config(drives, tmp_path, f"data.recoveries={recoveries}", "net.num_route_tokens=4",
                       "train.max_steps=20", "train.eval_every=20"))
    rows = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert {"val_loss", "val_loss_no_route", "val_recovery_loss", "val_recovery_loss_no_route"} <= set(rows[-1])
    assert all(np.isfinite(rows[-1][key]) for key in ("val_recovery_loss", "val_recovery_loss_no_route"))


@pytest.mark.parametrize("setting, message", [
    ("net.num_route_tokens=0", "this model has no route slots; set net.num_route_tokens"),
    ("data.recoveries=/nowhere.safetensors", "data.recoveries='/nowhere.safetensors' is not a file"),
])
def test_recoveries_a_run_cannot_use_are_one_line(tokens, tmp_path, setting, message):
    drives, recoveries, _ = tokens
    with pytest.raises(TerraInputError, match=message):
        train(train_config(drives, tmp_path, f"data.recoveries={recoveries}", setting, "train.max_steps=2"))


def test_recovery_clips_shorter_than_the_window_are_one_line(tokens):
    drives, recoveries, _ = tokens
    data = load_training_data(str(drives), 2, str(recoveries))
    with pytest.raises(TerraInputError, match=f"clips of {FRAMES} frames, shorter than the training window of 6"):
        WindowSampler(data.train, 6, 0, 0.0, data.recoveries, 0.3)


def test_train_demo_renders_recoveries_and_the_world_model_stage_trains_on_them(tmp_path):
    """scripts/train_demo.sh recoveries renders 16-frame recovery clips (seed 1: other draws than the drives') and
    encodes them; once their tokens exist the world_model stage passes them as data.recoveries (not before). A
    stand-in PY records the commands."""
    calls, python = tmp_path / "calls", tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nif [ "$1" = "-c" ]; then echo 7; fi\n')
    python.chmod(0o755)
    env = {**os.environ, "PY": str(python), "RUN": str(tmp_path / "run"), "RECOVERY_CLIPS": "40", "WORKERS": "3"}

    def stage(name: str) -> list[list[str]]:
        calls.unlink(missing_ok=True)
        done = subprocess.run(["bash", str(ROOT / "scripts" / "train_demo.sh"), name], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [line.split() for line in calls.read_text().splitlines()]

    render, encode = stage("recoveries")
    assert render[:2] == ["-m", "terra.apps.make_dataset"] and {"recipe=recoveries", "num_frames=16", "seed=1",
                                                               "num_clips=40", "workers=3"} <= set(render)
    assert encode[:2] == ["-m", "terra.apps.tokenize_dataset"]
    recoveries = tmp_path / "run" / "recoveries.safetensors"
    assert f"out={recoveries}" in encode
    assert not any(arg.startswith("data.recoveries=") for arg in stage("world_model")[0])
    recoveries.parent.mkdir(parents=True, exist_ok=True)
    recoveries.write_bytes(b"")
    run = stage("world_model")[0]
    assert f"data.recoveries={recoveries}" in run


def test_without_recovery_clips_a_run_draws_the_windows_it_always_drew(tokens):
    """No recovery clips, no extra draw: the windows and their blanked routes follow the generator exactly as before
    recovery clips existed (a checkpoint's sampler state resumes the same windows)."""
    drives, _, _ = tokens
    clips = load_training_data(str(drives), 2).for_route_slots(4).train
    windows = WindowSampler(clips, FRAMES, 9, 0.5, None, 0.3).sample(64)
    generator = torch.Generator().manual_seed(9)
    counts = (clips.lengths - FRAMES + 1).clamp(min=0)
    ends = torch.cumsum(counts, 0)
    picks = torch.randint(int(ends[-1]), (64,), generator=generator)
    clip = torch.searchsorted(ends, picks, right=True)
    start = picks - (ends[clip] - counts[clip])
    blank = torch.rand(64, generator=generator) < 0.5
    expected = torch.stack([clips.window(c, s, FRAMES)[0] for c, s in zip(clip.tolist(), start.tolist())])
    assert torch.equal(windows.codes, expected.flatten(1).long())
    assert torch.equal(torch.isnan(windows.routes).reshape(64, -1).all(-1), blank)
