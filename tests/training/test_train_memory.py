"""Training in less memory (terra/training/run.py, terra/training/model.py) on tiny models and the CPU:
torchao's 8-bit AdamW with bf16 weights and LoRA on a bf16 base with activation checkpointing follow the float32
AdamW run's loss; a run that does not train (a learning rate of 1e-9) is told apart."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from terra.core.errors import TerraInputError
from terra.training.data import WindowSampler, load_training_data
from terra.training.distributed import start_processes
from terra.training.run import make_optimizer, train_step
from terra.training.model import build_trainee
from terra.training.settings import train_spec
from tests.training.test_train import train, train_config
from tests.training.test_train_world_model import dataset, tokens  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread
needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="train.optimizer=adamw8bit needs torchao (pip install .[train8bit])")

STEPS = ("train.max_steps=20", "train.eval_every=100")
# Every logged loss (the mean of 5 steps) within this share of the reference run's drop (first logged loss to last)
# of the reference's: the 8-bit moments with bf16 weights measured 0.07 % of a 2.3-nat drop, LoRA on a bf16 base
# under bf16 autocast 0.5 % of a 0.09-nat drop; a run that does not move (lr 1e-9) is 110-115 % off.
TOLERANCE = 0.1


def losses(out: Path) -> list[float]:
    """The logged training losses of a run (its step-0 validation row left out)."""
    return [row["loss"] for row in map(json.loads, (out / "train_log.jsonl").read_text().splitlines()) if "loss" in row]


def follows(reference: list[float], run: list[float]) -> bool:
    """Whether ``run`` trained as ``reference`` did: the reference's loss fell, and every logged loss of ``run`` is
    within :data:`TOLERANCE` of that fall from the reference's."""
    drop = reference[0] - reference[-1]
    return (drop > 0 and len(run) == len(reference)
            and max(abs(a - b) for a, b in zip(reference, run)) <= TOLERANCE * drop)


@pytest.fixture(scope="module")
def reference(tokens, tmp_path_factory) -> Path:  # noqa: F811
    """20 steps of the float32 AdamW run (its export is the LoRA runs' starting point)."""
    out = tmp_path_factory.mktemp("reference")
    train(train_config(tokens, out, *STEPS))
    return out


@needs_torchao
def test_8bit_adamw_with_bf16_weights_follows_the_float32_run(tokens, reference, tmp_path):  # noqa: F811
    low = ("train.optimizer=adamw8bit", "train.weights_dtype=bfloat16")
    train(train_config(tokens, tmp_path / "low", *STEPS, *low))
    assert follows(losses(reference), losses(tmp_path / "low"))
    train(train_config(tokens, tmp_path / "still", *STEPS, *low, "train.lr=1e-9"))  # the control: nothing learnt
    assert not follows(losses(reference), losses(tmp_path / "still"))


def test_lora_on_a_bf16_base_with_checkpointing_follows_the_float32_lora_run(tokens, reference, tmp_path):  # noqa: F811
    lora = ("finetune=lora", f"init={reference / 'model'}", "lora.rank=4", "train.lr=1e-2")
    train(train_config(tokens, tmp_path / "fp32", *STEPS, *lora, "train.precision=fp32"))
    train(train_config(tokens, tmp_path / "bf16", *STEPS, *lora, "train.precision=bf16",
                       "train.activation_checkpointing=true"))
    assert follows(losses(tmp_path / "fp32"), losses(tmp_path / "bf16"))
    train(train_config(tokens, tmp_path / "still", *STEPS, *lora, "train.precision=bf16", "train.lr=1e-9"))
    assert not follows(losses(tmp_path / "fp32"), losses(tmp_path / "still"))


@needs_torchao
def test_a_resumed_8bit_run_equals_an_uninterrupted_one(tokens, tmp_path):  # noqa: F811
    # the 8-bit moments go through the checkpoint (DCP) and back; float32 weights: no stochastic rounding
    run = ("train.max_steps=3", "train.optimizer=adamw8bit")
    train(train_config(tokens, tmp_path / "whole", *run))
    for _ in range(3):
        train(train_config(tokens, tmp_path / "parts", *run, "train.max_minutes=0"))
    a, b = (load_file(tmp_path / name / "model" / "model.safetensors") for name in ("whole", "parts"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@needs_torchao
def test_a_checkpoint_resumes_only_under_its_own_optimizer(tokens, tmp_path):  # noqa: F811
    train(train_config(tokens, tmp_path, "train.max_steps=3", "train.max_minutes=0"))  # one step, checkpointed
    with pytest.raises(TerraInputError, match="written with train.optimizer=adamw and this run has "
                                              "train.optimizer=adamw8bit; set train.optimizer=adamw") as err:
        train(train_config(tokens, tmp_path, "train.max_steps=3", "train.optimizer=adamw8bit"))
    assert "\n" not in str(err.value)


def trainee_of(tokens: Path, out: Path, *overrides: str):  # noqa: F811
    """The run's spec and its trainee on the CPU (terra/training/model.py), without training."""
    spec = train_spec(train_config(tokens, out, *overrides))
    return spec, build_trainee(spec, load_training_data(spec.data, spec.val_clips), start_processes("cpu"))


@needs_torchao
def test_8bit_adamw_keeps_one_byte_moments_of_bf16_weights(tokens, tmp_path):  # noqa: F811
    from torchao.optim.subclass_8bit import OptimState8bit

    spec, trainee = trainee_of(tokens, tmp_path, "train.optimizer=adamw8bit", "train.weights_dtype=bfloat16")
    optimizer = make_optimizer(trainee.module, spec, torch.device("cpu"))
    windows = WindowSampler(load_training_data(spec.data, spec.val_clips).train, trainee.frames, 0).sample(8)
    train_step(trainee, optimizer, windows, spec.grad_clip)
    up = trainee.loss.lm.model.layers[0].mlp.up_proj.weight  # 128 x 64: quantized in blocks of 256
    assert up.dtype == torch.bfloat16
    state = optimizer.state[up]
    assert isinstance(state["exp_avg"], OptimState8bit) and isinstance(state["exp_avg_sq"], OptimState8bit)
    assert state["exp_avg"].codes.dtype == torch.uint8 and state["exp_avg"].codes.numel() == up.numel()


def test_checkpointing_recomputes_the_first_n_layers(tokens, tmp_path):  # noqa: F811
    _, trainee = trainee_of(tokens, tmp_path, "train.activation_checkpointing=1")
    assert [layer.gradient_checkpointing for layer in trainee.loss.lm.model.layers] == [True, False]
    with pytest.raises(TerraInputError, match="more than the model's 2 decoder layers"):
        trainee_of(tokens, tmp_path, "train.activation_checkpointing=3")


@pytest.mark.parametrize("override, match", [
    ("train.optimizer=sgd", "train.optimizer"),
    ("train.weights_dtype=bfloat16", "needs train.optimizer=adamw8bit"),
    ("train.weights_dtype=float16", "train.weights_dtype"),
    ("train.activation_checkpointing=0", "true, false or a number"),
    ("train.activation_checkpointing=some", "true, false or a number"),
])
def test_bad_memory_settings_are_one_line(tokens, tmp_path, override, match):  # noqa: F811
    with pytest.raises(TerraInputError, match=match) as err:
        train_spec(train_config(tokens, tmp_path, override))
    assert "\n" not in str(err.value)


def test_8bit_adamw_without_torchao_names_the_install(tokens, tmp_path, monkeypatch):  # noqa: F811
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(TerraInputError, match=r"needs torchao.*\[train8bit\]"):
        train_spec(train_config(tokens, tmp_path, "train.optimizer=adamw8bit"))
