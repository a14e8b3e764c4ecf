"""terra/evaluation/decoding.py on a tiny model and tokenizer (CPU): its pass count is the backend's real one, and the
speculative modes give the sequential codes in fewer passes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from terra.core.errors import TerraInputError
from terra.evaluation.decoding import (DecodingSettings, held_out_clips, measure_decoding, parse_settings,
                                      previous_frame_hits)
from terra.models.presets import TINY
from tests.conftest import save_tiny_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny world model and the random LFQ tokenizer whose 8x8 codes of 9 bits fit it, saved."""
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def settings(pair, out, **changes) -> DecodingSettings:
    return DecodingSettings(str(pair / "world_model"), str(pair / "tokenizer"), out, rollouts=3, context=2, frames=2,
                            device="cpu", **changes)


def test_speculative_codes_equal_sequential_in_fewer_passes(pair, tmp_path, single_thread):
    out = tmp_path / "decoding.json"
    report = measure_decoding(settings(pair, out, speculative=("decoding=speculative,draft_tokens=16",)))
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["layout"] == {"image_tokens": 64, "codebook_size": 512, "frames_per_window": 6}
    sequential = [m for m in report["modes"] if m["mode"] == "sequential"]
    assert [m["temperature"] for m in sequential] == [0.0, 0.9]
    for mode in sequential:
        assert mode["available"] and mode["frames"] == 6 and mode["sampling"]["decoding"] == "sequential"
        # three rollouts in lock step: one batched call per token, each counting three rows
        assert mode["forward_passes"] == 6 * TINY["num_image_patches"] and mode["batched_calls"] == 2 * 64
        assert mode["passes_per_frame"] == 64 and mode["image_tokens_per_pass"] == 1
        assert len(mode["psnr"]["per_step"]) == 2 and 0 < mode["psnr"]["mean"] < 100
    for mode in report["modes"]:  # the passes counted at the first decoder layer are the backend's own
        assert mode["backend_reported"]["forward_passes"] == mode["forward_passes"]
        assert mode["backend_reported"]["decoding"] == mode["sampling"]["decoding"]
    speculative = [m for m in report["modes"] if m["mode"] != "sequential"]
    assert {m["sampling"]["draft_tokens"] for m in speculative} == {16}
    assert [row["temperature"] for row in report["comparison"]] == [0.0, 0.9]
    for row in report["comparison"]:  # greedy and sampled: the same seeds give the same codes
        assert row["codes_equal"] and row["tokens_equal_fraction"] == 1 and row["fewer_passes"] >= 1
    for mode in report["modes"]:
        hits = mode["previous_frame_guess"]
        assert 0 <= hits["same_position"] <= hits["any_of_3x3"] <= 1


def test_previous_frame_hits_count_the_guess_and_its_neighbourhood():
    """One rollout of a context frame and three generated 2x3 frames: the first shares nothing with the context; the
    second keeps 2 of the first's codes in place and 1 more one column over; the third is the second shifted down a
    row (its top row new): 0 in place, 3 in the neighbourhood. The context frame's codes count only as the first
    generated frame's guesses."""
    context = np.array([[9, 9, 9], [9, 9, 9]])
    first = np.array([[1, 2, 3], [4, 5, 6]])
    second = np.array([[1, 7, 2], [8, 8, 6]])  # 1 and 6 in place, 2 one column over, 7 and 8 new
    third = np.array([[0, 0, 0], [1, 7, 2]])
    codes = np.stack([context, first, second, third])[None]
    hits = previous_frame_hits(codes, 1)
    assert hits == {"same_position": round(2 / 18, 4), "any_of_3x3": round((2 + 1 + 3) / 18, 4)}


def test_held_out_clips_skip_the_training_scenes():
    first = int(np.random.default_rng([5, 0]).integers(2**31))
    clips = held_out_clips(2, 2, (16, 24), clip_seed=5, exclude_seed=5, exclude_clips=1)
    assert first not in {c.seed for c in clips} and len(clips) == 2
    assert [c.frames.shape for c in clips] == [(2, 16, 24, 3)] * 2


def test_bad_settings_are_one_line_before_any_model_loads(tmp_path):
    with pytest.raises(TerraInputError, match="key=value"):
        parse_settings("decoding")
    assert parse_settings("decoding=speculative, draft_tokens=16") == {"decoding": "speculative", "draft_tokens": 16}
    cases = {"no_such_setting=4": "speculative settings 'no_such_setting=4': sampling must be an object",
             "decoding=jacobi": "unknown sampling.decoding 'jacobi'"}
    for text, message in cases.items():
        with pytest.raises(TerraInputError, match=message) as err:
            DecodingSettings("wm", "tok", tmp_path / "x.json", speculative=(text,))
        assert "\n" not in str(err.value)
    with pytest.raises(TerraInputError, match="rollouts must be a whole number"):
        DecodingSettings("wm", "tok", tmp_path / "x.json", rollouts=0)
    with pytest.raises(TerraInputError, match="sampling.temperature"):
        DecodingSettings("wm", "tok", tmp_path / "x.json", temperatures=(-1.0,))
