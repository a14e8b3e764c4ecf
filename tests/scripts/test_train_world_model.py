"""Tokenizing a clip dataset and training the world model on it (tiny sizes, CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from terra.config.checks import TerraInputError
from terra.models import LlamaActionForCausalLM
from terra.sim.dataset import ClipDataset, write_dataset
from terra.sim.tokens import TokenizedClips, load_tokens, save_tokens
from tests.conftest import load_script

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread


ROOT = Path(__file__).resolve().parents[2]
H, W = 24, 40


tokenize_script = load_script("tokenize_dataset")
train_script = load_script("train_world_model")


class PoolTokenizer:
    """Stand-in tokenizer: 8x8 average pooling, each colour channel quantised to 6 levels (216 codes)."""

    codebook_size = 216
    image_size = (H, W)
    grid_shape = (H // 8, W // 8)
    device = torch.device("cpu")

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        levels = ((F.avg_pool2d(images, 8) + 1) / 2 * 6).long().clamp(0, 5)  # [B, 3, h, w]
        return levels[:, 0] * 36 + levels[:, 1] * 6 + levels[:, 2]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> ClipDataset:
    out = tmp_path_factory.mktemp("clips") / "ds"
    return ClipDataset(write_dataset(out, num_clips=12, num_frames=6, height=H, width=W, seed=5,
                                     clips_per_shard=5, workers=1, progress=False))


@pytest.fixture(scope="module")
def tokens(dataset, tmp_path_factory) -> Path:
    clips = tokenize_script.tokenize_dataset(dataset, PoolTokenizer(), batch_size=7, progress=False)
    return save_tokens(tmp_path_factory.mktemp("tokens") / "tokens.safetensors", clips)


def train_config(tokens: Path, out: Path, *overrides: str):
    """The real conf/train_world_model.yaml with a tiny network and the given overrides."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("train_world_model", overrides=[
            f"data.tokens={tokens}", f"output_dir={out}", "data.val_clips=2",
            "net.hidden_size=64", "net.intermediate_size=128", "net.num_hidden_layers=2",
            "net.num_attention_heads=1", "net.num_key_value_heads=1", "net.num_temporal_embeddings=4",
            "train.batch_size=8", "train.lr=3e-3", "train.warmup_steps=5", "train.log_every=5",
            "train.eval_every=20", "train.ckpt_every=20", "train.device=cpu", "export.dtype=float32",
            *overrides,
        ])


def test_tokenize_dataset_matches_direct_encoding(dataset, tokens):
    clips = load_tokens(tokens)
    assert clips.codes.shape == (12, 6, 3, 5) and clips.actions.shape == (12, 6, 6, 3)
    assert clips.codebook_size == 216 and clips.image_size == (H, W) and clips.grid_shape == (3, 5)
    tok = PoolTokenizer()
    for i in (0, 7, 11):
        clip = dataset[i]
        images = torch.from_numpy(clip.frames).permute(0, 3, 1, 2).float() / 127.5 - 1
        np.testing.assert_array_equal(clips.codes[i], tok.encode(images).numpy())
        np.testing.assert_array_equal(clips.actions[i], clip.actions)
        np.testing.assert_array_equal(clips.poses[i], clip.poses)
    assert len(np.unique(clips.codes)) > 10


def test_tokenize_script_uses_a_saved_tokenizer(dataset, tmp_path):
    from tokenizer import LFQTokenizer

    tok = LFQTokenizer({"encoder_decoder_config": {"ch": 32, "ch_mult": [1, 1, 2], "num_res_blocks": 1,
                                                   "z_channels": 6}, "image_size": [H, W]}).eval()
    tok.save_pretrained(tmp_path / "tok")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("tokenize_dataset", overrides=[
            f"dataset={dataset.path}", f"tokenizer_path={tmp_path / 'tok'}", f"out={tmp_path / 'codes.safetensors'}",
            "batch_size=16", "device=cpu"])
    tokenize_script.run(cfg)
    clips = load_tokens(tmp_path / "codes.safetensors")
    assert clips.codes.shape == (12, 6, 6, 10) and clips.codebook_size == 64 and clips.tokenizer == str(tmp_path / "tok")
    images = torch.from_numpy(dataset[3].frames).permute(0, 3, 1, 2).float() / 127.5 - 1
    np.testing.assert_array_equal(clips.codes[3], tok.encode(images).numpy())
    cfg.tokenizer_path = str(tmp_path / "missing")
    with pytest.raises(TerraInputError, match="tokenizer_path"):
        tokenize_script.run(cfg)


def test_tokenize_rejects_a_tokenizer_of_another_size(dataset):
    class Wrong(PoolTokenizer):
        image_size = (32, 32)

    with pytest.raises(TerraInputError, match="render the dataset"):
        tokenize_script.tokenize_dataset(dataset, Wrong(), progress=False)


def test_tokens_round_trip_keeps_large_codebooks(tmp_path):
    codes = np.random.default_rng(0).integers(0, 2**18, (2, 3, 2, 2))
    clips = TokenizedClips(codes=codes, actions=np.zeros((2, 3, 6, 3), np.float32), poses=np.zeros((2, 3, 3)),
                           codebook_size=2**18, image_size=(32, 32), source="x", tokenizer="t")
    back = load_tokens(save_tokens(tmp_path / "t.safetensors", clips))
    np.testing.assert_array_equal(back.codes, codes)
    assert (back.codebook_size, back.source, back.tokenizer) == (2**18, "x", "t")
    with pytest.raises(TerraInputError, match="tokenize_dataset"):
        load_tokens(tmp_path / "missing.safetensors")


def test_loss_targets_skip_action_slots_and_the_first_frame():
    keep, target = train_script.target_positions(patches=4, frames=3, loss_on_first_frame=False)
    # Window of 3 frames x (4 image + 6 action) positions; targets are the image tokens of frames 1 and 2.
    np.testing.assert_array_equal(keep + 1, [10, 11, 12, 13, 20, 21, 22, 23])
    np.testing.assert_array_equal(target, [4, 5, 6, 7, 8, 9, 10, 11])
    keep, target = train_script.target_positions(patches=4, frames=3, loss_on_first_frame=True)
    np.testing.assert_array_equal(target[:3], [1, 2, 3])


def test_training_lowers_the_loss_and_exports(tokens, tmp_path):
    summary = train_script.train(train_config(tokens, tmp_path, "train.max_steps=40"))
    assert summary["step"] == 40 and summary["stopped"] == "max_steps"
    rows = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(5, 45, 5))
    assert rows[0]["loss"] < np.log(217) + 0.5
    assert rows[-1]["loss"] < 0.6 * rows[0]["loss"]
    assert rows[-1]["acc"] > rows[0]["acc"] + 0.2
    assert "val_loss" in rows[-1] and rows[-1]["val_loss"] < rows[0]["loss"]
    model = LlamaActionForCausalLM.from_pretrained(tmp_path / "model")
    assert model.config.num_image_patches == 15 and model.config.vocab_size == 217
    assert model.config.num_spatio_embeddings == 21 and model.config.num_temporal_embeddings == 4
    clips = load_tokens(tokens)
    ids = torch.from_numpy(clips.codes[:1, :2].reshape(1, -1))
    acts = torch.from_numpy(clips.actions[:1, :2].reshape(1, -1, 3))
    with torch.no_grad():
        assert model(input_ids=ids, actions=acts).logits.shape == (1, 42, 217)


def test_resumed_training_equals_uninterrupted_training(tokens, tmp_path):
    whole = train_script.train(train_config(tokens, tmp_path / "whole", "train.max_steps=4"))
    for expected_step in (1, 2, 3):  # a zero budget stops after one step; each call resumes the last
        part = train_script.train(train_config(tokens, tmp_path / "parts", "train.max_steps=4", "train.max_minutes=0"))
        assert part["step"] == expected_step and part["stopped"] == "max_minutes"
        assert not (tmp_path / "parts" / "model").exists()
    part = train_script.train(train_config(tokens, tmp_path / "parts", "train.max_steps=4", "train.max_minutes=0"))
    assert part["step"] == whole["step"] == 4
    steps = [json.loads(line)["step"] for line in (tmp_path / "parts" / "train_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # every stop logs its interval; no step twice
    a = LlamaActionForCausalLM.from_pretrained(tmp_path / "whole" / "model").state_dict()
    b = LlamaActionForCausalLM.from_pretrained(tmp_path / "parts" / "model").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_resume_drops_log_rows_after_the_checkpoint_and_checks_the_shape(tokens, tmp_path):
    train_script.train(train_config(tokens, tmp_path, "train.max_steps=12", "train.ckpt_every=5",
                                    "train.max_minutes=0"))  # one step, checkpointed at step 1
    state = torch.load(tmp_path / "checkpoint" / "trainer_state.pt", weights_only=True)
    log = tmp_path / "train_log.jsonl"
    log.write_text(log.read_text() + json.dumps({"step": 5, "loss": 1.0}) + "\n")  # a killed run logged further
    summary = train_script.train(train_config(tokens, tmp_path, "train.max_steps=12", "train.log_every=1",
                                              "train.max_minutes=0"))
    assert state["step"] == 1 and summary["step"] == 2
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2]
    with pytest.raises(TerraInputError, match="another network shape"):
        train_script.train(train_config(tokens, tmp_path, "train.max_steps=12", "net.hidden_size=128",
                                        "net.num_attention_heads=2", "net.num_key_value_heads=2"))


def test_sigterm_checkpoints_and_stops(tokens, tmp_path, monkeypatch):
    sample = train_script.WindowSampler.sample
    calls = []

    def sample_then_signal(self, batch_size):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives during step 3
        return sample(self, batch_size)

    monkeypatch.setattr(train_script.WindowSampler, "sample", sample_then_signal)
    handler = signal.getsignal(signal.SIGTERM)
    summary = train_script.train(train_config(tokens, tmp_path, "train.max_steps=10"))
    assert summary["step"] == 3 and summary["stopped"] == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is handler  # the previous handler is back
    state = torch.load(tmp_path / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 3


def test_cli_trains_and_exports_sharded_bf16(tokens, tmp_path):
    args = [sys.executable, str(ROOT / "scripts" / "train_world_model.py"), f"data.tokens={tokens}",
            f"output_dir={tmp_path}", "net.hidden_size=64", "net.num_attention_heads=1", "net.num_key_value_heads=1",
            "net.num_hidden_layers=1", "net.num_temporal_embeddings=3", "data.val_clips=0", "train.max_steps=2",
            "train.log_every=1", "export.dtype=bfloat16", "export.max_shard_size=100KB"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert "training finished at step 2" in done.stdout
    weights = list((tmp_path / "model").glob("*.safetensors"))
    assert len(weights) > 1 and all(w.stat().st_size < 100_000 for w in weights)  # sharded below the limit
    assert LlamaActionForCausalLM.from_pretrained(tmp_path / "model").dtype == torch.bfloat16


@pytest.mark.parametrize("override, match", [
    ("train.precision=fp8", "train.precision"),
    ("data.val_clips=12", "data.val_clips"),
    ("net.num_attention_heads=3", "net"),
    ("train.window=9", "train.window"),
    ("export.dtype=float16", "export.dtype"),
])
def test_bad_settings_raise_one_line_errors(tokens, tmp_path, override, match):
    with pytest.raises(TerraInputError, match=match) as err:
        train_script.train(train_config(tokens, tmp_path, "train.max_steps=1", override))
    assert "\n" not in str(err.value)
