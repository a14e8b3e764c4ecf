"""scripts/check_jacobi_vllm.py without a GPU: the demo part's code comparison and the projection's arithmetic
(its engines run on the GPU machine: BENCHMARKS.md, "Speculative decoding on vLLM")."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def check():
    return load_script("check_jacobi_vllm")


def test_demo_summary_compares_every_engine_with_sequential_codes(check):
    reference = {"draft_tokens": 0, "runs": [{"temperature": 0.9, "batched": [[[1, 2], [3, 4]]]}]}
    speculative = {"draft_tokens": 16, "runs": [{"temperature": 0.9, "passes_per_frame": 3.0,
                                                 "single": [[[1, 2], [3, 5]]], "batched": [[[1, 2], [3, 4]]]}]}
    [ref, row] = check.demo_summary([reference, speculative, {"draft_tokens": 32, "error": "out of memory"}])
    assert ref == {"temperature": 0.9, "draft_tokens": 0, "batched_agreement": 1.0}
    assert row == {"temperature": 0.9, "passes_per_frame": 3.0, "draft_tokens": 16, "single_agreement": 0.75,
                   "batched_agreement": 1.0}


@pytest.mark.parametrize("key", ["draft_tokens", "block_size"])  # block_size: a file written before the rename
def test_projection_is_passes_per_frame_times_step_time(check, tmp_path, key):
    passes = tmp_path / "decoding.json"
    passes.write_text(json.dumps({"layout": {"image_tokens": 576}, "modes": [
        {"available": True, "temperature": 0.9, "sampling": {"decoding": "sequential"}, "passes_per_frame": 576},
        {"available": True, "temperature": 0.9, "sampling": {"decoding": "speculative", key: 16},
         "passes_per_frame": 59.0},
        {"available": True, "temperature": 0.0, "sampling": {"decoding": "speculative", key: 16},
         "passes_per_frame": 20.0}]}))
    runs = [{"streams": 1, "step_s": 0.003}, {"streams": 64, "step_s": 0.01}, {"streams": 256, "step_s": 0.04}]
    terra = [{"draft_tokens": 0, "runs": runs}, {"draft_tokens": 16, "runs": runs}, {"draft_tokens": 32, "runs": runs}]
    report = check.projection(terra, passes)
    assert "projection" in report["label"]
    sequential, speculative = report["rows"]  # no passes measured with 32 draft tokens: not projected
    assert sequential["passes_per_frame"] == 576 and sequential["one_stream_s_per_frame"] == pytest.approx(1.728)
    assert speculative["passes_per_frame"] == 60  # the Transformers count at T=0.9, + vLLM's prompt pass
    assert speculative["one_stream_s_per_frame"] == pytest.approx(0.18)
    assert speculative["sessions_frames_per_s"] == pytest.approx(64 / 0.6, abs=0.01)
    rate = 256 / (60 * 0.04)
    assert speculative["actbench_h100_hours"] == pytest.approx(2286 * 44 / rate / 3600, abs=1e-3)


def test_bad_arguments_are_refused(check, tmp_path):
    with pytest.raises(SystemExit):
        check.parse_args(["--out", str(tmp_path / "x.json"), "--parts", "demo,other"])
    with pytest.raises(SystemExit):
        check.parse_args(["--out", str(tmp_path / "x.json"), "--terra-draft-tokens", "0,eight"])


def test_projection_alone_from_a_finished_json(check, tmp_path):
    passes = tmp_path / "decoding.json"
    passes.write_text(json.dumps({"layout": {"image_tokens": 576}, "modes": []}))
    out = tmp_path / "jacobi.json"
    # an engine's record as files written before the rename have it ("block")
    out.write_text(json.dumps({"terra": [{"block": 0, "runs": [{"streams": 1, "step_s": 0.0025}]}]}))
    report = check.main(["--parts", "", "--passes", str(passes), "--out", str(out)])
    assert report["projection"]["rows"] == [{"draft_tokens": 0, "passes_per_frame": 576,
                                             "one_stream_s_per_frame": 1.44}]
    assert json.loads(out.read_text())["projection"] == report["projection"]
