"""Training and fine-tuning runs (terra/training/run.py) on tiny models and the CPU: the loss falls, a resumed run
equals an uninterrupted one, SIGTERM checkpoints, bad settings are one line."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
from terra.core.errors import TerraInputError
from terra.models import LlamaActionForCausalLM
from terra.sim.tokens import load_tokens
from terra.training import data as training_data
from terra.training.objective import FusedHeadLoss, HeadLoss, softmax_step, target_positions
from terra.training.run import train as run_training
from terra.training.runlog import RunLog
from terra.training.settings import train_spec
from tests.training.test_train_world_model import dataset, tokens  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread

ROOT = Path(__file__).resolve().parents[2]


def train(cfg):
    """Check the config as the app does, then run."""
    return run_training(train_spec(cfg))


def train_config(tokens: Path, out: Path, *overrides: str):
    """The real conf/train_world_model.yaml with a tiny network and the given overrides."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose("train_world_model", overrides=[
            f"data.tokens={tokens}", f"output_dir={out}", "data.val_clips=2",
            "net.hidden_size=64", "net.intermediate_size=128", "net.num_hidden_layers=2",
            "net.num_attention_heads=1", "net.num_key_value_heads=1", "net.num_temporal_embeddings=4",
            "train.batch_size=8", "train.lr=3e-3", "train.warmup_steps=5", "train.log_every=5",
            "train.eval_every=20", "train.ckpt_every=20", "train.device=cpu", "export.dtype=float32",
            "train.tensorboard=false", "sample.gif=false",
            *overrides,
        ])


def test_loss_targets_skip_action_slots_and_the_first_frame():
    keep, target = target_positions(patches=4, frames=3, loss_on_first_frame=False, span=10)
    # Window of 3 frames x (4 image + 6 action) positions; targets are the image tokens of frames 1 and 2.
    np.testing.assert_array_equal(keep + 1, [10, 11, 12, 13, 20, 21, 22, 23])
    np.testing.assert_array_equal(target, [4, 5, 6, 7, 8, 9, 10, 11])
    keep, target = target_positions(patches=4, frames=3, loss_on_first_frame=True, span=10)
    np.testing.assert_array_equal(target[:3], [1, 2, 3])


@pytest.mark.parametrize("vocab, codebook", [(1025, 1024), (200, 190), (50, 49)])
def test_fused_head_loss_equals_the_loss_of_the_whole_logits(vocab, codebook):
    # The output layer is padded to a multiple of 64 rows: by 63 (1025), 56 (200) and 14 (50) rows.
    gen = torch.Generator().manual_seed(vocab)
    hidden = torch.randn(37, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(codebook, (37,), generator=gen)
    targets[:2] = torch.tensor([codebook - 1, 0])
    loss, correct = FusedHeadLoss.apply(hidden, weight, targets,
                                        HeadLoss(torch.float64, 8, codebook, True, softmax_step))
    (0.5 * loss).backward()
    fused = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    logits = hidden @ weight.T
    reference = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
    (0.5 * reference).backward()
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=0)
    torch.testing.assert_close(fused[0], hidden.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fused[1], weight.grad, rtol=1e-10, atol=1e-12)
    assert int(correct) == int((logits[:, :codebook].argmax(-1) == targets).sum())


def test_fused_head_loss_computes_only_the_gradients_needed():
    from torch.utils.flop_counter import FlopCounterMode

    hidden, weight = torch.randn(10, 8, requires_grad=True), torch.randn(70, 8, requires_grad=True)
    targets = torch.randint(69, (10,))

    def flops(grads: bool) -> int:
        with FlopCounterMode(display=False) as counter:
            FusedHeadLoss.apply(hidden, weight, targets, HeadLoss(torch.float32, 4, 69, grads, softmax_step))
        return counter.get_total_flops()

    logits_only = 2 * 10 * 8 * 128  # the output layer padded to 128 rows
    assert flops(False) == logits_only  # under torch.no_grad (validation)
    assert flops(True) == 3 * logits_only  # logits, hidden and weight gradients
    weight.requires_grad_(False)
    assert flops(True) == 2 * logits_only  # a frozen output layer (LoRA)
    loss, _ = FusedHeadLoss.apply(hidden, weight, targets, HeadLoss(torch.float32, 4, 69, True, softmax_step))
    loss.backward()
    assert hidden.grad is not None and weight.grad is None


def test_training_lowers_the_loss_and_exports(tokens, tmp_path, capsys):
    summary = train(train_config(tokens, tmp_path, "train.max_steps=40"))
    assert summary["step"] == 40 and summary["stopped"] == "max_steps"
    lines = capsys.readouterr().out.splitlines()
    assert "validation at step 0/40: loss on 2 clips ..." in lines  # the step-0 validation says when it starts
    assert any(line.startswith("validation at step 0/40 done in ") and "val_loss=" in line for line in lines)
    assert any(line.startswith("step=5/40 loss=") for line in lines) and any(
        line.startswith("validation at step 40/40 done in ") for line in lines)
    start, *rows = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert set(start) == {"step", "val_loss", "val_acc"} and start["step"] == 0  # validation before the first step
    assert [r["step"] for r in rows] == list(range(5, 45, 5))
    assert rows[0]["loss"] < np.log(217) + 0.5
    assert rows[-1]["loss"] < 0.6 * rows[0]["loss"]
    assert rows[-1]["acc"] > rows[0]["acc"] + 0.2
    assert "val_loss" in rows[-1] and rows[-1]["val_loss"] < min(rows[0]["loss"], start["val_loss"])
    best = json.loads((tmp_path / "best" / "best.json").read_text())  # export.best: the lowest validation kept
    lowest = min((r for r in [start, *rows] if "val_loss" in r), key=lambda r: r["val_loss"])
    assert best == {"step": lowest["step"], "val_loss": lowest["val_loss"], "val_acc": lowest["val_acc"]}
    assert summary["best"] == best
    model = LlamaActionForCausalLM.from_pretrained(tmp_path / "model")
    assert model.config.num_image_patches == 15 and model.config.vocab_size == 217
    assert model.config.num_spatio_embeddings == 21 and model.config.num_temporal_embeddings == 4
    clips = load_tokens(tokens)
    ids = torch.from_numpy(clips.codes[:1, :2].reshape(1, -1))
    acts = torch.from_numpy(clips.actions[:1, :2].reshape(1, -1, 3))
    with torch.no_grad():
        assert model(input_ids=ids, actions=acts).logits.shape == (1, 42, 217)


def test_resumed_training_equals_uninterrupted_training(tokens, tmp_path):
    whole = train(train_config(tokens, tmp_path / "whole", "train.max_steps=4"))
    for expected_step in (1, 2, 3):  # a zero budget stops after one step; each call resumes the last
        part = train(train_config(tokens, tmp_path / "parts", "train.max_steps=4", "train.max_minutes=0"))
        assert part["step"] == expected_step and part["stopped"] == "max_minutes"
        assert not (tmp_path / "parts" / "model").exists()
    part = train(train_config(tokens, tmp_path / "parts", "train.max_steps=4", "train.max_minutes=0"))
    assert part["step"] == whole["step"] == 4
    steps = [json.loads(line)["step"] for line in (tmp_path / "parts" / "train_log.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]  # the start's validation, then every stop's interval; no step twice
    a = LlamaActionForCausalLM.from_pretrained(tmp_path / "whole" / "model").state_dict()
    b = LlamaActionForCausalLM.from_pretrained(tmp_path / "parts" / "model").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_resume_drops_log_rows_after_the_checkpoint_and_checks_the_shape(tokens, tmp_path):
    train(train_config(tokens, tmp_path, "train.max_steps=12", "train.ckpt_every=5",
                                    "train.max_minutes=0"))  # one step, checkpointed at step 1
    state = torch.load(tmp_path / "checkpoint" / "trainer_state.pt", weights_only=True)
    log = tmp_path / "train_log.jsonl"
    log.write_text(log.read_text() + json.dumps({"step": 5, "loss": 1.0}) + "\n")  # a killed run logged further
    summary = train(train_config(tokens, tmp_path, "train.max_steps=12", "train.log_every=1",
                                              "train.max_minutes=0"))
    assert state["step"] == 1 and summary["step"] == 2
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [0, 1, 2]
    with pytest.raises(TerraInputError, match="another network shape"):
        train(train_config(tokens, tmp_path, "train.max_steps=12", "net.hidden_size=128",
                                        "net.num_attention_heads=2", "net.num_key_value_heads=2"))


def test_sigterm_checkpoints_and_stops(tokens, tmp_path, monkeypatch):
    sample = training_data.WindowSampler.sample
    calls = []

    def sample_then_signal(self, batch_size):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives during step 3
        return sample(self, batch_size)

    monkeypatch.setattr(training_data.WindowSampler, "sample", sample_then_signal)
    handler = signal.getsignal(signal.SIGTERM)
    summary = train(train_config(tokens, tmp_path, "train.max_steps=10"))
    assert summary["step"] == 3 and summary["stopped"] == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is handler  # the previous handler is back
    state = torch.load(tmp_path / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 3


@pytest.mark.parametrize("override, match", [
    ("train.precision=fp8", "train.precision"),
    ("data.val_clips=12", "data.val_clips"),
    ("net.num_attention_heads=3", "net"),
    ("train.window=9", "train.window"),
    ("export.dtype=float16", "export.dtype"),
    ("train.betas=[0.9]", "train.betas"),
])
def test_bad_settings_raise_one_line_errors(tokens, tmp_path, override, match):
    with pytest.raises(TerraInputError, match=match) as err:
        train(train_config(tokens, tmp_path, "train.max_steps=1", override))
    assert "\n" not in str(err.value)


def test_a_run_log_keeps_rows_up_to_its_checkpoint_and_starts_anew_without_one(tmp_path):
    log = tmp_path / "train_log.jsonl"
    for start, kept in ((1, [0, 1]), (0, [])):  # resumed at step 1 / started again with no checkpoint
        log.write_text("".join(json.dumps({"step": s}) + "\n" for s in (0, 1, 5)))
        RunLog(tmp_path, start, 10, tensorboard=False, progress=False).close()
        assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == kept


def test_the_step_bar_counts_to_max_steps_with_the_time_left(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar (terra/core/progress.py)
    log = RunLog(tmp_path, 2, 10, tensorboard=False, progress=True)  # resumed at step 2
    for _ in range(3):
        log.bar.update(1)
    log.write({"step": 5, "loss": 1.25, "tokens_per_s": 1234.0})
    log.close()
    captured = capsys.readouterr()
    assert "training:  50%" in captured.err and "| 5/10 [" in captured.err and "<" in captured.err  # ETA after "<"
    assert "loss 1.250, 1,234 tok/s" in captured.err
    assert "step=5/10 loss=1.25 tokens_per_s=1234" in captured.out


def test_input_noise_noises_inputs_only_and_only_in_training():
    """train.input_noise: a share of each window's input codes becomes random codes (up to the setting, drawn per
    window); the targets stay the true codes, and evaluation sees the true inputs."""
    import torch

    from terra.training.objective import noisy_inputs

    torch.manual_seed(0)
    ids = torch.randint(0, 1024, (256, 2000))
    noisy = noisy_inputs(ids, 0.2, 1024)
    changed = (noisy != ids).float().mean(1)
    assert 0.0 <= changed.min() and changed.max() <= 0.21
    assert 0.08 < changed.mean() < 0.12  # share ~ U(0, 0.2), of which 1/1024 redraw the same code
    assert noisy.max() < 1024 and noisy.min() >= 0
    assert torch.equal(noisy_inputs(ids, 0.0, 1024), ids)
