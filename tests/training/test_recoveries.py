"""Recovery clips (terra/sim/recoveries.py) from the dataset to training: their first frames (a context's 3 to all but
the last) are seen from the offset camera and the rest from the car's pose, with the car's poses, actions and routes;
the dataset and the tokens file count the frames seen off the pose; terra-train draws the asked share of its windows
from them (their first frames, always with their routes), trains them only from their first frame back on the pose
on, holds the last clips out and scores them with and without their route."""

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
from terra.sim.recoveries import (CONTEXT_FRAMES, LATERAL_SD_M, MAX_LATERAL_M, MAX_YAW_DEG, camera_offset,
                                   random_recovery)
from terra.sim.renderer import render
from terra.sim.tokens import TokenizedClips, load_tokens, save_tokens
from terra.training.data import WindowSampler, load_training_data, stack_windows
from terra.training.objective import WindowLoss
from terra.training.tokenize import tokenize_dataset
from tests.conftest import tiny_route_model
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


def test_a_recovery_sees_its_first_frames_from_the_offset_camera_and_the_rest_from_the_car():
    """The frames before the clip's count are the scene rendered from the car's pose composed with one offset
    (exactly), the later ones from the car's pose; poses, actions and routes are the long drive's of the same draw."""
    recovery = random_recovery(np.random.default_rng([0, 1]), 8)
    clip = recovery.render(8, 36, 64)
    plain = random_long_drive(np.random.default_rng([0, 1]), 8).render(8, 36, 64)
    off = clip.off_pose_frames
    offset = recovery.camera_offsets[0]
    assert CONTEXT_FRAMES <= off < 8 and f",{off}f):" in recovery.manoeuvre
    assert np.all(recovery.camera_offsets[:off] == offset) and not recovery.camera_offsets[off:].any()
    for t in range(8):
        camera = compose(clip.poses[t], offset) if t < off else clip.poses[t]
        np.testing.assert_array_equal(clip.frames[t], render(recovery.scene, camera, 36, 64))
    np.testing.assert_array_equal(clip.frames[off:], plain.frames[off:])
    assert not np.array_equal(clip.frames[:off], plain.frames[:off])
    for name in ("poses", "actions", "routes"):
        np.testing.assert_array_equal(getattr(clip, name), getattr(plain, name))
    assert recovery.manoeuvre.startswith("recovery(") and recovery.manoeuvre.endswith(plain.manoeuvre)
    assert plain.off_pose_frames == 0


def test_the_frames_off_the_pose_span_a_context_to_all_but_the_last():
    """Over 500 clips of 8 frames every count from 3 to 7 is drawn, each about a fifth of the time (+-0.08: 4.5
    standard deviations each, a false alarm under 1e-4 for a random seed); none outside."""
    counts = np.array([random_recovery(np.random.default_rng([4, i]), 8).camera_offsets.any(-1).sum()
                       for i in range(500)])
    assert set(counts.tolist()) == set(range(CONTEXT_FRAMES, 8))
    assert all(abs(np.mean(counts == k) - 0.2) < 0.08 for k in range(CONTEXT_FRAMES, 8))


def test_camera_offsets_span_their_stated_ranges():
    offsets = np.stack([camera_offset(np.random.default_rng(i)) for i in range(2000)])
    assert not offsets[:, 0].any()
    assert np.abs(offsets[:, 1]).max() <= MAX_LATERAL_M and np.abs(offsets[:, 1]).max() > 0.9 * MAX_LATERAL_M
    assert np.degrees(np.abs(offsets[:, 2])).max() <= MAX_YAW_DEG + 1e-9
    assert 0.5 < np.abs(offsets[:, 1]).mean() / LATERAL_SD_M / np.sqrt(2 / np.pi) < 1.1  # about the stated sd


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
    """scripts/recipes/train_demo.sh recoveries renders 16-frame recovery clips (seed 1: other draws than the drives')
    and encodes them; once their tokens exist the world_model stage passes them as data.recoveries (not before). A
    stand-in PY records the commands."""
    calls, python = tmp_path / "calls", tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nif [ "$1" = "-c" ]; then echo 7; fi\n')
    python.chmod(0o755)
    env = {**os.environ, "PY": str(python), "RUN": str(tmp_path / "run"), "RECOVERY_CLIPS": "40", "WORKERS": "3"}

    def stage(name: str) -> list[list[str]]:
        calls.unlink(missing_ok=True)
        done = subprocess.run(["bash", str(ROOT / "scripts" / "recipes" / "train_demo.sh"), name], env=env,
                              capture_output=True, text=True, timeout=60)
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


def test_the_dataset_and_the_tokens_file_count_the_frames_off_the_pose(tokens):
    drives, recoveries, data = tokens
    assert [clip.off_pose_frames for clip in data] == [CONTEXT_FRAMES] * len(data)  # 4-frame clips: 3
    assert load_tokens(recoveries).off_pose_frames.tolist() == [CONTEXT_FRAMES] * len(data)
    assert not load_tokens(drives).off_pose_frames.any()


def test_recovery_windows_are_trained_from_their_first_frame_on_the_pose(tokens):
    drives, recoveries, _ = tokens
    data = load_training_data(str(drives), 2, str(recoveries)).for_route_slots(4)
    windows = WindowSampler(data.train, FRAMES, 5, 0.5, data.recoveries, 0.5).sample(64)
    recovering = int((windows.first_target_frame > 0).sum())
    assert 10 < recovering < 54  # the recovery windows come first
    assert windows.first_target_frame.tolist() == [CONTEXT_FRAMES] * recovering + [0] * (64 - recovering)
    held = stack_windows(data.val_recoveries, [0, 1], [0, 0], FRAMES)
    assert held.first_target_frame.tolist() == [CONTEXT_FRAMES] * 2
    assert stack_windows(data.val, [0], [0], FRAMES).first_target_frame is None


@pytest.mark.parametrize("first", [[3, 0], [0, 2], [5, 1]])
def test_the_loss_leaves_out_the_frames_before_a_windows_first_target_frame(first):
    """The loss and its gradients equal the cross-entropy of the whole logits over each window's frames from
    max(1, first) on (float64); a loss over every frame (what an unmasked objective computes) differs."""
    model = tiny_route_model().double()
    config = model.config
    frames, patches = config.num_temporal_embeddings, config.num_image_patches
    span = config.num_spatio_embeddings
    gen = torch.Generator().manual_seed(sum(first))
    ids = torch.randint(config.codebook_size, (2, frames * patches), generator=gen)
    actions = torch.randn(2, frames * 6, 3, generator=gen, dtype=torch.float64)
    objective = WindowLoss(model, frames, False, 64, None)
    loss, _ = objective(ids, actions, None, torch.tensor(first))
    loss.backward()
    fused = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(input_ids=ids, actions=actions).logits
    terms = []
    for b, f in enumerate(first):
        for t in range(max(1, f), frames):
            terms.append(torch.nn.functional.cross_entropy(
                logits[b, t * span - 1:t * span + patches - 1], ids[b, t * patches:(t + 1) * patches],
                reduction="none"))
    reference = torch.cat(terms).mean()
    reference.backward()
    torch.testing.assert_close(loss, reference, rtol=1e-10, atol=0)
    for mine, theirs in zip(fused, (p.grad for p in model.parameters())):
        torch.testing.assert_close(mine, theirs, rtol=1e-7, atol=1e-10)
    with torch.no_grad():
        unmasked, _ = objective(ids, actions)
    if max(first) > 1:
        assert abs(float(unmasked) - float(reference.detach())) > 1e-4


def test_recovery_clips_without_frames_off_the_pose_or_off_it_for_a_whole_window_are_one_line(tokens, tmp_path):
    drives, recoveries, _ = tokens
    clips = load_tokens(recoveries)
    old = save_tokens(tmp_path / "old.safetensors", TokenizedClips(**{**clips.__dict__, "off_pose_frames": None}))
    with pytest.raises(TerraInputError, match="holds clips with no frame seen from off the car's pose .* render them "
                                              "with terra-make-dataset recipe=recoveries and tokenize them again"):
        load_training_data(str(drives), 2, str(old))
    data = load_training_data(str(drives), 2, str(recoveries))
    with pytest.raises(TerraInputError, match="seen from off the car's pose for 3 frames, a whole training window "
                                              "of 3 or more; render them with num_frames=3"):
        WindowSampler(data.train, 3, 0, 0.0, data.recoveries, 0.3)
    with pytest.raises(TerraInputError, match="a recovery clip needs more than 3 frames"):
        write_dataset(tmp_path / "short", 2, 3, H, W, recipe="recoveries", progress=False)
    bad = save_tokens(tmp_path / "bad.safetensors",
                      TokenizedClips(**{**clips.__dict__, "off_pose_frames": clips.off_pose_frames + FRAMES}))
    with pytest.raises(TerraInputError, match=f"tensor off_pose_frames is not {len(clips.codes)} int32 counts in "
                                              f"\\[0, {FRAMES}\\]; the file is damaged"):
        load_tokens(bad)
