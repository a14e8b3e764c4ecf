"""Routes from the dataset to the trained model (tiny sizes, CPU): the tokens file keeps each frame's route and
checks it at load; a window's route slots hold the next frame's route resampled to the model's K; a share of windows
goes without a route; a checkpoint without route slots grows them (warm start); a route model trains, exports and
generates with and without routes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from terra.config.assets import ASSETS
from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.backends import model_backend
from terra.generation.rollout import RolloutRequest
from terra.contract.routes import resample_routes, route_distances, route_slot_values, routes_from_xy
from terra.models import LlamaActionForCausalLM
from terra.models.checkpoint import read_world_model_config
from terra.sim.dataset import ClipDataset, write_dataset
from terra.sim.scene import Scene
from terra.sim.tokens import TokenizedClips, load_tokens, save_tokens
from terra.training.data import WindowSampler, load_training_data
from terra.training.distributed import start_processes
from terra.training.model import build_model, new_config, build_trainee
from terra.training.settings import train_spec
from terra.training.tokenize import tokenize_dataset
from tests.training.test_train import train, train_config
from tests.training.test_train_world_model import H, W, PoolTokenizer

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODEL = ASSETS / "demo" / "world_model"
CLIPS, FRAMES = 8, 8  # long drives (terra/sim/long_drives.py), the last 2 held out by train_config


@pytest.fixture(scope="module")
def drives(tmp_path_factory) -> ClipDataset:
    out = tmp_path_factory.mktemp("drives") / "ds"
    return ClipDataset(write_dataset(out, CLIPS, FRAMES, H, W, seed=7, clips_per_shard=8, recipe="long_drives",
                                     progress=False))


@pytest.fixture(scope="module")
def route_tokens(drives, tmp_path_factory) -> Path:
    clips = tokenize_dataset(drives, PoolTokenizer(), batch_size=16, progress=False)
    return save_tokens(tmp_path_factory.mktemp("tokens") / "routes.safetensors", clips)


@pytest.fixture(scope="module")
def plain_tokens(route_tokens, tmp_path_factory) -> Path:
    """The same clips in a tokens file written before routes: no routes tensor."""
    clips = load_tokens(route_tokens)
    return save_tokens(tmp_path_factory.mktemp("tokens") / "plain.safetensors",
                       TokenizedClips(**{**clips.__dict__, "routes": None}))


def scene_of(drives: ClipDataset, clip: int) -> Scene:
    info = drives.meta["clips"][clip]
    return Scene.generate(info["scene_seed"], info["scene_length_m"], drives.domain)


def test_tokenize_keeps_each_frames_route(drives, route_tokens, plain_tokens):
    clips = load_tokens(route_tokens)
    assert clips.routes.shape == (CLIPS, FRAMES, 16, 3) and clips.routes.dtype == np.float32
    for i in (0, 5):
        np.testing.assert_array_equal(clips.routes[i], scene_of(drives, i).route(drives[i].poses, 16))
    assert load_tokens(plain_tokens).routes is None


@pytest.mark.parametrize("spoil, message", [
    ("nan", r"tensor routes holds 1 NaN or infinite value\(s\) of 3072; the file is damaged"),
    ("shape", r"tensor routes has shape \[8, 8, 1, 3\], not \[8, 8, points >= 2, 3\]"),
    ("far", r"tensor routes: a route point lies 1500 m from the car, more than 1000 m"),
    ("distances", r"tensor routes: a route's third values must be its points' distances along the road"),
])
def test_routes_read_from_a_tokens_file_are_checked_at_load(route_tokens, tmp_path, spoil, message):
    tensors = load_file(str(route_tokens))
    routes = tensors["routes"]
    if spoil == "nan":
        routes[2, 3, 4, 1] = np.nan
    elif spoil == "shape":
        routes = routes[:, :, :1]
    elif spoil == "far":
        routes[1, 1, 15, 0] = 1500.0
    else:
        routes[..., 2] *= 2
    tensors["routes"] = np.ascontiguousarray(routes)
    with safe_open(str(route_tokens), framework="numpy") as fh:
        meta = fh.metadata()
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata=meta)
    with pytest.raises(TerraInputError, match=f"tokenized clips {bad}: {message}") as err:
        load_tokens(bad)
    assert "\n" not in str(err.value)


def test_a_windows_route_slots_hold_the_next_frames_route_at_the_models_points(drives, route_tokens):
    """Frame t's slots hold routes[t + 1] (terra/generation/rollout.py's rule), resampled from the data's 16 points to
    the model's 8: exactly Scene.route at K = 8 (every second point of 16), NaN where the clip has no next frame."""
    data = load_training_data(str(route_tokens), 2).for_route_slots(8)
    poses = load_tokens(route_tokens).poses
    for clip, start in ((0, 0), (3, 2), (5, FRAMES - 4)):
        codes, actions, routes = data.train.window(clip, start, 4)
        assert routes.shape == (4, 8, 3) and codes.shape == (4, 15)
        future = poses[clip, start + 1:start + 5]
        expected = np.full((4, 8, 3), np.nan, dtype=np.float32)
        expected[:len(future)] = route_slot_values(scene_of(drives, clip).route(future, 8))  # the slots' [y, x, s]
        np.testing.assert_array_equal(routes.numpy(), expected)
        np.testing.assert_array_equal(data.train.frame_routes(clip, start, 4),
                                      scene_of(drives, clip).route(poses[clip, start:start + 4], 8))
    assert torch.isnan(data.train.window(5, FRAMES - 4, 4)[2][-1]).all()  # the clip's last frame: no next frame
    assert load_training_data(str(route_tokens), 2).for_route_slots(0).train.routes is None


def test_a_share_of_windows_trains_with_no_route_drawn_from_the_run_seed(route_tokens, plain_tokens):
    """train.no_route_share blanks whole windows: every route slot of a window, or none (a window near a clip's end
    keeps its NaN past the end either way). Over 4,000 windows the blanked share of 0.15 lies within +-0.025 (4.4
    standard deviations: a correct sampler fails this with probability 1e-5 for a random seed; with the fixed seed
    the draw is the same on every run); a sampler blanking 0.10 lands inside the band with probability 7e-8 (5.3
    of its standard deviations), and this one does not."""
    clips = load_training_data(str(route_tokens), 2).for_route_slots(4).train

    def blanked(share: float, seed: int = 1) -> torch.Tensor:
        windows = WindowSampler(clips, 2, seed, share).sample(4000)
        missing = torch.isnan(windows.routes).any(-1).reshape(4000, 2, 4)
        whole = missing[:, 0].all(-1)  # frame 0's slots hold frame 1's route, which every window has
        assert bool((missing[:, 0] == whole[:, None]).all())  # a window's slots: all blank or none
        assert bool(missing[whole].all())
        return whole

    share = blanked(0.15).float().mean().item()
    assert abs(share - 0.15) < 0.025
    assert abs(blanked(0.10).float().mean().item() - 0.15) >= 0.025  # the band tells a wrong share apart
    assert torch.equal(blanked(0.15), blanked(0.15))  # the run's seed decides: a resumed run draws the same
    assert not blanked(0.0).any()
    plain = load_training_data(str(plain_tokens), 2).train
    with_share, without = WindowSampler(plain, 2, 1, 0.15), WindowSampler(plain, 2, 1, 0.0)
    for _ in range(3):  # data without routes draws no blanks: its windows are the ones it always drew
        a, b = with_share.sample(8), without.sample(8)
        assert a.routes is None and torch.equal(a.codes, b.codes)


@pytest.fixture(scope="module")
def plain_checkpoint(route_tokens, tmp_path_factory) -> Path:
    """A tiny model in Terra's layout (no route slots) of the tokens' layout, its tables drawn large enough to
    matter."""
    cfg = train_config(route_tokens, tmp_path_factory.mktemp("unused"))
    data = load_training_data(str(route_tokens), 2)
    torch.manual_seed(3)
    model = LlamaActionForCausalLM(new_config(train_spec(cfg).net, data))
    with torch.no_grad():
        for table in model.pos_embedding_spatio_temporal.parameters():
            table.normal_(0, 1.0)
    out = tmp_path_factory.mktemp("plain_model")
    model.save_pretrained(out)
    return out


def test_a_checkpoint_without_route_slots_grows_them_keeping_every_weight(route_tokens, plain_checkpoint, tmp_path):
    """init= of a model without route slots and net.num_route_tokens=4: every weight copied, the spatial table's
    15 image and 6 action rows in place. What is exactly preserved is the first frame of a window: its positions
    0-20 have the same position ids, embeddings and (causal) inputs, so their logits equal the old model's bit for bit
    (eager attention, float32); from frame 1 on positions sit 4 further per frame and attend to the route slots, so
    they differ."""
    spec = train_spec(train_config(route_tokens, tmp_path / "run", f"init={plain_checkpoint}",
                                   "net.num_route_tokens=4", "train.attn_implementation=eager"))
    data = load_training_data(spec.data, spec.val_clips)
    old = LlamaActionForCausalLM.from_pretrained(plain_checkpoint, attn_implementation="eager").eval()
    grown = build_model(spec, data).eval()
    assert grown.config.num_route_tokens == 4 and grown.config.num_spatio_embeddings == 15 + 6 + 4
    assert grown.config.max_position_embeddings == 4 * 25
    new_state, old_state = grown.state_dict(), old.state_dict()
    table = "pos_embedding_spatio_temporal.spatio_embeddings.weight"
    assert set(new_state) - set(old_state) == {"route_projection.weight", "route_projection.bias",
                                               "no_route_embedding"}
    for key, value in old_state.items():
        torch.testing.assert_close(new_state[key][:len(value)], value, rtol=0, atol=0)
    assert new_state[table].shape == (25, 64) and new_state[table][21:].abs().max() < 0.2  # drawn, std 0.02
    windows = WindowSampler(data.for_route_slots(4).train, 3, 0).sample(2)
    with torch.no_grad():
        before = old(input_ids=windows.codes, actions=windows.actions).logits
        after = grown(input_ids=windows.codes, actions=windows.actions, routes=windows.routes).logits
    assert torch.equal(after[:, :21], before[:, :21])
    assert (after[:, 25:25 + 21] - before[:, 21:42]).abs().max() > 1e-4  # frame 1 moved (1.3e-3): not preserved
    grown.save_pretrained(tmp_path / "grown")
    with pytest.raises(TerraInputError, match="has 4 route slots, which training does not change") as err:
        build_model(train_spec(train_config(route_tokens, tmp_path / "run2", f"init={tmp_path / 'grown'}",
                                            "net.num_route_tokens=8")), data)
    assert "\n" not in str(err.value)


def test_lora_on_a_route_model_trains_its_route_slots(route_tokens, plain_checkpoint, tmp_path):
    """With finetune=lora the route projection and the no-route rows of a grown model train (they start drawn)."""
    spec = train_spec(train_config(route_tokens, tmp_path, f"init={plain_checkpoint}", "net.num_route_tokens=4",
                                   "finetune=lora", "lora.target_modules=[q_proj,v_proj]"))
    data = load_training_data(spec.data, spec.val_clips)
    trained = {n for n, p in build_trainee(spec, data, start_processes("cpu")).module.named_parameters()
               if p.requires_grad}
    assert {"lm.no_route_embedding"} <= trained
    assert any("route_projection.modules_to_save" in n for n in trained)


def test_a_route_model_trains_exports_and_generates_with_and_without_routes(route_tokens, tmp_path, capsys):
    summary = train(train_config(route_tokens, tmp_path, "net.num_route_tokens=4", "train.max_steps=30",
                                 "train.eval_every=30"))
    out = capsys.readouterr().out
    assert out.count("route slots: 4 a frame") == 1 and "15% of the windows train with no route" in out
    start, *rows = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < 0.7 * rows[0]["loss"] and summary["step"] == 30
    assert {"val_loss", "val_loss_no_route"} <= set(rows[-1])
    assert read_world_model_config(tmp_path / "model").num_route_tokens == 4  # as terra.pipeline opens a model
    model = LlamaActionForCausalLM.from_pretrained(tmp_path / "model")
    assert model.config.num_route_tokens == 4 and model.no_route_embedding.shape == (4, 64)
    clips = load_tokens(route_tokens)
    backend = model_backend(tmp_path / "model")
    routes = resample_routes(clips.routes[6], 4)
    requests = [RolloutRequest(clips.codes[6, :2].reshape(2, -1), clips.actions[6], 3, seed=0, routes=r)
                for r in (routes, None)]
    for codes in backend.generate(requests, SamplingConfig(temperature=0), progress=False):
        assert codes.shape == (3, 15) and 0 <= codes.min() and codes.max() < 216


def test_route_data_and_route_models_meet_whatever_the_other_has(route_tokens, plain_tokens, tmp_path, capsys):
    """A route model on tokens without routes trains with "no route" everywhere and says so once; a model without
    route slots ignores the routes of the data: its run equals the run on the same clips without them."""
    train(train_config(plain_tokens, tmp_path / "blind", "net.num_route_tokens=4", "train.max_steps=2"))
    assert capsys.readouterr().out.count("data.tokens holds no routes") == 1
    train(train_config(route_tokens, tmp_path / "a", "train.max_steps=3"))
    train(train_config(plain_tokens, tmp_path / "b", "train.max_steps=3"))
    out = capsys.readouterr().out
    assert "route slots" not in out and "holds no routes" not in out
    a = LlamaActionForCausalLM.from_pretrained(tmp_path / "a" / "model").state_dict()
    b = LlamaActionForCausalLM.from_pretrained(tmp_path / "b" / "model").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_the_shipped_demo_model_grows_route_slots(tmp_path):
    """The warm start scripts/recipes/train_demo.sh offers (init=terra/assets/demo/world_model net.num_route_tokens=8):
    the demo model's 144 + 6 positions a frame become 158, its first frame's logits unchanged."""
    rng = np.random.default_rng(0)
    clips = TokenizedClips(codes=rng.integers(0, 1024, (3, 4, 9, 16)), actions=rng.normal(size=(3, 4, 6, 3)).astype(
        np.float32), poses=np.zeros((3, 4, 3)), codebook_size=1024, image_size=(144, 256))
    tokens = save_tokens(tmp_path / "tokens.safetensors", clips)
    spec = train_spec(train_config(tokens, tmp_path / "run", f"init={DEMO_MODEL}", "net.num_route_tokens=8",
                                   "data.val_clips=1", "train.attn_implementation=eager"))
    grown = build_model(spec, load_training_data(spec.data, spec.val_clips)).eval()
    demo = LlamaActionForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32, attn_implementation="eager").eval()
    assert grown.config.num_spatio_embeddings == 158 and grown.config.max_position_embeddings == 158 * 16
    ids = torch.from_numpy(clips.codes[:1].reshape(1, -1))
    actions = torch.from_numpy(clips.actions[:1].reshape(1, -1, 3))
    with torch.no_grad():
        assert torch.equal(grown(input_ids=ids, actions=actions).logits[:, :150],
                           demo(input_ids=ids, actions=actions).logits[:, :150])


def test_train_demo_trains_route_slots_by_default_and_warm_starts_on_request(tmp_path):
    """scripts/recipes/train_demo.sh world_model passes net.num_route_tokens=8 (ROUTES=0: Terra's layout) and EXTRA's
    init= to terra-train; a stand-in PY records the commands (the run, then the export at the last step)."""
    calls, python = tmp_path / "calls", tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nif [ "$1" = "-c" ]; then echo 7; fi\n')
    python.chmod(0o755)
    for routes, extra in ((None, ""), ("0", "init=terra/assets/demo/world_model")):
        calls.unlink(missing_ok=True)
        env = {**os.environ, "PY": str(python), "RUN": str(tmp_path / "run"), "EXTRA": extra}
        if routes is not None:
            env["ROUTES"] = routes
        done = subprocess.run(["bash", str(ROOT / "scripts" / "recipes" / "train_demo.sh"), "world_model"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        run, last, export = calls.read_text().splitlines()
        assert f"net.num_route_tokens={routes or 8}" in run.split() and last.startswith("-c ")
        assert "train.max_steps=7" in export.split() and f"net.num_route_tokens={routes or 8}" in export.split()
        assert run.endswith(extra) and export.endswith(extra)


def test_a_resumed_route_run_equals_an_uninterrupted_one(route_tokens, tmp_path):
    """The windows and which of them go without a route come from the sampler's generator, saved with the
    checkpoint: a run stopped after every step ends with the weights of one that was not."""
    settings = ("net.num_route_tokens=4", "train.no_route_share=0.5", "train.max_steps=3")
    train(train_config(route_tokens, tmp_path / "whole", *settings))
    for _ in range(3):  # a zero budget stops after one step; each call resumes the last
        train(train_config(route_tokens, tmp_path / "parts", *settings, "train.max_minutes=0"))
    train(train_config(route_tokens, tmp_path / "parts", *settings))  # at max_steps: exports
    a = LlamaActionForCausalLM.from_pretrained(tmp_path / "whole" / "model").state_dict()
    b = LlamaActionForCausalLM.from_pretrained(tmp_path / "parts" / "model").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_a_route_model_learns_what_only_the_next_frames_route_tells(tmp_path):
    """Clips whose frame t codes (every row) are column j: the bucket of frame t's route y at the model's route point
    j, routes drawn at random: without the route slots' values a frame's first row is 5 uniform codes of 16
    (ln 16 x 5 / 15 = 0.92 nats a token at best). A model that reads the route of the frame it draws (frame t - 1's
    slots hold routes[t]) gets below that within 150 steps; slots holding a frame's own route (off by one frame)
    would carry nothing about the next frame and stay at 0.92 or above."""
    rng = np.random.default_rng(0)
    clips, frames, points = 60, 8, 16
    lateral = rng.uniform(-20, 20, (clips, frames, points))
    routes = routes_from_xy(np.stack([np.broadcast_to(route_distances(points), lateral.shape), lateral], -1))
    column = np.clip(((lateral[..., 1:10:2] + 20) / 40 * 16).astype(int), 0, 15)  # K = 8: every second point
    tokens = save_tokens(tmp_path / "tokens.safetensors", TokenizedClips(
        codes=np.repeat(column[:, :, None], 3, axis=2), actions=np.zeros((clips, frames, 6, 3), np.float32),
        poses=np.zeros((clips, frames, 3)), codebook_size=16, image_size=(24, 40), routes=routes))
    train(train_config(tokens, tmp_path / "run", "net.num_route_tokens=8", "train.max_steps=150",
                       "train.eval_every=150", "data.val_clips=8"))
    last = json.loads((tmp_path / "run" / "train_log.jsonl").read_text().splitlines()[-1])
    assert last["val_loss"] < 0.7 and last["val_loss_no_route"] > 0.85, last
