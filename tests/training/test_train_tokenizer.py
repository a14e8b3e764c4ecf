"""terra-train-tokenizer (terra/training/tokenizer_run.py): a tiny tokenizer learns, runs stop on a time budget and resume, export loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image
from safetensors.torch import load_file

from terra.core.errors import TerraInputError
from terra.tokenizer import LFQTokenizer, VQTokenizer, load_tokenizer
from terra.training import tokenizer_run as train_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread


ROOT = Path(__file__).resolve().parents[2]

TINY_LFQ = [
    "model.config.encoder_decoder_config.ch=32",
    "model.config.encoder_decoder_config.ch_mult=[1,2]",
    "model.config.encoder_decoder_config.num_res_blocks=1",
    "model.config.encoder_decoder_config.z_channels=6",
    "model.config.quantizer_config.dim=6",
    "model.config.quantizer_config.codebook_size=64",
    "model.config.image_size=[16,16]",
]
TINY_VQ = [
    "train_tokenizer/model=vq16",
    "model.config.ch=32",
    "model.config.encoder_ch_mult=[1,2]",
    "model.config.decoder_ch_mult=[1,2]",
    "model.config.num_res_blocks=1",
    "model.config.z_channels=32",
    "model.config.codebook_size=64",
    "model.config.codebook_embed_dim=4",
    "model.config.image_size=[16,16]",
]


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    """Twelve 48x48 PNGs of flat colours split by one edge: easy to learn, not trivial."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(12):
        image = np.empty((48, 48, 3), np.uint8)
        image[:] = rng.integers(0, 256, 3)
        image[rng.integers(8, 40):, : rng.integers(8, 40)] = rng.integers(0, 256, 3)
        Image.fromarray(image).save(folder / f"{i:02d}.png")
    return folder


def config(out: Path, folder: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("train_tokenizer", overrides=[
            "data.source=folder", f"data.path={folder}", f"train.output_dir={out}", "train.device=cpu",
            "train.batch_size=8", "train.warmup_steps=5", "train.lr=1e-3", "train.log_every=10",
            "train.eval_frames=12", *overrides,
        ])


@pytest.mark.parametrize("model", [TINY_LFQ, TINY_VQ], ids=["lfq", "vq"])
def test_training_reduces_reconstruction_loss_and_exports(tmp_path, image_folder, model):
    summary = train_tokenizer.train(config(tmp_path, image_folder, *model, "train.max_steps=40", "train.ema_decay=0.9"))
    assert summary["finished"] and summary["step"] == 40
    assert summary["eval"]["l1"] < 0.8 * summary["eval_initial"]["l1"]
    assert summary["eval"]["psnr"] > summary["eval_initial"]["psnr"] + 1.5
    tok = load_tokenizer(tmp_path / "final")
    assert isinstance(tok, VQTokenizer if model is TINY_VQ else LFQTokenizer) and tok.grid_shape == (8, 8)
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    train_entries = [e for e in log if e["event"] == "train"]
    assert [e["step"] for e in train_entries] == [10, 20, 30, 40]
    assert all(0 < e["code_usage"] <= 1 and e["psnr"] > 0 for e in train_entries)


def test_time_budget_stops_cleanly_and_a_second_run_resumes(tmp_path, image_folder):
    gan = ["disc.enabled=true", "disc.start_step=0", "disc.layers=1"]
    first = train_tokenizer.train(config(tmp_path, image_folder, *TINY_LFQ, *gan, "train.max_steps=12",
                                         "train.max_minutes=1e-6"))
    assert not first["finished"] and first["step"] == 1  # one step always runs, then the budget stops it
    assert (tmp_path / "checkpoint" / "model" / "model.safetensors").is_file() and not (tmp_path / "final").exists()
    second = train_tokenizer.train(config(tmp_path, image_folder, *TINY_LFQ, *gan, "train.max_steps=12",
                                          "train.export_dtype=bfloat16"))
    assert second["finished"] and second["step"] == 12
    assert second["eval_initial"] == first["eval_initial"]  # carried over from the first invocation
    assert json.loads((tmp_path / "summary.json").read_text())["finished"]
    stored = load_file(tmp_path / "final" / "model.safetensors")
    assert {v.dtype for v in stored.values()} == {torch.bfloat16}
    exported = load_tokenizer(tmp_path / "final")
    assert exported.dtype == torch.float32 and exported.encode(torch.zeros(1, 3, 16, 16)).shape == (1, 8, 8)


def test_bad_data_source_is_a_one_line_error(tmp_path, image_folder):
    with pytest.raises(TerraInputError, match="data.path"):
        train_tokenizer.train(config(tmp_path, image_folder, *TINY_LFQ, "data.path=null"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TerraInputError, match="holds no images"):
        train_tokenizer.train(config(tmp_path / "run", tmp_path / "empty", *TINY_LFQ))
    with pytest.raises(TerraInputError, match=r"train.output_dir=.* is the data.path"):  # outputs among the images
        train_tokenizer.train(config(image_folder, image_folder, *TINY_LFQ))
