"""The Transformers world model, the token layout and the Transformers backend (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tests.conftest import TINY, tiny_model
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from terra.core.errors import TerraInputError
from terra.config.sampling import SamplingConfig
from terra.generation.backends import model_backend
from terra.contract.layout import TokenLayout, plan_windows
from terra.generation.rollout import RolloutRequest, RolloutState
from terra.models import LlamaActionConfig, LlamaActionForCausalLM

P, A, S, WINDOW = 64, 6, 70, 6
PLACEHOLDER = 512


def random_frames(frames: int, seed: int, num_actions: int | None = None,
                  grid: tuple[int, ...] = (P,)) -> tuple[np.ndarray, np.ndarray]:
    """Random codes ``[frames, *grid]`` and actions ``[num_actions or frames, A, 3]``, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 512, (frames, *grid))
    return codes, rng.normal(size=(num_actions or frames, A, 3)).astype(np.float32)


def interleaved(codes: np.ndarray) -> list[int]:
    """Reference layout written out by hand: each frame's image codes then A placeholder ids."""
    out: list[int] = []
    for frame in codes.reshape(len(codes), -1):
        out += frame.tolist() + [PLACEHOLDER] * A
    return out


# ------------------------------------------------------------------------------------------------ layout


def test_layout_positions_match_spec():
    layout = TokenLayout(image_tokens=P, action_tokens=A, max_frames=WINDOW, codebook_size=512, slot_token_id=512)
    assert layout.window_positions == WINDOW * S - A
    ids = np.array(layout.prompt_ids(np.zeros((WINDOW, P), np.int64)))
    expected = [t * S + P + k for t in range(WINDOW) for k in range(A)]
    assert np.flatnonzero(ids == PLACEHOLDER).tolist() == expected


def test_rollout_prompts_in_first_middle_and_rolled_over_window():
    layout = TokenLayout(image_tokens=P, action_tokens=A, max_frames=WINDOW, codebook_size=512, slot_token_id=512)
    context, actions = random_frames(2, seed=0, num_actions=20, grid=(8, 8))
    state = RolloutState(RolloutRequest(context, actions, num_frames=9, overlap=3), layout)
    assert [tuple(vars(w).values()) for w in state.windows] == [(0, 2, 4), (3, 3, 3), (6, 3, 2)]

    ids, acts, pos = state.prompt()  # first window: the 2 context frames
    assert ids == interleaved(context)
    np.testing.assert_array_equal(acts, actions[:2])
    assert pos.tolist() == list(range(2 * S))

    new = list(random_frames(6, seed=5)[0])
    for frame in new[:3]:
        state.add_frame(frame)
    ids, acts, pos = state.prompt()  # middle of the first window: 5 frames so far, next is slot 5
    assert len(ids) == 5 * S and pos[-1] == 5 * S - 1
    assert ids[3 * S : 3 * S + P] == new[1].tolist()

    state.add_frame(new[3])  # window 0 is full (6 frames) → window 1 starts at frame 3
    assert state.window_index == 1 and state.window_starts
    ids, acts, pos = state.prompt()
    all_frames = [*context.reshape(2, -1), *new[:4]]
    assert ids == interleaved(np.stack(all_frames[3:6]))  # last 3 frames as tokens, positions restart at 0
    assert pos.tolist() == list(range(3 * S))
    np.testing.assert_array_equal(acts, actions[3:6])


def test_plan_windows_covers_every_frame_once():
    for ctx, gen in [(1, 1), (3, 22), (3, 23), (5, 60), (24, 30)]:
        windows = plan_windows(ctx, gen, 25, 3)
        produced = [f for w in windows for f in range(w.start + w.num_context, w.end)]
        assert produced == list(range(ctx, ctx + gen))
        assert all(w.num_context + w.num_new <= 25 for w in windows)
    with pytest.raises(TerraInputError, match="context frames"):
        plan_windows(25, 1, 25, 3)
    with pytest.raises(TerraInputError, match="num_frames"):
        plan_windows(3, 0, 25, 3)


# -------------------------------------------------------------------------------------------- the model


def full_sequence(model, codes, actions):
    """Logits of one full forward over interleaved frames (training-style call)."""
    ids = torch.as_tensor(codes).reshape(1, -1)
    return model(input_ids=ids, actions=torch.as_tensor(actions).reshape(1, -1, 3)).logits[0]


def test_training_style_call_returns_interleaved_logits():
    model = tiny_model()
    codes = torch.randint(0, 512, (2, 3 * P))
    actions = torch.randn(2, 3 * A, 3)
    out = model(input_ids=codes, actions=actions)
    assert out.logits.shape == (2, 3 * S, TINY["vocab_size"])
    # The same call in the interleaved form gives the same logits.
    ids, acts = model.interleave(codes, actions)
    assert ids.shape == (2, 3 * S) and (ids[:, P : P + A] == PLACEHOLDER).all()
    pos = torch.arange(3 * S).expand(2, -1)
    torch.testing.assert_close(model(input_ids=ids, conditions=acts, position_ids=pos).logits, out.logits)


@torch.no_grad()
def test_incremental_decoding_matches_full_forward():
    model = tiny_model()
    codes, actions = random_frames(3, seed=1)
    full = full_sequence(model, codes, actions)

    ids = torch.tensor(interleaved(codes))
    acts = torch.from_numpy(actions)
    cache = DynamicCache()
    pieces = []
    # prefill frame 0 + its actions, then token by token, then frame 1's actions in one step, ...
    chunks = ([(0, S)] + [(p, p + 1) for p in range(S, S + P)] + [(S + P, 2 * S)]
              + [(p, p + 1) for p in range(2 * S, 3 * S)])
    used = 0
    for lo, hi in chunks:
        n_slots = int((ids[lo:hi] == PLACEHOLDER).sum())
        out = model(
            input_ids=ids[None, lo:hi],
            conditions=acts.reshape(-1, 3)[None, used : used + n_slots] if n_slots else None,
            position_ids=torch.arange(lo, hi)[None],
            cache=cache,
            use_cache=True,
        )
        used += n_slots
        pieces.append(out.logits[0])
    incremental = torch.cat(pieces)
    assert incremental.shape == full.shape
    assert (incremental - full).abs().max().item() <= 1e-4


@torch.no_grad()
def test_action_change_affects_only_later_frames():
    model = tiny_model()
    codes, actions = random_frames(4, seed=2)
    changed = actions.copy()
    changed[1] += 1.0  # a_1 conditions frame 2
    before, after = full_sequence(model, codes, actions), full_sequence(model, codes, changed)
    first_changed = 1 * S + P  # frame 1's action slots
    torch.testing.assert_close(before[:first_changed], after[:first_changed], rtol=0, atol=0)
    frame2 = slice(2 * S, 2 * S + P)
    assert (before[frame2] - after[frame2]).abs().max().item() > 1e-3


def test_v2_mlp_action_projection():
    model = tiny_model(architectures=["LlamaActionV2ForCausalLM"], action_mlp_hidden_size=32)
    names = {n for n, _ in model.named_parameters() if n.startswith("action_projection")}
    assert names == {f"action_projection.{i}.{w}" for i in (0, 2, 4) for w in ("weight", "bias")}
    out = model(input_ids=torch.randint(0, 512, (1, P)), actions=torch.randn(1, A, 3))
    assert out.logits.shape == (1, S, TINY["vocab_size"])


@torch.no_grad()
def test_zero_embed_code_0_changes_only_code_0s_embedding():
    """Terra's vLLM port embeds image code 0 as zeros (terra/models/configuration_llama_action.py): on, the
    token embedding of code 0 is gone (its position embedding stays); every other input embedding is unchanged."""
    model = tiny_model()
    assert not model.config.zero_embed_code_0  # off by default
    rng = np.random.default_rng(6)
    codes = rng.integers(1, 512, (2, P))
    codes[0, [5, 9, 40]] = 0
    codes[1, 63] = 0
    ids = torch.tensor(interleaved(codes))[None]  # two frames, each with its action slots
    actions = torch.from_numpy(rng.normal(size=(1, 2 * A, 3)).astype(np.float32))
    positions = torch.arange(ids.shape[1])[None]
    plain = model.embed(ids, actions, positions)[0]
    model.config.zero_embed_code_0 = True
    zeroed = model.embed(ids, actions, positions)[0]
    is_zero = ids[0] == 0
    assert int(is_zero.sum()) == 4
    torch.testing.assert_close(zeroed[~is_zero], plain[~is_zero], rtol=0, atol=0)  # codes 1.., action slots
    torch.testing.assert_close(zeroed[is_zero], model.pos_embedding_spatio_temporal(positions[0])[is_zero])
    assert (zeroed[is_zero] - plain[is_zero]).abs().amax(-1).min() > 0  # code 0's token embedding is not zero
    logits = model(input_ids=ids, conditions=actions, position_ids=positions).logits[0]
    model.config.zero_embed_code_0 = False
    first_zero = int(is_zero.nonzero()[0])
    reference = model(input_ids=ids, conditions=actions, position_ids=positions).logits[0]
    torch.testing.assert_close(logits[:first_zero], reference[:first_zero], rtol=0, atol=0)
    assert (logits[first_zero:] - reference[first_zero:]).abs().max() > 1e-3


# ------------------------------------------------------------------------------------ checkpoint format


def terra_config_json(**overrides) -> dict:
    """Terra's published config.json with reduced sizes (Terra's published keys, incl. the remote-code map)."""
    cfg = {
        "architectures": ["LlamaActionForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_llama_action.LlamaActionConfig",
                     "AutoModel": "modeling_llama_action.LlamaActionForCausalLM"},
        "model_type": "llama_action",
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
        "vocab_size": 513, "tie_word_embeddings": False, "max_position_embeddings": 420,
        "hidden_act": "silu", "initializer_range": 0.02, "attention_bias": False, "attention_dropout": 0.0,
        "mlp_bias": False, "pretraining_tp": 1, "bos_token_id": None, "eos_token_id": None,
        "torch_dtype": "bfloat16", "use_cache": True,
        "num_spatio_embeddings": 70, "num_temporal_embeddings": 6, "num_image_patches": 64,
        "num_action_tokens": 6, "action_dim": 3,
    }
    cfg.update(overrides)
    return cfg


def test_terra_config_loads_through_auto_classes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(terra_config_json()))
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, LlamaActionConfig)
    assert config.num_action_tokens == config.num_action_embeddings == 6
    assert (config.codebook_size, config.action_token_id) == (512, 512)
    assert config.action_projection_type == "linear"
    assert config.rope_parameters["rope_theta"] == 10000.0

    model = LlamaActionForCausalLM(config)
    model.save_pretrained(tmp_path / "ckpt")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert type(loaded) is LlamaActionForCausalLM
    saved = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert "pos_embedding_spatio_temporal.spatio_embeddings.weight" in saved
    assert "action_projection.weight" in saved
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    assert set(saved) == set(loaded.state_dict())

    v2 = AutoConfig.from_pretrained(tmp_path / "ckpt", architectures=["LlamaActionV2ForCausalLM"])
    assert v2.action_projection_type == "linear"  # an explicit key in the saved file wins
    (tmp_path / "config.json").write_text(json.dumps(terra_config_json(architectures=["LlamaActionV2ForCausalLM"])))
    assert AutoConfig.from_pretrained(tmp_path).action_projection_type == "mlp"


def test_sharded_checkpoint_loads(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_bad_layout_config_is_rejected():
    with pytest.raises(Exception, match="num_spatio_embeddings"):
        LlamaActionConfig(**{**TINY, "num_spatio_embeddings": 71})


# --------------------------------------------------------------------------------- Transformers backend


@torch.no_grad()
def reference_greedy(model, context: np.ndarray, actions: np.ndarray, num_frames: int, overlap: int) -> np.ndarray:
    """Greedy rollout by full recomputation of every prefix, windows as docs/ARCHITECTURE.md ("Windows") describes
    them, written out independently."""
    frames = [f.reshape(-1) for f in context]
    target = len(context) + num_frames
    start = 0
    while len(frames) < target:
        if len(frames) - start == WINDOW:  # window full: keep the last `overlap` frames
            start = len(frames) - overlap
        ids = interleaved(np.stack(frames[start:]))
        acts = torch.from_numpy(actions[start : len(frames)]).reshape(1, -1, 3)
        new = []
        for _ in range(P):
            seq = torch.tensor(ids + new)[None]
            logits = model(input_ids=seq, conditions=acts, position_ids=torch.arange(seq.shape[1])[None]).logits[0, -1]
            new.append(int(logits[:512].argmax()))
        frames.append(np.array(new))
    return np.stack(frames[len(context) :])


def test_hf_backend_greedy_matches_full_recomputation_across_windows():
    model = tiny_model()
    context, actions = random_frames(2, seed=3, num_actions=12, grid=(8, 8))
    expected = reference_greedy(model, context, actions, num_frames=6, overlap=3)  # crosses one window
    backend = model_backend(model)
    got = backend.generate([RolloutRequest(context, actions, 6)], SamplingConfig(temperature=0), progress=False)[0]
    assert got.shape == (6, P)
    np.testing.assert_array_equal(got, expected)


def test_hf_backend_window_rollover_frame_count_and_seeds():
    backend = model_backend(tiny_model())
    context, actions = random_frames(3, seed=4, num_actions=20)
    seen = []
    reqs = [RolloutRequest(context, actions, 8, seed=7), RolloutRequest(context, actions, 8, seed=7),
            RolloutRequest(context, actions, 8, seed=8)]
    out = backend.generate(reqs, SamplingConfig(temperature=1.0, top_k=50, top_p=0.9), progress=False,
                           on_frame=lambda r, f, c: seen.append((r, f)))
    assert [o.shape for o in out] == [(8, P)] * 3  # 3 + 8 frames over windows of 6: no duplicated overlap
    np.testing.assert_array_equal(out[0], out[1])  # same seed → same tokens
    assert not np.array_equal(out[0], out[2])
    assert sorted(seen) == [(r, f) for r in range(3) for f in range(8)]
    assert all(o.min() >= 0 and o.max() < 512 for o in out)
    # Alone in a batch, a seeded rollout gives the same tokens as inside the batch of three.
    alone = backend.generate([reqs[2]], SamplingConfig(temperature=1.0, top_k=50, top_p=0.9), progress=False)[0]
    np.testing.assert_array_equal(alone, out[2])


def test_hf_backend_never_samples_special_ids():
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight[PLACEHOLDER] = model.lm_head.weight[:512].sum(0) * 50  # placeholder dominates
    backend = model_backend(model)
    context = np.zeros((1, P), dtype=np.int64)  # code 0 is an ordinary image code
    actions = np.zeros((4, A, 3), dtype=np.float32)
    for sampling in (SamplingConfig(temperature=0), SamplingConfig(temperature=1.0)):
        out = backend.generate([RolloutRequest(context, actions, 2, seed=0)], sampling, progress=False)[0]
        assert out.max() < 512


def test_hf_backend_rejects_bad_requests():
    backend = model_backend(tiny_model())
    actions = np.zeros((10, A, 3), dtype=np.float32)
    with pytest.raises(TerraInputError, match="codes"):
        backend.generate([RolloutRequest(np.full((1, P), 600), actions, 2)], SamplingConfig(), progress=False)
    with pytest.raises(TerraInputError, match="expects 64"):
        backend.generate([RolloutRequest(np.zeros((1, 4, 4)), actions, 2)], SamplingConfig(), progress=False)
    with pytest.raises(TerraInputError, match="needs actions for 12"):
        backend.generate([RolloutRequest(np.zeros((2, P)), actions, 11)], SamplingConfig(), progress=False)


def test_auto_classes_register_on_import_terra_models_as_documented():
    """MODEL_CARD.md: the Auto classes load the demo world model after ``import terra.models``, not ``import terra``."""
    import subprocess
    import sys
    from pathlib import Path

    import terra

    folder = Path(terra.__file__).parent / "assets" / "demo" / "world_model"
    probe = (f"import terra; from transformers import AutoModelForCausalLM as A; folder = {str(folder)!r}\n"
             "try:\n    A.from_pretrained(folder); print('loaded without terra.models')\n"
             "except ValueError:\n    print('unknown before')\n"
             "import terra.models; print(type(A.from_pretrained(folder)).__name__)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.stdout.splitlines() == ["unknown before", "LlamaActionForCausalLM"], result.stderr[-2000:]
