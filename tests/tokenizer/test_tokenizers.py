"""Tokenizer families: shapes, LFQ bit order, LlamaGen checkpoint names, save/load round trips.

Terra's LFQ network (published layout, Open-MAGVIT2 math, losses, training) is tested in test_tokenizer_lfq.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from terra.core.errors import TerraInputError
from terra.tokenizer import ImageTokenizer, LFQTokenizer, VQTokenizer, load_tokenizer
from terra.tokenizer.lfq import bits_to_codes, codes_to_bits

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread

ROOT = Path(__file__).resolve().parents[2]


def tiny_lfq(seed: int = 0, bits: int = 6) -> LFQTokenizer:
    """3 levels (4x down), 32 channels, 32x48 images → 8x12 codes."""
    torch.manual_seed(seed)
    return LFQTokenizer({
        "encoder_decoder_config": {"ch": 32, "ch_mult": [1, 1, 2], "num_res_blocks": 1, "z_channels": bits,
                                   "in_channels": 3, "out_ch": 3},
        "quantizer_config": {"dim": bits, "codebook_size": 2**bits},
        "image_size": [32, 48],
    }).eval()


def tiny_vq(seed: int = 0, **overrides) -> VQTokenizer:
    torch.manual_seed(seed)
    config = {"ch": 32, "encoder_ch_mult": [1, 1, 2], "decoder_ch_mult": [1, 1, 2], "num_res_blocks": 1,
              "z_channels": 32, "codebook_size": 64, "codebook_embed_dim": 4, "image_size": [32, 48], **overrides}
    return VQTokenizer(config).eval()


def images(n: int = 3, size=(32, 48), seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, *size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.parametrize("make", [tiny_lfq, tiny_vq])
def test_encode_decode_shapes_and_dtypes(make):
    tok = make()
    assert isinstance(tok, ImageTokenizer) and tok.grid_shape == (8, 12) and tok.image_size == (32, 48)
    codes = tok.encode(images(3), batch_size=2)
    assert codes.shape == (3, 8, 12) and codes.dtype == torch.int64
    assert 0 <= int(codes.min()) and int(codes.max()) < tok.codebook_size
    out = tok.decode(codes)
    assert out.shape == (3, 3, 32, 48) and out.dtype == torch.float32
    assert float(out.min()) >= -1 and float(out.max()) <= 1
    assert torch.equal(tok.decode(codes.reshape(3, -1)), out)  # flat [B, h*w] codes are accepted too
    tok_bf16 = make().to(torch.bfloat16)
    assert tok_bf16.encode(images(2)).dtype == torch.int64
    assert tok_bf16.decode(codes[:2]).dtype == torch.bfloat16


def test_lfq_bits_and_codes_are_inverse_with_msb_first():
    codes = torch.arange(2**10)
    bits = codes_to_bits(codes, 10)
    assert torch.equal(bits_to_codes(bits), codes)
    assert torch.equal(codes_to_bits(torch.tensor([512]), 10)[0], torch.tensor([True] + [False] * 9))
    assert bits_to_codes(torch.tensor([[0, 0, 0, 0, 1, 1]])).item() == 3
    # quantisation: channel c positive ⇔ bit c set; the decoder input is the ±1 vector of the bits
    tok = tiny_lfq(bits=6)
    latent = torch.full((1, 6, 1, 2), -0.5)
    latent[0, 0, 0, 0] = 2.0  # channel 0 → most significant bit
    latent[0, 5, 0, 1] = 0.1  # channel 5 → least significant bit
    assert tok.latent_to_codes(latent).tolist() == [[[32, 1]]]
    embedded = tok.codes_to_latent(torch.tensor([[[32, 1]]]))
    assert torch.equal(embedded, torch.where(latent > 0, 1.0, -1.0))


def test_decode_rejects_codes_outside_the_codebook():
    tok = tiny_lfq()
    for bad in (torch.full((1, 8, 12), tok.codebook_size), torch.full((1, 8, 12), -1)):
        with pytest.raises(TerraInputError) as err:
            tok.decode(bad)
        assert "\n" not in str(err.value) and "codebook" in str(err.value)
    with pytest.raises(TerraInputError):
        tok.decode(torch.zeros(1, 8, 12))  # float codes


def llamagen_vq_keys(ch_mult: list[int], num_res_blocks: int) -> set[str]:
    """LlamaGen VQ-16 state-dict names, written out from SPEC §5 and LlamaGen's module structure."""
    keys: set[str] = set()

    def conv(name):
        keys.update({f"{name}.weight", f"{name}.bias"})

    def res(prefix, shortcut):
        for part in ("norm1", "conv1", "norm2", "conv2") + (("nin_shortcut",) if shortcut else ()):
            conv(f"{prefix}.{part}")

    def attn(prefix):
        for part in ("norm", "q", "k", "v", "proj_out"):
            conv(f"{prefix}.{part}")

    last = len(ch_mult) - 1
    conv("encoder.conv_in")
    channels = 1
    for i, mult in enumerate(ch_mult):
        for j in range(num_res_blocks):
            res(f"encoder.conv_blocks.{i}.res.{j}", shortcut=j == 0 and mult != channels)
            if i == last:
                attn(f"encoder.conv_blocks.{i}.attn.{j}")
        channels = mult
        if i != last:
            conv(f"encoder.conv_blocks.{i}.downsample.conv")
    conv("decoder.conv_in")
    for part in ("encoder", "decoder"):
        res(f"{part}.mid.0", False)
        attn(f"{part}.mid.1")
        res(f"{part}.mid.2", False)
        conv(f"{part}.norm_out")
        conv(f"{part}.conv_out")
    channels = ch_mult[-1]  # the decoder starts at the coarsest level's width
    for i, level in enumerate(reversed(range(len(ch_mult)))):
        for j in range(num_res_blocks + 1):
            res(f"decoder.conv_blocks.{i}.res.{j}", shortcut=j == 0 and ch_mult[level] != channels)
            channels = ch_mult[level]
            if level == last:
                attn(f"decoder.conv_blocks.{i}.attn.{j}")
        if level != 0:
            conv(f"decoder.conv_blocks.{i}.upsample.conv")
    conv("quant_conv")
    conv("post_quant_conv")
    keys.add("quantize.embedding.weight")
    return keys


def test_llamagen_checkpoint_loads_strictly(tmp_path):
    ch_mult = [1, 1, 2, 2, 4]  # VQ-16's levels (small channels keep the test fast)
    source = tiny_vq(seed=1, encoder_ch_mult=ch_mult, decoder_ch_mult=ch_mult, num_res_blocks=2, image_size=[32, 32])
    expected = llamagen_vq_keys(ch_mult, 2)
    assert set(source.state_dict()) == expected
    state = {k: v.clone() for k, v in source.state_dict().items()}
    state["quantize.codebook_used"] = torch.zeros(65536)  # LlamaGen's usage buffer is dropped on load
    raw = {k: torch.randn_like(v) for k, v in state.items()}  # the non-EMA weights, which LlamaGen's loader skips
    torch.save({"model": raw, "ema": state, "optimizer": {}, "steps": 10, "args": argparse.Namespace(vq_model="VQ-16")},
               tmp_path / "vq_ds16_c2i.pt")
    loaded = VQTokenizer.from_llamagen(
        tmp_path / "vq_ds16_c2i.pt", **{k: source.config[k] for k in ("ch", "z_channels", "codebook_size",
                                                                        "codebook_embed_dim", "image_size")}
    )
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    x = images(2, (32, 32))
    assert torch.equal(loaded.encode(x), source.encode(x))


def test_weights_with_wrong_keys_give_one_line_error(tmp_path):
    tok = tiny_vq()
    state = tok.state_dict()
    state["extra.weight"] = torch.zeros(1)
    with pytest.raises(TerraInputError) as err:
        tiny_vq().load_weights(state)
    assert "extra.weight" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("spoil, message", [
    (lambda t: t.fill_(float("nan")), r"holds \d+ NaN or infinite value\(s\) of \d+; the tokenizer's weights are "),
    (lambda t: t.int(), "holds torch.int32 numbers where floating point is needed"),
])
def test_nan_or_integer_weights_are_refused_at_load(tmp_path, spoil, message):
    tiny_vq().save_pretrained(tmp_path / "tok")
    weights = load_file(tmp_path / "tok" / "model.safetensors")
    name = next(k for k, v in weights.items() if v.is_floating_point() and v.ndim == 4)
    weights[name] = spoil(weights[name])
    save_file(weights, tmp_path / "tok" / "model.safetensors", metadata={"format": "pt", "model_type": "vq_tokenizer"})
    with pytest.raises(TerraInputError, match=f"{tmp_path / 'tok'}: tensor {name} {message}") as err:
        load_tokenizer(tmp_path / "tok")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("make", [tiny_lfq, tiny_vq])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_round_trip_is_bit_exact(tmp_path, make, dtype):
    tok = make(seed=4).to(dtype)
    tok.save_pretrained(tmp_path / "tok")
    config = json.loads((tmp_path / "tok" / "config.json").read_text())
    assert config["model_type"] == tok.model_type
    assert sorted(p.name for p in (tmp_path / "tok").iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_tokenizer(tmp_path / "tok", dtype=dtype)
    assert type(loaded) is type(tok) and loaded.config == tok.config
    for key, value in tok.state_dict().items():
        assert loaded.state_dict()[key].dtype == dtype and torch.equal(loaded.state_dict()[key], value), key
    x = images(2)
    codes = tok.encode(x)
    assert torch.equal(loaded.encode(x), codes)
    assert torch.equal(loaded.decode(codes), tok.decode(codes))


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(TerraInputError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"model_type": "magic"}))
    with pytest.raises(TerraInputError, match="not a known tokenizer"):
        load_tokenizer(tmp_path / "bad")
    tiny_lfq().save_pretrained(tmp_path / "lfq")
    with pytest.raises(TerraInputError, match="VQTokenizer"):
        VQTokenizer.from_pretrained(tmp_path / "lfq")


def test_benchmark_script_measures_the_demo_tokenizer():
    script = ROOT / "scripts" / "bench" / "benchmark_tokenizer.py"
    spec = importlib.util.spec_from_file_location("benchmark_tokenizer", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = bench.benchmark("lfq_demo", torch.device("cpu"), torch.float32, batch=1, frames=1, warmup=0)
    assert row["input"] == "144x256" and row["codes"] == "9x16" and row["codebook"] == 1024
    assert row["encode_fps"] > 0 and row["decode_fps"] > 0
