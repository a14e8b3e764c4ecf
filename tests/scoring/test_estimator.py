"""The ACT-Estimator (terra/scoring/estimator.py, i3d.py): ACT-Bench's tensor names and shapes
at full size, output shapes and conventions on a small input, and loading published-style weight folders."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from terra.core.errors import TerraInputError
from terra.scoring.estimator import EstimatorConfig, VideoActionEstimator
from terra.scoring.estimator import match_weights
from terra.scoring.i3d import same_padding

REFERENCE = Path(__file__).resolve().parent / "data" / "act_estimator.tensors.json"
SMALL = EstimatorConfig(input_shape=(3, 44, 32, 32), d_model=16, num_heads=2, feature_map_size=2)


@pytest.fixture(scope="module")
def small(single_thread) -> VideoActionEstimator:
    torch.manual_seed(0)
    return VideoActionEstimator(SMALL).eval()


def test_full_size_estimator_has_act_benchs_tensors():
    reference = json.loads(REFERENCE.read_text())
    with torch.device("meta"):
        model = VideoActionEstimator()
    shapes = {name: list(tensor.shape) for name, tensor in model.state_dict().items()}
    assert list(shapes) == list(reference["tensors"])  # names, in ACT-Bench's order
    assert shapes == reference["tensors"]
    assert sum(p.numel() for p in model.parameters()) == reference["parameters"] == 20_405_547
    assert model.config.memory_len == 11 * 4 * 4  # 44 frames → 11 after the backbone, pooled to 4x4


def test_outputs_are_logits_and_waypoints_from_the_origin(small):
    frames = torch.rand(2, 3, 44, 32, 32, generator=torch.Generator().manual_seed(0))
    times = torch.linspace(0, 4.3, 44).view(1, 44, 1).expand(2, -1, -1)
    with torch.inference_mode():
        out = small(frames, times)
        alone = small(frames[1:], times[1:])
    assert out.command.shape == (2, 9) and out.waypoints.shape == (2, 44, 2)
    assert torch.equal(out.waypoints[:, 0], torch.zeros(2, 2))  # the first waypoint is the origin
    assert torch.allclose(alone.command, out.command[1:], atol=1e-5)  # samples do not mix in a batch
    assert torch.allclose(alone.waypoints, out.waypoints[1:], atol=1e-5)


def test_without_timestamps_the_gru_takes_point_and_features_only():
    model = VideoActionEstimator(replace(SMALL, timestamp_dim=0)).eval()
    assert model.visual_odmetry.gru.input_size == 2 + SMALL.d_model
    with torch.inference_mode():
        assert model(torch.rand(1, 3, 44, 32, 32)).waypoints.shape == (1, 44, 2)


@pytest.mark.parametrize("size, kernel, stride, pads", [
    (44, 7, 2, (2, 3)),  # Conv3d_1a_7x7 in time: the extra cell after
    (224, 7, 2, (2, 3)),
    (11, 3, 2, (1, 1)),  # odd size: kernel - size % stride
    (7, 2, 2, (0, 1)),   # MaxPool3d_5a_2x2 on an odd size
    (8, 1, 1, (0, 0)),
    (28, 3, 1, (1, 1)),
])
def test_same_padding_is_tensorflows(size, kernel, stride, pads):
    x = torch.ones(1, 1, size, 1, 1)
    padded = same_padding(x, (kernel, 1, 1), (stride, 1, 1))
    assert padded.shape[2] == size + sum(pads)
    assert padded[0, 0, : pads[0]].sum() == 0 and padded[0, 0, pads[0]: pads[0] + size].sum() == size


# ------------------------------------------------------------------------------------------------- loading


def save(folder: Path, tensors: dict, config: dict | None = None, name: str = "model.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(asdict(SMALL) if config is None else config))
    if name.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / name))
    else:
        torch.save(tensors, folder / name)
    return folder


def test_published_names_a_wrapper_prefix_and_torch_files_load_alike(small, tmp_path):
    state = small.state_dict()
    frames = torch.rand(1, 3, 44, 32, 32, generator=torch.Generator().manual_seed(1))
    times = torch.linspace(0, 4.3, 44).view(1, 44, 1)
    with torch.inference_mode():
        expected = small(frames, times).waypoints
    folders = [save(tmp_path / "plain", state),
               save(tmp_path / "wrapped", {f"model.{k}": v for k, v in state.items()}),
               save(tmp_path / "torch", {"state_dict": state}, name="pytorch_model.bin"),
               save(tmp_path / "lean", {k: v for k, v in state.items()
                                        if not k.endswith(("num_batches_tracked", "positional_encoding.pe"))})]
    for folder in folders:
        model = VideoActionEstimator.from_pretrained(folder)
        assert not model.training and model.config == SMALL
        with torch.inference_mode():
            assert torch.equal(model(frames, times).waypoints, expected), folder.name


def test_config_keys_take_the_published_values_and_foreign_keys_are_ignored(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"d_model": 64, "architectures": ["ActEstimator"], "torch_dtype": "float32"}))
    assert EstimatorConfig.from_json(path) == EstimatorConfig(d_model=64)


@pytest.mark.parametrize("config, message", [
    ({"input_shape": [3, 40, 224, 224]}, "must be [3, max_seq_len (44), height, width]"),
    ({"input_shape": [3, 44, 224]}, "input_shape must be [3, frames, height, width]"),
    ({"d_model": 500}, "multiple of num_heads"),
    ({"timestamp_dim": 2}, "timestamp_dim must be a whole number from 0 to 1"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_configs_are_one_line(tmp_path, config, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(TerraInputError) as err:
        EstimatorConfig.from_json(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def shapes_of(model: VideoActionEstimator) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_foreign_or_misshapen_weights_are_refused_naming_the_first_keys(small):
    shapes, state = shapes_of(small), small.state_dict()
    extra = {**state, "loss.weight": torch.zeros(1)}
    with pytest.raises(TerraInputError, match=r"1 unmatched tensors \(first: loss.weight\), 0 missing"):
        match_weights(extra, shapes, "w")
    renamed = {k.replace("squeeze_linear", "squeeze"): v for k, v in state.items()}
    with pytest.raises(TerraInputError, match=r"2 unmatched tensors \(first: squeeze.bias, squeeze.weight\), 2 "
                                              r"missing \(first: squeeze_linear.bias, squeeze_linear.weight\)"):
        match_weights(renamed, shapes, "w")
    two_prefixes = {**{f"a.{k}": v for k, v in state.items()}, "b.classifier.0.weight": torch.zeros(1)}
    with pytest.raises(TerraInputError, match=r"\(prefix 'a.'\): 1 unmatched tensors \(first: b.classifier"):
        match_weights(two_prefixes, shapes, "w")
    with pytest.raises(TerraInputError, match=r"w: squeeze_linear.weight has shape \[16, 1024\], .* \[32, 1024\]"):
        match_weights(state, {**shapes, "squeeze_linear.weight": (32, 1024)}, "w")


def test_unreadable_folders_are_one_line(small, tmp_path):
    good = save(tmp_path / "good", small.state_dict())
    data = (good / "model.safetensors").read_bytes()
    cases = {"no config.json": (tmp_path / "empty", "has no config.json"),
             "no weights": (tmp_path / "config_only", "has none of model.safetensors, pytorch_model.bin"),
             "truncated": (tmp_path / "cut", "cannot be read"),
             "pickle of code": (tmp_path / "pickled", "cannot be read"),
             "other architecture": (tmp_path / "bigger", "squeeze_linear.weight has shape [16, 1024]")}
    (tmp_path / "empty").mkdir()
    save(tmp_path / "config_only", {}).joinpath("model.safetensors").unlink()
    save(tmp_path / "cut", {}).joinpath("model.safetensors").write_bytes(data[: len(data) // 2])
    save(tmp_path / "pickled", {}).joinpath("model.safetensors").unlink()
    torch.save({"x": torch.nn.Linear(1, 1)}, tmp_path / "pickled" / "model.pt")  # a module: refused by weights_only
    (tmp_path / "bigger").mkdir()
    (tmp_path / "bigger" / "model.safetensors").symlink_to(good / "model.safetensors")
    (tmp_path / "bigger" / "config.json").write_text(json.dumps({**asdict(SMALL), "d_model": 32}))
    for case, (folder, message) in cases.items():
        with pytest.raises(TerraInputError) as err:
            VideoActionEstimator.from_pretrained(folder)
        assert message in str(err.value) and "\n" not in str(err.value), (case, str(err.value))
