"""Terra's LFQ tokenizer as published (Open-MAGVIT2 v1): tensor layout, loading, the network's math, losses.

:func:`published_shapes` writes the state-dict names and shapes out from Open-MAGVIT2's ``improved_model.py``
rules for any config; at Terra's config they are also compared with the published list (175 tensors,
65,490,709 parameters of ``lfq_tokenizer_B_256/model.safetensors``) in shared/terra-reference
(tests/conftest.py, ``shared_reference``). :func:`reference_forward` recomputes encode/decode from a raw state
dict with torch.nn.functional alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from terra.core.errors import TerraInputError
from terra.tokenizer import LFQTokenizer, load_tokenizer
from terra.tokenizer.lfq import ENTROPY_TEMPERATURE, TERRA_CONFIG, bits_to_codes, entropies
from terra.tokenizer.magvit2 import depth_to_space
from tests.conftest import shared_reference

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread

TERRA_NUM_PARAMETERS = 65_490_709


def published_config(ch: int = 32, ch_mult=(1, 2), num_res_blocks: int = 1, bits: int = 6) -> dict:
    """A config.json as Terra publishes it (auto_map included), at any size."""
    return {
        "auto_map": {"AutoModel": "modeling_lfq_tokenizer.LFQTokenizer",
                     "AutoConfig": "configuration_lfq_tokenizer.LFQTokenizerConfig"},
        "model_type": "lfq_tokenizer",
        "encoder_decoder_config": {"ch": ch, "in_channels": 3, "out_ch": 3, "z_channels": bits,
                                   "num_res_blocks": num_res_blocks, "ch_mult": list(ch_mult)},
        "quantizer_config": {"dim": bits, "codebook_size": 2**bits, "batch_maximization_weight": 1.0,
                             "sample_minimization_weight": 1.0},
    }


def published_shapes(config: dict) -> dict[str, list[int]]:
    """State-dict names and shapes of an Open-MAGVIT2 v1 tokenizer, written out from improved_model.py."""
    net = config["encoder_decoder_config"]
    ch, mults, blocks, z = net["ch"], net["ch_mult"], net["num_res_blocks"], net["z_channels"]
    shapes: dict[str, list[int]] = {}

    def norm(name, c):
        shapes.update({f"{name}.weight": [c], f"{name}.bias": [c]})

    def conv(name, c_out, c_in, k, bias=True):
        shapes[f"{name}.weight"] = [c_out, c_in, k, k]
        if bias:
            shapes[f"{name}.bias"] = [c_out]

    def res(name, c_in, c_out):
        norm(f"{name}.norm1", c_in)
        norm(f"{name}.norm2", c_out)
        conv(f"{name}.conv1", c_out, c_in, 3, bias=False)
        conv(f"{name}.conv2", c_out, c_out, 3, bias=False)
        if c_in != c_out:
            conv(f"{name}.nin_shortcut", c_out, c_in, 1, bias=False)

    conv("encoder.conv_in", ch, net["in_channels"], 3, bias=False)
    c = ch
    for i, mult in enumerate(mults):
        for j in range(blocks):
            res(f"encoder.down.{i}.block.{j}", c, ch * mult)
            c = ch * mult
        if i < len(mults) - 1:
            conv(f"encoder.down.{i}.downsample", c, c, 3)
    for j in range(blocks):
        res(f"encoder.mid_block.{j}", c, c)
    norm("encoder.norm_out", c)
    conv("encoder.conv_out", z, c, 1)
    conv("decoder.conv_in", c, z, 3)
    for j in range(blocks):
        res(f"decoder.mid_block.{j}", c, c)
    for i in reversed(range(len(mults))):
        for j in range(blocks):
            res(f"decoder.up.{i}.block.{j}", c, ch * mults[i])
            c = ch * mults[i]
        if i > 0:
            conv(f"decoder.up.{i}.upsample.conv1", 4 * c, c, 3)
    norm("decoder.norm_out", c)
    conv("decoder.conv_out", net["out_ch"], c, 3)
    return shapes


def write_published_folder(folder: Path, config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """A tokenizer folder as on the Hub: config.json and random fp32 weights under the published names."""
    generator = torch.Generator().manual_seed(seed)
    weights = {name: torch.randn(shape, generator=generator) * (0.2 if len(shape) == 4 else 1.0)
               for name, shape in published_shapes(config).items()}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=4))
    save_file(weights, folder / "model.safetensors")
    return weights


def reference_forward(sd: dict[str, torch.Tensor], config: dict, images: torch.Tensor):
    """Open-MAGVIT2 v1 encode → latent, and ±1 latent → images, from the raw state dict (functional ops only)."""
    net = config["encoder_decoder_config"]
    levels, blocks = len(net["ch_mult"]), net["num_res_blocks"]

    def conv(x, name, stride=1):
        weight = sd[f"{name}.weight"]
        return F.conv2d(x, weight, sd.get(f"{name}.bias"), stride=stride, padding=weight.shape[-1] // 2)

    def act_norm(x, name):
        return F.silu(F.group_norm(x, 32, sd[f"{name}.weight"], sd[f"{name}.bias"], eps=1e-6))

    def res(x, name):
        h = conv(act_norm(conv(act_norm(x, f"{name}.norm1"), f"{name}.conv1"), f"{name}.norm2"), f"{name}.conv2")
        return h + (conv(x, f"{name}.nin_shortcut") if f"{name}.nin_shortcut.weight" in sd else x)

    def up(x, name):  # conv to 4C channels; channel block (2i + j) fills the pixels at offset (i, j)
        y = conv(x, name)
        c = y.shape[1] // 4
        out = y.new_zeros(y.shape[0], c, 2 * y.shape[2], 2 * y.shape[3])
        for i in range(2):
            for j in range(2):
                out[:, :, i::2, j::2] = y[:, (2 * i + j) * c:(2 * i + j + 1) * c]
        return out

    def encode(x):
        x = conv(x, "encoder.conv_in")
        for i in range(levels):
            for j in range(blocks):
                x = res(x, f"encoder.down.{i}.block.{j}")
            if i < levels - 1:
                x = conv(x, f"encoder.down.{i}.downsample", stride=2)
        for j in range(blocks):
            x = res(x, f"encoder.mid_block.{j}")
        return conv(act_norm(x, "encoder.norm_out"), "encoder.conv_out")

    def decode(z):
        x = conv(z, "decoder.conv_in")
        for j in range(blocks):
            x = res(x, f"decoder.mid_block.{j}")
        for i in reversed(range(levels)):
            for j in range(blocks):
                x = res(x, f"decoder.up.{i}.block.{j}")
            if i > 0:
                x = up(x, f"decoder.up.{i}.upsample.conv1")
        return conv(act_norm(x, "decoder.norm_out"), "decoder.conv_out")

    return encode(images), decode


def images(n: int = 2, size=(32, 48), seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, *size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_terra_layout_equals_the_published_tensors():
    with torch.device("meta"):
        tok = LFQTokenizer({k: v for k, v in TERRA_CONFIG.items() if k != "image_size"})
    ours = {name: list(t.shape) for name, t in tok.state_dict().items()}
    assert ours == published_shapes(published_config(128, [1, 1, 2, 2, 4], 2, 18))
    assert len(ours) == 175 and sum(p.numel() for p in tok.parameters()) == TERRA_NUM_PARAMETERS
    assert tok.image_size == (288, 512) and tok.grid_shape == (18, 32) and tok.codebook_size == 2**18
    reference = json.loads(shared_reference("lfq_tokenizer_B_256.tensors.json").read_text())  # the published list
    assert ours == reference["tensors"]  # same names, same shapes, nothing missing or extra
    assert reference["num_tensors"] == 175 and reference["num_parameters"] == TERRA_NUM_PARAMETERS
    assert sum(math.prod(s) for s in reference["tensors"].values()) == TERRA_NUM_PARAMETERS


def test_published_folder_with_auto_map_loads_and_computes_open_magvit2(tmp_path):
    config = {**published_config(ch=32, ch_mult=[1, 1, 2], num_res_blocks=2, bits=6), "transformers_version": "4.46.0"}
    weights = write_published_folder(tmp_path / "lfq_tokenizer_B_256", config)
    tok = load_tokenizer(tmp_path / "lfq_tokenizer_B_256")
    assert isinstance(tok, LFQTokenizer) and "auto_map" not in tok.config  # no remote code is run or saved
    assert tok.config["transformers_version"] == "4.46.0"  # keys not read are kept for saving back
    assert tok.image_size == (288, 512) and tok.grid_shape == (72, 128)  # no image_size: Terra's 288x512
    assert tok.state_dict().keys() == weights.keys()
    assert all(torch.equal(tok.state_dict()[k], v) for k, v in weights.items())

    x = images(2)
    latent, reference_decode = reference_forward(weights, config, x)
    assert torch.allclose(tok.encode_latent(x), latent, atol=1e-4)
    codes = tok.encode(x)
    assert torch.equal(codes, bits_to_codes((latent > 0).permute(0, 2, 3, 1)))
    signs = torch.where(latent > 0, 1.0, -1.0)
    assert torch.allclose(tok.decode(codes), reference_decode(signs).clamp(-1, 1), atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_round_trip_keeps_the_published_layout(tmp_path, dtype):
    config = published_config()
    torch.manual_seed(0)
    tok = LFQTokenizer({**config, "image_size": [32, 48]}).to(dtype).eval()
    tok.save_pretrained(tmp_path / "tok")
    saved = load_file(tmp_path / "tok" / "model.safetensors")
    assert {k: list(v.shape) for k, v in saved.items()} == published_shapes(config)
    written = json.loads((tmp_path / "tok" / "config.json").read_text())
    assert written == {**{k: v for k, v in config.items() if k != "auto_map"}, "image_size": [32, 48]}
    loaded = load_tokenizer(tmp_path / "tok", dtype=dtype)
    assert loaded.config == tok.config
    for key, value in tok.state_dict().items():
        assert loaded.state_dict()[key].dtype == dtype and torch.equal(loaded.state_dict()[key], value), key
    codes = tok.encode(images(2))
    assert torch.equal(loaded.encode(images(2)), codes)
    assert torch.equal(loaded.decode(codes), tok.decode(codes))


def test_depth_to_space_is_dcr_not_pixel_shuffle():
    x = torch.arange(2 * 12 * 3 * 5, dtype=torch.float32).reshape(2, 12, 3, 5)  # 4 blocks of C = 3 channels
    out = depth_to_space(x)
    assert out.shape == (2, 3, 6, 10)
    for i in range(2):
        for j in range(2):
            assert torch.equal(out[:, :, i::2, j::2], x[:, (2 * i + j) * 3:(2 * i + j + 1) * 3])
    assert not torch.equal(out, F.pixel_shuffle(x, 2))


@pytest.mark.parametrize("bits", [5, 6])
def test_entropies_equal_open_magvit2_softmax_over_the_codebook(bits):
    z = torch.randn(40, bits, generator=torch.Generator().manual_seed(bits)) * 0.01  # soft assignments
    sample, codebook = entropies(z * (4 / ENTROPY_TEMPERATURE))
    # Open-MAGVIT2: logits 2 z·c over all ±1 codes c, softmax at temperature 0.01
    signs = torch.tensor([[1.0 if (k >> (bits - 1 - b)) & 1 else -1.0 for b in range(bits)] for k in range(2**bits)])
    logits = 2 * z @ signs.T / ENTROPY_TEMPERATURE
    probs = logits.softmax(-1)
    avg = probs.mean(0)
    assert float(sample) == pytest.approx(float(-(probs * logits.log_softmax(-1)).sum(-1).mean()), rel=1e-4)
    assert float(codebook) == pytest.approx(float(-(avg * (avg + 1e-5).log()).sum()), rel=1e-4)
    confident = torch.randn(4096, bits, generator=torch.Generator().manual_seed(0)).sign() * 100
    sample, codebook = entropies(confident)
    assert float(sample) < 1e-6 and float(codebook) == pytest.approx(bits * math.log(2), rel=0.01)
    assert float(entropies(torch.full((64, bits), 100.0))[1]) < 1e-3  # one code everywhere


def test_training_pass_losses_and_gradients():
    torch.manual_seed(0)
    tok = LFQTokenizer({**published_config(), "image_size": [32, 48]})
    x = images(2)
    out = tok(x)
    z = tok.encode_latent(x)
    q = tok.quantize(z)
    assert set(out.stats) == {"commitment", "sample_entropy", "codebook_entropy"}
    assert torch.allclose(out.stats["commitment"], F.mse_loss(z, z.sign()))
    assert torch.allclose(q.quantized, torch.where(z > 0, 1.0, -1.0), atol=1e-6)
    expected = 0.1 * (q.sample_entropy - q.codebook_entropy) + 0.25 * q.commitment
    assert torch.allclose(out.quantizer_loss, expected)
    assert torch.equal(out.codes, tok.encode(x))
    out.quantizer_loss.backward()
    assert tok.encoder.conv_in.weight.grad.abs().sum() > 0 and tok.decoder.conv_in.weight.grad is None


def test_a_tiny_tokenizer_learns_to_reconstruct():
    torch.manual_seed(0)
    tok = LFQTokenizer({**published_config(bits=8), "image_size": [16, 16]}).train()
    smooth = F.interpolate(images(8, (4, 4)), size=(16, 16), mode="bilinear", align_corners=False)
    optimizer = torch.optim.Adam(tok.parameters(), lr=2e-3)
    losses = []
    for _ in range(40):
        out = tok(smooth)
        l1 = (out.reconstruction - smooth).abs().mean()
        optimizer.zero_grad()
        (l1 + out.quantizer_loss).backward()
        optimizer.step()
        losses.append(l1.item())
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


@pytest.mark.parametrize("change, message", [
    (lambda c: c["quantizer_config"].update(dim=7), "quantizer_config.dim 7 differs"),
    (lambda c: c["quantizer_config"].update(codebook_size=100), "codebook_size 100 differs"),
    (lambda c: c.pop("encoder_decoder_config"), "lacks encoder_decoder_config"),
    (lambda c: c["encoder_decoder_config"].pop("ch_mult"), "lacks ch_mult"),
    (lambda c: c["encoder_decoder_config"].update(num_res_blocks=0), "num_res_blocks >= 1"),
])
def test_bad_configs_are_one_line_errors(change, message):
    config = published_config()
    change(config)
    with pytest.raises(TerraInputError, match=message) as err:
        LFQTokenizer(config)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("change, message", [
    (lambda c: c["encoder_decoder_config"].update(num_res_blocks=2), "weights do not match the config"),
    (lambda c: c["encoder_decoder_config"].update(ch_mult=[1, 2, 2]), "weights do not match the config"),
    (lambda c: (c["encoder_decoder_config"].update(z_channels=7),
                c["quantizer_config"].update(dim=7, codebook_size=128)), "wrong shape"),
    (lambda c: c["encoder_decoder_config"].update(ch=64), "wrong shape"),
])
def test_weights_that_do_not_match_the_config_are_one_line_errors(tmp_path, change, message):
    config = published_config()
    write_published_folder(tmp_path / "tok", config)
    change(config)
    (tmp_path / "tok" / "config.json").write_text(json.dumps(config))
    with pytest.raises(TerraInputError, match=message) as err:
        load_tokenizer(tmp_path / "tok")
    assert "\n" not in str(err.value) and str(tmp_path / "tok") in str(err.value)
