"""terra-train-tokenizer (terra/training/tokenizer_settings.py, tokenizer_run.py): a tiny tokenizer learns, runs
stop on a time budget and resume, export loads; a bad setting is one line before torch loads or any step runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image
from safetensors.torch import load_file

from terra.apps.runner import CONF_DIR
from terra.core.errors import TerraInputError
from terra.tokenizer import LFQTokenizer, VQTokenizer, load_tokenizer
from terra.training.tokenizer_run import TOKENIZERS, train as run_training
from terra.training.tokenizer_settings import FAMILIES, tokenizer_train_spec

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


def train(cfg):
    """Check the config as the app does, then run."""
    return run_training(tokenizer_train_spec(cfg))


def config(out: Path, folder: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose("train_tokenizer", overrides=[
            "data.source=folder", f"data.path={folder}", f"train.output_dir={out}", "train.device=cpu",
            "train.batch_size=8", "train.warmup_steps=5", "train.lr=1e-3", "train.log_every=10",
            "train.eval_frames=12", *overrides,
        ])


@pytest.mark.parametrize("model", [TINY_LFQ, TINY_VQ], ids=["lfq", "vq"])
def test_training_reduces_reconstruction_loss_and_exports(tmp_path, image_folder, model):
    summary = train(config(tmp_path, image_folder, *model, "train.max_steps=40", "train.ema_decay=0.9"))
    assert summary["finished"] and summary["step"] == 40
    assert summary["config"]["train"]["batch_size"] == 8 and summary["config"]["data"]["path"] == str(image_folder)
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
    first = train(config(tmp_path, image_folder, *TINY_LFQ, *gan, "train.max_steps=12", "train.max_minutes=1e-6"))
    assert not first["finished"] and first["step"] == 1  # one step always runs, then the budget stops it
    assert (tmp_path / "checkpoint" / "model" / "model.safetensors").is_file() and not (tmp_path / "final").exists()
    second = train(config(tmp_path, image_folder, *TINY_LFQ, *gan, "train.max_steps=12",
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
        train(config(tmp_path, image_folder, *TINY_LFQ, "data.path=null"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TerraInputError, match="holds no images"):
        train(config(tmp_path / "run", tmp_path / "empty", *TINY_LFQ))
    with pytest.raises(TerraInputError, match=r"train.output_dir=.* is the data.path"):  # outputs among the images
        train(config(image_folder, image_folder, *TINY_LFQ))


@pytest.mark.parametrize("overrides, named", [
    (["train.batch_size=-1"], "train.batch_size"),
    (["data.source=webcam"], "data.source"),
    (["data.seed=-1"], "data.seed"),
    (["train.export_dtype=float16"], "train.export_dtype"),
    (["train.betas=[0.5]"], "train.betas"),
    (["train.max_minutes=0"], "train.max_minutes"),
    (["train.ema_decay=1.0"], "train.ema_decay"),
    (["loss.l2=-1"], "loss.l2"),
    (["model.family=gan"], "model.family"),
    (["disc.enabled=true", "disc.ch=50"], "disc.ch"),
])
def test_a_bad_setting_is_one_line_naming_it_and_leaves_nothing(tmp_path, image_folder, overrides, named):
    with pytest.raises(TerraInputError, match=named.replace(".", r"\.")) as err:
        tokenizer_train_spec(config(tmp_path / "run", image_folder, *TINY_LFQ, *overrides))
    assert "\n" not in str(err.value) and not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, message", [
    (["model.config.encoder_decoder_config.ch=48"], "model.config describes a tokenizer that cannot be built"),
    (["disc.enabled=true", "disc.layers=3"], "disc.layers=3 is too deep for the model's 16x16 frames.*disc.layers=2"),
])
def test_what_needs_the_model_is_one_line_before_the_first_step(tmp_path, image_folder, overrides, message):
    """A model config its class cannot build (GroupNorm's 32 groups and ch 48), a discriminator deeper than the
    frames: found when the model is built, before any step, and the run folder it created is gone again."""
    with pytest.raises(TerraInputError, match=message) as err:
        train(config(tmp_path / "run", image_folder, *TINY_LFQ, *overrides))
    assert "\n" not in str(err.value) and not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, line", [
    ("train.batch_size=0", "train.batch_size must be a whole number from 1 to 65536 (got 0); e.g. train.batch_size=32"),
    ("train.resume=maybe", "train.resume must be true or false (got 'maybe')"),  # refused by its type, in its words
    ("model.config=null", "model.config must be a mapping (got None)"),
])
def test_the_app_checks_its_settings_before_torch_is_imported(tmp_path, override, line):
    out = tmp_path / "run"
    code = ("import sys, terra.apps.train_tokenizer\n"
            f"sys.argv = ['terra-train-tokenizer', 'train.output_dir={out}', '{override}']\n"
            "try:\n    terra.apps.train_tokenizer.main()\n"
            "except SystemExit as exit:\n    assert exit.code == 2, exit.code\n"
            "assert 'torch' not in sys.modules, 'torch was imported before the check'\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"terra-train-tokenizer: error: {line}"]
    assert not out.exists() and not any(tmp_path.glob("*.log")), sorted(tmp_path.iterdir())  # nothing written


def test_every_family_has_a_tokenizer_class():
    assert set(TOKENIZERS) == set(FAMILIES)
