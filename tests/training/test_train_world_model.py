"""Tokenizing a clip dataset and training the world model on it (tiny sizes, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
from terra.core.errors import TerraInputError
from terra.models import LlamaActionForCausalLM
from terra.sim.dataset import ClipDataset, write_dataset
from terra.sim.tokens import TokenizedClips, load_tokens, save_tokens
from terra.training import tokenize as tokenize_module
from terra.training.tokenize import tokenize_spec

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread


ROOT = Path(__file__).resolve().parents[2]
H, W = 24, 40




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
    clips = tokenize_module.tokenize_dataset(dataset, PoolTokenizer(), batch_size=7, progress=False)
    return save_tokens(tmp_path_factory.mktemp("tokens") / "tokens.safetensors", clips)


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
    from terra.tokenizer import LFQTokenizer

    tok = LFQTokenizer({"encoder_decoder_config": {"ch": 32, "ch_mult": [1, 1, 2], "num_res_blocks": 1,
                                                   "z_channels": 6}, "image_size": [H, W]}).eval()
    tok.save_pretrained(tmp_path / "tok")
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):  # the apps' schemas registered
        cfg = compose("tokenize_dataset", overrides=[
            f"dataset={dataset.path}", f"tokenizer_path={tmp_path / 'tok'}", f"out={tmp_path / 'codes.safetensors'}",
            "batch_size=16", "device=cpu"])
    tokenize_module.run(tokenize_spec(cfg))
    clips = load_tokens(tmp_path / "codes.safetensors")
    assert clips.codes.shape == (12, 6, 6, 10) and clips.codebook_size == 64
    assert clips.tokenizer == str(tmp_path / "tok")
    images = torch.from_numpy(dataset[3].frames).permute(0, 3, 1, 2).float() / 127.5 - 1
    np.testing.assert_array_equal(clips.codes[3], tok.encode(images).numpy())
    cfg.tokenizer_path = str(tmp_path / "missing")
    with pytest.raises(TerraInputError, match="tokenizer_path"):
        tokenize_spec(cfg)


def test_tokenize_rejects_a_tokenizer_of_another_size(dataset):
    class Wrong(PoolTokenizer):
        image_size = (32, 32)

    with pytest.raises(TerraInputError, match="render the dataset"):
        tokenize_module.tokenize_dataset(dataset, Wrong(), progress=False)


def test_tokens_round_trip_keeps_large_codebooks(tmp_path):
    codes = np.random.default_rng(0).integers(0, 2**18, (2, 3, 2, 2))
    clips = TokenizedClips(codes=codes, actions=np.zeros((2, 3, 6, 3), np.float32), poses=np.zeros((2, 3, 3)),
                           codebook_size=2**18, image_size=(32, 32), source="x", tokenizer="t")
    back = load_tokens(save_tokens(tmp_path / "t.safetensors", clips))
    np.testing.assert_array_equal(back.codes, codes)
    assert (back.codebook_size, back.source, back.tokenizer) == (2**18, "x", "t")
    with pytest.raises(TerraInputError, match="terra-tokenize"):
        load_tokens(tmp_path / "missing.safetensors")


def test_cli_trains_and_exports_sharded_bf16(tokens, tmp_path):
    args = [sys.executable, "-m", "terra.apps.train", f"data.tokens={tokens}",
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




def test_finetune_demo_runs_the_environments_python_when_py_is_unset(tmp_path):
    """scripts/recipes/finetune_demo.sh without PY runs .venv/bin/python (the environment `make` builds), not a bare
    python that lacks the project's packages: here no other Python is on PATH at all."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv in this checkout")
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("dirname", "mkdir"):
        os.symlink(next(Path(d) / name for d in ("/usr/bin", "/bin") if (Path(d) / name).exists()), tools / name)
    report = tmp_path / "run" / "eval" / "full_left_hand" / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"domain": "left_hand", "quality": {"mean_psnr_target_frames": 21.5,
                                                                     "tokenizer_psnr": {"overall": 30.25}},
                                  "adherence": {"pairs": {"a/b": {"accuracy_pct": 75.0}}}}))
    env = {"PATH": str(tools), "RUN": str(tmp_path / "run")}
    result = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "recipes" / "finetune_demo.sh"), "table"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split() == ["full", "left_hand", "21.50", "30.25", "75.0"]
