"""scripts/measure_decoding.py on a tiny model and tokenizer (CPU): its pass count is the backend's real one."""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np
import pytest
import torch

from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.models.presets import TINY, TINY_TOKENIZER
from terra.tokenizer import LFQTokenizer
from tests.conftest import load_script, tiny_model


@pytest.fixture(scope="module")
def measure():
    return load_script("measure_decoding")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny world model and the random LFQ tokenizer whose 8x8 codes of 9 bits fit it, saved."""
    root = tmp_path_factory.mktemp("pair")
    tiny_model().save_pretrained(root / "world_model")
    torch.manual_seed(0)
    LFQTokenizer(TINY_TOKENIZER).save_pretrained(root / "tokenizer")
    return root


def run(measure, pair, out, *args: str) -> dict:
    measure.main(["--world-model", str(pair / "world_model"), "--tokenizer", str(pair / "tokenizer"), "--out", str(out),
                  "--rollouts", "3", "--context", "2", "--frames", "2", "--device", "cpu", *args])
    return json.loads(out.read_text())


def test_sequential_takes_one_pass_per_image_token_and_unknown_settings_are_reported(measure, pair, tmp_path,
                                                                                        single_thread):
    report = run(measure, pair, tmp_path / "decoding.json", "--speculative", "no_such_setting=4")
    sequential = [m for m in report["modes"] if m["mode"] == "sequential"]
    assert [m["temperature"] for m in sequential] == [0.0, 0.9]
    for mode in sequential:
        assert mode["available"] and mode["frames"] == 6
        # three rollouts in lock step: one batched call per token, each counting three rows
        assert mode["forward_passes"] == 6 * TINY["num_image_patches"] and mode["batched_calls"] == 2 * 64
        assert mode["passes_per_frame"] == 64 and mode["image_tokens_per_pass"] == 1
        assert len(mode["psnr"]["per_step"]) == 2 and 0 < mode["psnr"]["mean"] < 100
    unknown = [m for m in report["modes"] if m["mode"] == "no_such_setting=4"]
    assert [m["temperature"] for m in unknown] == [0.0, 0.9]
    assert all(not m["available"] and "no_such_setting" in m["reason"] for m in unknown)
    assert report["comparison"] == []
    assert report["layout"] == {"image_tokens": 64, "codebook_size": 512, "frames_per_window": 6}


@pytest.mark.skipif("decoding" not in {f.name for f in fields(SamplingConfig)},
                    reason="this checkout's sampling settings have no speculative decoding")
def test_speculative_codes_equal_sequential_in_fewer_passes(measure, pair, tmp_path, single_thread):
    report = run(measure, pair, tmp_path / "decoding.json", "--temperatures", "0,0.9",
                 "--speculative", "decoding=speculative,draft_tokens=16")
    assert [row["temperature"] for row in report["comparison"]] == [0.0, 0.9]
    for row in report["comparison"]:  # greedy and sampled: the same seeds give the same codes
        assert row["codes_equal"] and row["tokens_equal_fraction"] == 1 and row["fewer_passes"] >= 1
    sequential = next(m for m in report["modes"] if m["mode"] == "sequential")
    assert sequential["sampling"]["decoding"] == "sequential" and sequential["passes_per_frame"] == 64
    for mode in report["modes"]:  # the passes counted at the first decoder layer are the backend's own
        assert mode["backend_reported"]["forward_passes"] == mode["forward_passes"]
        assert mode["backend_reported"]["decoding"] == mode["sampling"]["decoding"]


def test_held_out_clips_skip_the_training_scenes(measure):
    first = int(np.random.default_rng([5, 0]).integers(2**31))
    clips = measure.held_out_clips(2, 2, (16, 24), clip_seed=5, exclude_seed=5, exclude_clips=1)
    assert first not in {c.seed for c in clips} and len(clips) == 2
    assert [c.frames.shape for c in clips] == [(2, 16, 24, 3)] * 2


def test_bad_temperatures_and_settings_are_one_line(measure):
    with pytest.raises(TerraInputError, match="comma-separated numbers"):
        measure.parse_temperatures("greedy")
    with pytest.raises(TerraInputError, match="key=value"):
        measure.parse_settings("decoding")
    assert measure.parse_settings("decoding=speculative, draft_tokens=16") == {"decoding": "speculative",
                                                                                "draft_tokens": 16}
