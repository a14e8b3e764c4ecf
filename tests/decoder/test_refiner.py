"""decoder/refiner: Terra's video refiner on diffusers' modules.

The full-size network is built on the meta device (no weights) and compared with the published tensor list;
a tiny random refiner of the same architecture, saved in the published ``{"module": ...}`` format with
``_forward_module.`` prefixes, runs the whole refinement on the CPU. The pass plan, guidance ramp, EDM sigmas
and decoder windows are compared with values worked out by hand from Terra's inference config, the sampler's
latents with Terra's step formulas written out here in the published dtypes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers", reason="the refiner needs diffusers (pip install '.[refiner]')")

from terra.decoder.refiner import TERRA, TINY, decode_windows, guidance_scales, load_refiner, plan_passes  # noqa: E402
from terra.decoder.refiner.checkpoint import key_table  # noqa: E402
from terra.decoder.refiner.model import VideoRefiner  # noqa: E402
from terra.decoder.refiner.sampler import (
    Predictor, conditioning_vector, denoise, euler_step, initial_latents, scalings, sigma_schedule, unet_predictor,
)
from tests.conftest import shared_reference  # noqa: E402
from terra.tokenizer import LFQTokenizer  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread

# Parameters of the published refiner by state-dict prefix (Terra's inference.yaml, counted from its tensors).
UNET_PARAMETERS = 1_526_673_642  # model.* (VideoUNet, cond_time_stack_embed included)
FIRST_STAGE_PARAMETERS = 97_742_775  # first_stage_model.* (temporal autoencoder)
CONDITIONER_PARAMETERS = 83_653_863  # conditioner.embedders.3.* (SD autoencoder)


def tiny_tokenizer() -> LFQTokenizer:
    """A random LFQ tokenizer: 16x24 images, 8x12 codes of 5 bits."""
    torch.manual_seed(0)
    return LFQTokenizer({"encoder_decoder_config": {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "z_channels": 5},
                         "image_size": [16, 24]}).eval()


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    """A random tiny refiner saved as Terra publishes refiner_model.pt."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("refiner") / "refiner_model.pt"
    VideoRefiner(TINY).save_published(path)
    return path


@pytest.fixture(scope="module")
def tiny(tiny_file) -> VideoRefiner:
    return load_refiner(tiny_file, "tiny", device="cpu")


def codes(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 32, (n, 8, 12), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------- full size, no weights

def test_full_size_refiner_has_exactly_the_published_tensors():
    with torch.device("meta"):
        refiner = VideoRefiner(TERRA)
    counts = {part: sum(p.numel() for p in getattr(refiner, part).parameters())
              for part in ("unet", "cond_time_stack_embed", "cond_encoder", "temporal_vae")}
    assert counts["unet"] + counts["cond_time_stack_embed"] == UNET_PARAMETERS
    assert counts["temporal_vae"] == FIRST_STAGE_PARAMETERS
    assert counts["cond_encoder"] == CONDITIONER_PARAMETERS
    table = key_table({k: v.shape for k, v in refiner.state_dict().items()}, TERRA)
    assert len(table) == len(refiner.state_dict())
    reference = shared_reference("video_refiner.tensors.json")  # the parameter counts above are checked anyway
    published = {name: tuple(shape) for name, shape in json.loads(reference.read_text())["tensors"].items()}
    assert sorted(set(published) - set(table)) == []  # missing from the refiner
    assert sorted(set(table) - set(published)) == []  # unexpected
    assert [k for k in published if table[k][1] != published[k]] == []  # reshaped


def test_group_norm_epsilons_are_the_published_networks():
    """Terra's UNet res blocks normalise with GroupNorm32 (torch's 1e-5), its transformers and autoencoders with
    1e-6; diffusers builds 72 of the 88 res-block norms with 1e-6 unless told otherwise."""
    with torch.device("meta"):
        refiner = VideoRefiner(TERRA)
    found: dict[tuple[str, float], int] = {}
    for name, module in refiner.unet.named_modules():
        if isinstance(module, torch.nn.GroupNorm):
            part = "res_block" if ".resnets." in name else "transformer" if ".attentions." in name else name
            found[part, module.eps] = found.get((part, module.eps), 0) + 1
    assert found == {("res_block", 1e-5): 88, ("transformer", 1e-6): 16, ("conv_norm_out", 1e-5): 1}
    decoder_norms = {(".time_stack." in name or "temporal_res_block" in name, module.eps)
                     for name, module in refiner.temporal_vae.decoder.named_modules()
                     if isinstance(module, torch.nn.GroupNorm)}
    assert decoder_norms == {(False, 1e-6), (True, 1e-5)}  # Normalize vs the time stack's GroupNorm32


def test_attention_is_pytorch_sdpa():
    with torch.device("meta"):
        refiner = VideoRefiner(TINY)
    processors = {type(p).__name__ for part in (refiner.unet, refiner.cond_encoder, refiner.temporal_vae)
                  for p in part.attn_processors.values()}
    assert processors == {"AttnProcessor2_0"}


# ---------------------------------------------------------------------------------------- published recipe by hand

def test_passes_cover_the_video_with_the_published_overlaps():
    assert plan_passes(25, 25, 3) == [(0, 25, 0)]
    assert plan_passes(47, 25, 3) == [(0, 25, 0), (22, 47, 3)]  # ACT-Bench: 3 context + 44 frames
    assert plan_passes(50, 25, 3) == [(0, 25, 0), (22, 47, 3), (25, 50, 22)]  # never past the end
    assert plan_passes(70, 25, 3) == [(0, 25, 0), (22, 47, 3), (44, 69, 3), (45, 70, 24)]
    assert plan_passes(10, 25, 3) == [(0, 10, 0)]
    for frames in (26, 47, 48, 71, 100):
        passes = plan_passes(frames, 25, 3)
        assert sum(end - start - drop for start, end, drop in passes) == frames
        assert all(end - start == 25 and drop >= 3 for start, end, drop in passes[1:])


def test_guidance_ramps_from_1_5_to_3_over_25_frames():
    scales = guidance_scales(25, 25, 1.5, 3.0)  # 1.5 + k / 16
    assert scales[[0, 8, 12, 16, 24]].tolist() == [1.5, 2.0, 2.25, 2.5, 3.0]
    assert torch.allclose(scales[1:] - scales[:-1], torch.full((24,), 1 / 16))
    assert guidance_scales(5, 25, 1.5, 3.0).tolist() == [1.5, 1.5625, 1.625, 1.6875, 1.75]


def test_edm_sigmas_and_noise_conditioning_of_the_published_sampler():
    sigmas = sigma_schedule(TERRA)
    assert sigmas.dtype == torch.bfloat16 and len(sigmas) == 16 and sigmas[-1] == 0  # 15 Euler steps, then 0
    # (700^(1/7) + i/14 (0.002^(1/7) - 700^(1/7)))^7 by hand, then bf16 (8 significant bits) as Terra's sampler
    values = sigmas.tolist()
    assert values[0] == 700.0 and values[1] == 454.0 and values[14] == pytest.approx(0.002, rel=2e-3)
    assert values[7] == pytest.approx(15.6, rel=4e-3)
    assert all(values[i] > values[i + 1] for i in range(15))
    # v-prediction with EDM noise conditioning, float32 from the bf16 sigma (autocast's pow, reciprocal and log)
    c_skip, c_out, c_in, c_noise = scalings(torch.tensor(3.0, dtype=torch.bfloat16))
    assert {c.dtype for c in (c_skip, c_out, c_in, c_noise)} == {torch.float32}
    assert (c_skip.item(), c_out.item(), c_in.item()) == pytest.approx((1 / 10, -3 / math.sqrt(10), 1 / math.sqrt(10)))
    assert scalings(sigmas[0])[3] == pytest.approx(math.log(700) / 4, rel=1e-7)  # 1.6378, not its bf16 1.6406
    noise = torch.tensor([1.0, 1 / 3])
    assert initial_latents(noise, sigmas[0], "float32").tolist() == pytest.approx([700.0007, 233.3336], rel=1e-7)
    assert initial_latents(noise, sigmas[0], "published").tolist() == [700.0, 234.0]  # bf16(1/3) · 700 → bf16


def test_published_euler_step_is_bf16_and_float32_is_not():
    sigmas = sigma_schedule(TINY)  # 4 steps: 700, 70.5, 2.27, 0.002, 0
    assert sigmas[:2].tolist() == [700.0, 70.5]
    x, denoised = torch.full((2,), 700.0), torch.zeros(2)  # pure noise: x lands at dt + 700
    assert euler_step(x, denoised, sigmas[0], sigmas[1], "published").tolist() == [72.0, 72.0]  # dt bf16: -628
    assert euler_step(x, denoised, sigmas[0], sigmas[1], "float32").tolist() == [70.5, 70.5]  # dt -629.5
    x, denoised = torch.tensor([0.5, -0.25]), torch.tensor([0.25, 0.5])
    assert euler_step(x, denoised, sigmas[3], sigmas[4], "published").tolist() == pytest.approx([0.25, 0.5])  # sigma 0


def test_vector_conditioning_is_cond_aug_fps_id_motion_bucket_in_that_order():
    assert conditioning_vector(TERRA, 2, torch.device("cpu")).tolist() == [[0.0, 9.0, 127.0]] * 2


def test_temporal_decoder_windows():
    assert decode_windows(4, 1, 3) == [(0, 1, 0), (1, 2, 0), (2, 3, 0), (3, 4, 0)]  # Terra: one frame per call
    assert decode_windows(25, 14, 3) == [(0, 14, 0), (11, 25, 3)]  # Vista's default of 14
    assert decode_windows(30, 14, 3) == [(0, 14, 0), (11, 25, 3), (22, 30, 3)]
    assert decode_windows(2, 14, 3) == [(0, 2, 0)]


# ---------------------------------------------------------------------------------------- the tiny refiner

def test_saved_file_has_the_published_format(tiny_file):
    data = torch.load(tiny_file, weights_only=True)
    assert list(data) == ["module"]
    names = list(data["module"])
    assert names and all(n.startswith("_forward_module.") for n in names)
    assert "_forward_module.model.diffusion_model.input_blocks.0.0.weight" in names
    assert "_forward_module.first_stage_model.decoder.conv_out.time_mix_conv.weight" in names
    mid = {n.split(".")[4] for n in names if n.startswith("_forward_module.first_stage_model.decoder.mid.")}
    assert mid == {"block_1", "attn_1", "block_2"}  # VideoDecoder's mid block at any size


def test_refining_5_frames_gives_5_frames_at_the_configured_size(tiny):
    tok = tiny_tokenizer()
    video = tiny.refine(codes(5), tok, seed=3)
    assert video.frames.shape == (5, TINY.height, TINY.width, 3) and video.frames.dtype == np.uint8
    assert video.frames.std() > 1
    assert set(video.timings) == {"token_decode_s", "cond_encode_s", "unet_s", "temporal_decode_s", "total_s"}
    assert np.array_equal(tiny.refine(codes(5), tok, seed=3).frames, video.frames)  # same seed, same frames
    assert not np.array_equal(tiny.refine(codes(5), tok, seed=4).frames, video.frames)
    assert not np.array_equal(tiny.refine(codes(5, seed=1), tok, seed=3).frames, video.frames)  # codes matter


def test_longer_video_is_refined_in_overlapping_passes(tiny):
    tok = tiny_tokenizer()
    long = tiny.refine(codes(8), tok, seed=0).frames  # passes (0, 5) and (3, 8): 5 + 3 frames
    assert long.shape == (8, TINY.height, TINY.width, 3)
    first_pass = tiny.refine(codes(8)[:5], tok, seed=0).frames  # the same first pass: same noise, same frames
    assert np.abs(long[:5].astype(int) - first_pass.astype(int)).max() <= 1


def test_published_guidance_is_one_branch_equal_to_two_identical_branches(tiny):
    cond = torch.randn(5, TINY.latent_channels, *TINY.latent_size, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(1, *cond.shape, generator=torch.Generator().manual_seed(1))
    scales = guidance_scales(5, 5, 1.5, 3.0)
    batches = []
    hook = tiny.unet.register_forward_hook(lambda module, args, kwargs_out: batches.append(args[0].shape[0]))
    try:
        one = denoise(tiny, noise, cond, None, scales)
        two = denoise(tiny, noise, cond, cond, scales)
        zero = denoise(tiny, noise, cond, torch.zeros_like(cond), scales)
    finally:
        hook.remove()
    assert batches == [1] * TINY.num_steps + [2] * (2 * TINY.num_steps)  # both branches in one UNet call
    assert torch.allclose(one, two, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(one, zero, atol=1e-2)


def published_loop(predict: Predictor, noise: torch.Tensor, zero_frames: bool, scales: torch.Tensor,
                   bf16_step: bool) -> torch.Tensor:
    """Terra's EulerEDMSampler, Denoiser(VScalingWithEDMcNoise) and LinearPredictionGuider written out line by line
    on ``[N]``-shaped bf16 sigmas (frames as the batch, both guider halves), ``uc = c`` unless ``zero_frames``.
    ``.float()`` marks what autocast("cuda") computes in float32 (pow, reciprocal, log); the in-place bf16 product
    reads its float32 factor as bf16. ``bf16_step`` False: the float32 variant (noise and dt in float32)."""
    ramp = torch.linspace(0, 1, TINY.num_steps)
    low, high = TINY.sigma_min ** (1 / TINY.rho), TINY.sigma_max ** (1 / TINY.rho)
    sigmas = torch.cat([(high + ramp * (low - high)) ** TINY.rho, torch.zeros(1)]).bfloat16()
    x = noise[0].bfloat16() if bf16_step else noise[0]
    scale = torch.sqrt(1.0 + sigmas[0].float() ** 2)
    x = x * (scale.bfloat16() if bf16_step else scale)
    s_in = torch.ones(len(x), dtype=torch.bfloat16)
    n = len(x)
    for i in range(TINY.num_steps):
        sigma, next_sigma = s_in * sigmas[i], s_in * sigmas[i + 1]  # gamma 0: sigma_hat = sigma
        s = torch.cat([sigma] * 2)[:, None, None, None]
        c_skip = 1.0 / (s.float() ** 2 + 1.0)
        c_out = -s / (s.float() ** 2 + 1.0) ** 0.5
        c_in = 1.0 / (s.float() ** 2 + 1.0) ** 0.5
        c_noise = 0.25 * s.float().log()
        doubled = torch.cat([x] * 2)
        v = predict((doubled * c_in)[:n][None], c_noise[0, 0, 0, 0])  # [1 or 2, N, ...]: c, or uc and c
        v = torch.cat([v[0], v[-1]]) if zero_frames else torch.cat([v[0]] * 2)
        denoised = v * c_out + doubled * c_skip
        x_u, x_c = denoised.chunk(2)
        denoised = x_u + scales[:, None, None, None] * (x_c - x_u)
        d = (x - denoised) / sigma[:, None, None, None]
        dt = next_sigma - sigma if bf16_step else next_sigma.float() - sigma.float()
        x = x + dt[:, None, None, None] * d
    return x


@pytest.mark.parametrize("guidance", ["published", "zero_frames"])
def test_sampler_latents_equal_the_published_step_formulas(tiny, monkeypatch, guidance):
    cond = torch.randn(5, TINY.latent_channels, *TINY.latent_size, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(1, *cond.shape, generator=torch.Generator().manual_seed(1))
    scales = guidance_scales(5, 5, 1.5, 3.0)
    uncond = torch.zeros_like(cond) if guidance == "zero_frames" else None
    predict = unet_predictor(tiny, cond, uncond)
    results = {}
    for arithmetic in ("published", "float32"):
        monkeypatch.setattr(tiny, "config", TINY.replace(guidance=guidance, arithmetic=arithmetic))
        results[arithmetic] = denoise(tiny, noise, cond, uncond, scales)[0]
        reference = published_loop(predict, noise, uncond is not None, scales, arithmetic == "published")
        assert results[arithmetic].dtype == reference.dtype == torch.float32
        assert torch.equal(results[arithmetic], reference), arithmetic
    difference = (results["published"] - results["float32"]).abs().max() / results["float32"].abs().max()
    assert difference > 0.01  # bf16 steps: about 10 % of the largest latent after 4 steps, far beyond rounding


# ---------------------------------------------------------------------------------------- bad input, one line

def test_missing_empty_truncated_or_foreign_files_fail_with_one_line(tiny_file, tmp_path):
    def fails(path, config="tiny") -> str:
        with pytest.raises(TerraInputError) as err:
            load_refiner(path, config, device="cpu")
        assert "\n" not in str(err.value)
        return str(err.value)

    assert "not found" in fails(tmp_path / "nope.pt") and "turing-motors/Terra" in fails(tmp_path / "nope.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    assert "empty" in fails(tmp_path / "empty.pt")
    data = tiny_file.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    assert "truncated" in fails(tmp_path / "cut.pt")
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    assert "not Terra's video refiner" in fails(tmp_path / "other.pt")
    torch.save({"module": tiny_tokenizer().state_dict()}, tmp_path / "tokenizer.pt")
    assert "none of its" in fails(tmp_path / "tokenizer.pt")
    assert "other shapes" in fails(tiny_file, TINY.replace(context_dim=64))
    assert "architecture" in fails(tiny_file, TINY.replace(layers_per_block=2))


def test_full_size_refiner_on_a_cpu_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(TerraInputError, match="needs a CUDA GPU.*allow_cpu=true"):
        load_refiner(tmp_path / "missing.pt", "terra", device="cpu")
    with pytest.raises(TerraInputError, match="unknown refiner settings"):
        TINY.replace(steps=3)
    with pytest.raises(TerraInputError, match="multiple of"):
        TINY.replace(height=30)
    with pytest.raises(TerraInputError,
                       match=r"arithmetic 'bf16' is unknown; choose one of \['published', 'float32'\]"):
        TINY.replace(arithmetic="bf16")
