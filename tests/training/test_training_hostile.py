"""Hostile inputs to training and blending (round 4): nothing of the user's is lost, nonsense read from a file is
refused at load with one line naming the file and the tensor, a kill at any instant of a checkpoint save
resumes from the newest complete checkpoint, and one run at a time writes into a run folder.

In-process on tiny models (tests/training/test_train.py's config); the blend's subprocess cases are in
tests/training/test_blend.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as load_numpy, save_file as save_numpy
from safetensors.torch import load_file, save_file

from terra.core.errors import TerraInputError
from terra.core.lock import output_lock
from terra.sim.tokens import TokenizedClips, load_tokens, save_tokens
from terra.training import run as run_module
from terra.training.shards import ShardIndex, read_index, read_shard, write_shard
from tests.conftest import tiny_model
from tests.training.test_train_world_model import dataset, tokens  # noqa: F401 (fixtures: tokens needs dataset)
from tests.training.test_train import train, train_config

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread


@pytest.fixture(scope="module")
def run(tokens, tmp_path_factory) -> Path:
    """A finished tiny run (12 steps, checkpoints at 5 and 10, then the last at 12)."""
    out = tmp_path_factory.mktemp("run") / "run"
    train(train_config(tokens, out, "train.max_steps=12", "train.ckpt_every=5"))
    return out


def step_of(folder: Path) -> int:
    return int(torch.load(folder / "trainer_state.pt", weights_only=True)["step"])


@pytest.mark.parametrize("instant", ["tmp written", "between the renames", "old not yet deleted"])
def test_a_kill_at_any_instant_of_a_save_resumes_from_the_newest_checkpoint(run, tokens, tmp_path, instant):
    """The save writes .checkpoint.tmp/, moves checkpoint/ to .checkpoint.old/, moves .tmp/ in, deletes .old/:
    each state a kill can leave is built by hand from two real checkpoints (steps 5 and 12)."""
    older = tmp_path / "older"
    train(train_config(tokens, older, "train.max_steps=12", "train.max_minutes=0"))  # stops at step 1
    out = tmp_path / "out"
    shutil.copytree(run, out)
    shutil.rmtree(out / "model")
    newest, previous = out / "checkpoint", older / "checkpoint"
    if instant == "tmp written":  # the new one complete beside the old
        shutil.copytree(newest, out / ".checkpoint.tmp")
        shutil.rmtree(newest)
        shutil.copytree(previous, newest)
    elif instant == "between the renames":  # no checkpoint/ at all
        newest.rename(out / ".checkpoint.tmp")
        shutil.copytree(previous, out / ".checkpoint.old")
    else:
        shutil.copytree(previous, out / ".checkpoint.old")
    summary = train(train_config(tokens, out, "train.max_steps=12", "train.ckpt_every=5"))
    assert summary["step"] == 12 and "loss" not in summary  # resumed at 12: no step was trained again
    assert step_of(out / "checkpoint") == 12 and (out / "model" / "config.json").is_file()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".checkpoint")) == []


def test_a_damaged_checkpoint_is_one_line_that_names_the_damage(run, tokens, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(run, out)
    state = out / "checkpoint" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(TerraInputError, match=r"checkpoint in .* is damaged \(trainer_state.pt: .*\); restore it, or "
                                              r"set resume=false"):
        train(train_config(tokens, out, "train.max_steps=20"))
    shutil.rmtree(out)
    shutil.copytree(run, out)
    weights = next((out / "checkpoint").glob("*.distcp"))
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(TerraInputError, match=r"cannot be read \(.*\); the file is damaged") as err:
        train(train_config(tokens, out, "train.max_steps=20"))
    assert "another network shape" not in str(err.value)


def test_a_second_run_into_a_run_folder_stops_at_once(tokens, tmp_path):
    out = tmp_path / "out"
    with output_lock(out / "train_log.jsonl"):  # a run holds the folder
        with pytest.raises(TerraInputError, match=r"output folder .*out is in use by another run \(pid \d+"):
            train(train_config(tokens, out, "train.max_steps=2"))
    assert not (out / "train_log.jsonl").exists()


def test_the_run_folder_leaves_its_inputs_and_the_users_files_alone(tokens, tmp_path):
    start = tmp_path / "run" / "model"  # init inside the run folder: the export would replace it
    tiny_model().save_pretrained(start)
    with pytest.raises(TerraInputError, match=r"output_dir=.*run holds the init checkpoint .*model, which the run "):
        train(train_config(tokens, tmp_path / "run", f"init={start}", "resume=false"))
    with pytest.raises(TerraInputError, match=r"output_dir=.* lies inside the data.tokens"):
        train(train_config(tmp_path, tmp_path / "runs" / "a"))  # data.tokens a folder holding the run
    mine = tmp_path / "mine"
    (mine / "best").mkdir(parents=True)
    (mine / "best" / "notes.txt").write_text("keep")
    with pytest.raises(TerraInputError, match=r"best/ holds files the toolkit did not write \('notes.txt'\)"):
        train(train_config(tokens, mine))
    (tmp_path / "a_file").write_text("")
    with pytest.raises(TerraInputError, match=r"output folder .*a_file is not writable \(.*a_file is not a folder\)"):
        train(train_config(tokens, tmp_path / "a_file"))
    with pytest.raises(TerraInputError, match="export.max_shard_size must be a size from 10KB to 1000GB"):
        train(train_config(tokens, tmp_path / "ok", "export.max_shard_size=lots"))
    assert (mine / "best" / "notes.txt").read_text() == "keep" and not (tmp_path / "ok").exists()


@pytest.mark.parametrize("spoil, message", [
    ("nan", r"tensor model.embed_tokens.weight holds 1 NaN or infinite value\(s\)"),
    ("int32", r"tensor model.embed_tokens.weight is I32, not floating point"),
])
def test_nan_or_integer_starting_weights_are_refused_at_load(tokens, tmp_path, spoil, message):
    start = tmp_path / "start"
    tiny_model(vocab_size=217, codebook_size=216, action_token_id=216, num_image_patches=15,  # the tokens' layout
               num_spatio_embeddings=21, max_position_embeddings=126).save_pretrained(start)
    weights = load_file(start / "model.safetensors")
    key = "model.embed_tokens.weight"
    if spoil == "int32":
        weights[key] = weights[key].int()
    else:
        weights[key][3, 0] = float("nan")
    save_file(weights, start / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(TerraInputError, match=f"world model weights {start}/model.safetensors: {message}"):
        train(train_config(tokens, tmp_path / "out", f"init={start}"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("spoil, message", [
    ("nan action", r"tensor actions holds 1 NaN or infinite value\(s\)"),
    ("code out of range", r"tensor codes holds codes from \d+ to 216, outside the codebook \[0, 216\)"),
    ("float codes", r"tensor codes holds float32 values where image codes"),
])
def test_shards_with_nonsense_are_refused_naming_the_file_and_tensor(tokens, tmp_path, spoil, message):
    clips = load_tokens(tokens)
    folder = tmp_path / "shards"
    index = ShardIndex(clips.codebook_size, clips.grid_shape, clips.image_size, 10.0, "")
    write_shard(folder, index, "train", [(f"c{i}", clips.codes[i], clips.actions[i]) for i in range(10)])
    write_shard(folder, index, "val", [(f"c{i}", clips.codes[i], clips.actions[i]) for i in (10, 11)])
    shard = folder / "train-00000.safetensors"
    tensors = load_numpy(shard)
    with safe_open(str(shard), "np") as kept:  # its header's ids: the content checks come after them
        metadata = kept.metadata()
    if spoil == "nan action":
        tensors["actions"][4, 2, 1] = np.nan
    elif spoil == "code out of range":
        tensors["codes"][7, 1, 2] = 216
    else:
        tensors["codes"] = tensors["codes"].astype(np.float32)
    save_numpy(tensors, shard, metadata=metadata)
    with pytest.raises(TerraInputError, match=f"shard {shard}: {message}"):
        train(train_config(folder, tmp_path / "out"))
    with pytest.raises(TerraInputError, match=f"shard {shard}: {message}"):
        index = read_index(folder)
        read_shard(folder, index, index.shards[0])


def test_an_index_naming_a_missing_shard_or_a_clip_twice_is_refused(tokens, tmp_path):
    clips = load_tokens(tokens)
    folder = tmp_path / "shards"
    index = ShardIndex(clips.codebook_size, clips.grid_shape, clips.image_size, 10.0, "")
    write_shard(folder, index, "train", [(f"c{i}", clips.codes[i], clips.actions[i]) for i in range(6)])
    write_shard(folder, index, "train", [(f"c{i}", clips.codes[i], clips.actions[i]) for i in range(5, 10)])
    with pytest.raises(TerraInputError, match=r"index.json lists clip 'c5' in two shards \(train-00000.safetensors "
                                              r"and train-00001.safetensors\)"):
        read_index(folder)
    raw = json.loads((folder / "index.json").read_text())
    raw["shards"][1]["clips"] = raw["shards"][1]["clips"][1:]
    raw["shards"][1]["file"] = "train-00007.safetensors"
    (folder / "index.json").write_text(json.dumps(raw))
    with pytest.raises(TerraInputError, match=r"lists shard train-00007.safetensors, which is missing from"):
        train(train_config(folder, tmp_path / "out"))
    raw["shards"][1]["file"] = "../../etc/passwd"
    (folder / "index.json").write_text(json.dumps(raw))
    with pytest.raises(TerraInputError, match=r"shard file '../../etc/passwd' of split 'train' is not a shard's name"):
        read_index(folder)


def test_tokenized_clips_with_nonsense_are_refused(tokens, tmp_path):
    clips = load_tokens(tokens)
    actions = clips.actions.copy()
    actions[3, 2, 0, 0] = np.inf
    bad = save_tokens(tmp_path / "bad.safetensors", TokenizedClips(**{**clips.__dict__, "actions": actions}))
    with pytest.raises(TerraInputError, match=r"tokenized clips .*bad.safetensors: tensor actions holds 1 NaN or "):
        load_tokens(bad)


def test_a_diverging_run_stops_before_writing_nan_weights(tokens, tmp_path, monkeypatch):
    real_step, steps = run_module.train_step, []

    def diverging(trainee, optimizer, windows, grad_clip):  # step 3's update turns the weights into NaN
        loss, acc, grad_norm = real_step(trainee, optimizer, windows, grad_clip)
        steps.append(loss)
        if len(steps) == 3:
            with torch.no_grad():
                next(trainee.module.parameters()).fill_(float("nan"))
            loss = torch.full_like(loss, float("nan"))
        return loss, acc, grad_norm

    monkeypatch.setattr(run_module, "train_step", diverging)
    out = tmp_path / "out"
    with pytest.raises(TerraInputError, match=r"training diverged at step 3: the loss is not finite; rerun to "
                                              r"resume from the last checkpoint with a lower train.lr"):
        train(train_config(tokens, out, "train.max_steps=5", "train.ckpt_every=2", "train.log_every=1"))
    assert step_of(out / "checkpoint") == 2 and not (out / "model").exists()  # the last finite weights only
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2]
