"""Smoke tests of scripts/bench/benchmark.py (Transformers part on a tiny model, on the CPU) and
scripts/bench/benchmark_memory.py."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import pytest

from terra.core.errors import TerraInputError
from terra.contract.layout import TokenLayout
from terra.generation.rollout import RolloutState
from terra.generation.vllm_backend import FrameStat, VLLMBackend
from tests.conftest import load_script, tiny_config


SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
# One thread per process: on a small shared CI machine torch's spinning worker threads make tiny models crawl.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / "bench" / f"{name}.py"), *args], capture_output=True,
                          text=True, timeout=180, env=ENV)


@pytest.fixture(scope="module")
def benchmark():
    """scripts/bench/benchmark.py, loaded as a module; loading it puts scripts/ on sys.path for bench.lib."""
    return load_script("bench/benchmark")


@pytest.fixture(scope="module")
def bench(benchmark):
    """The package scripts/bench/lib/ that holds the benchmark's code."""
    return importlib.import_module("bench.lib")


@pytest.mark.slow
def test_hf_part_runs_in_a_subprocess_and_reports(tmp_path):
    """The whole CLI path: the parent writes the configs, a worker subprocess times 2 frames, the table prints."""
    out = tmp_path / "bench"
    proc = run_script("benchmark", "--tiny", "--device", "cpu", "--parts", "hf", "--hf-frames", "2", "--context", "2",
                      "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((out / "hf.json").read_text())
    single = record["single"]
    assert single["rollouts"] == 1 and single["frames_per_rollout"] == 2
    assert single["s_per_frame"] > 0 and single["first_frame_s"] <= single["wall_s"]
    assert single["frames_per_s"] * single["wall_s"] == pytest.approx(2, rel=1e-6)
    assert single["s_per_frame"] * 2 == pytest.approx(single["wall_s"], rel=0.05)
    assert record["settings"]["tokens_per_frame"] == 64 and record["settings"]["sampling"]["temperature"] == 1.0
    assert record["env"]["torch"] and record["env"]["device"] == "cpu"
    config = json.loads((out / "models" / "terra" / "config.json").read_text())
    plain = json.loads((out / "models" / "plain_llama" / "config.json").read_text())
    assert config["model_type"] == "llama_action" and plain["model_type"] == "llama"
    assert plain["architectures"] == ["LlamaForCausalLM"] and "num_image_patches" not in plain
    assert {k: plain[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")} == {
        k: config[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")
    }
    assert "Transformers, KV-cached frame loop" in proc.stdout
    assert json.loads((out / "summary.json").read_text())["failures"] == {}


def test_a_part_over_its_time_limit_is_killed_and_reported(tmp_path):
    proc = run_script("benchmark", "--tiny", "--device", "cpu", "--parts", "hf", "--part-timeout", "0.5",
                      "--out", str(tmp_path))
    assert proc.returncode == 1
    assert "hf       FAILED: timed out after 0.5 s" in proc.stdout
    assert not (tmp_path / "hf.json").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["failures"] == {"hf": "timed out after 0.5 s"}


def test_e2e_measures_tokenizer_and_one_rollout(bench, tmp_path, single_thread):
    args = bench.parse_args(["--tiny", "--device", "cpu", "--context", "2", "--batched-frames", "2",
                             "--out", str(tmp_path)])
    bench.write_model_configs(args)
    layout = bench.read_layout(args)
    backend = bench.build_backend(bench.PARTS["hf"], args)
    result = bench.measure_e2e(backend, layout, args)
    e2e, tok = result["e2e"], result["tokenizer"]
    assert e2e["frames"] == 4 and tok["image_size"] == [64, 64] and tok["decode_frames_per_s"] > 0
    assert sum(e2e[k] for k in ("encode_s", "generate_s", "decode_s", "write_s")) <= e2e["total_s"] + 1e-6
    assert len(iio.imread(tmp_path / "e2e_rollout.mp4")) == 4
    record = {"description": "e2e", "env": {"gpu": None, "cpu": "x86", "torch": "2", "vllm": None, "transformers": "5",
                                           "date_utc": "now"}, "settings": {"backend": "hf"}, **result}
    text = bench.table({"e2e": record}, {})
    assert "one 4-frame rollout end to end (hf)" in text and "+ write MP4 " in text


def test_bad_arguments_give_one_line_and_exit_2(benchmark, capsys):
    for args in (["--parts", "hf,warp"], ["--batch-sizes", "8,x"]):  # argparse's own: exit 2 from the parser
        with pytest.raises(SystemExit) as exit_:
            benchmark.main(args)
        assert exit_.value.code == 2
    assert benchmark.main(["--engine-arg", "async_scheduling"]) == 2
    assert benchmark.main(["--engine-arg", "gpu_memory_utilization=0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and "warp" in err[0] and "--batch-sizes" in err[1] and "KEY=VALUE" in err[2]
    assert "use --gpu-memory-utilization" in err[3]
    assert "Traceback" not in "".join(err)


def test_engine_args_are_parsed_as_yaml(bench):
    args = bench.parse_args(["--engine-arg", "async_scheduling=true", "--engine-arg", "block_size=32",
                             "--device", "cpu"])
    assert args.engine_kwargs == {"async_scheduling": True, "block_size": 32}
    assert args.max_num_seqs == 64 and args.dtype == "float32"


def test_engine_args_override_a_parts_own_settings(bench):
    """``--engine-arg kv_cache_dtype=fp8`` runs a bf16-KV part (boundary) on FP8, as ACT-Bench-shaped runs do;
    the flags' values stay."""
    from bench.lib.backends import engine_settings
    from bench.lib.parts import PARTS

    args = bench.parse_args(["--engine-arg", "kv_cache_dtype=fp8", "--engine-arg", "max_num_batched_tokens=8192",
                             "--max-num-seqs", "256", "--device", "cpu"])
    engine = engine_settings(PARTS["boundary"], args)
    assert engine["kv_cache_dtype"] == "fp8" and engine["max_num_batched_tokens"] == 8192
    assert engine["max_num_seqs"] == 256 and engine["dtype"] == "float32" and engine["enforce_eager"] is False
    assert engine_settings(PARTS["boundary"], bench.parse_args(["--device", "cpu"]))["kv_cache_dtype"] == "auto"


def test_prefix_summary_ignores_window_starts(bench):
    stats = [FrameStat(0, 0, 1746, 0, True), FrameStat(0, 1, 2328, 2320, False), FrameStat(0, 2, 2910, 2896, False)]
    summary = bench.prefix_summary(stats, block_size=16, action_tokens=6)
    assert summary["later_requests"] == 2 and summary["computed_tokens_max"] == 14
    assert summary["target_computed_max"] == 22
    assert summary["hit_rate_mean"] == pytest.approx((2320 / 2328 + 2896 / 2910) / 2)


def test_plain_baseline_is_the_vllm_step_loop_with_prompts_minus_action_items(bench):
    """The baseline overrides only VLLMBackend's prompt hooks (neither uses the engine, so none is started)."""
    plain = importlib.import_module("bench.lib.plain_llama").PlainLlamaBackend
    layout = TokenLayout.from_config(tiny_config())
    [request] = importlib.import_module("bench.lib.rollouts").make_requests(layout, 1, 2, 1, seed=0)
    state = RolloutState(request, layout)
    terra = VLLMBackend.frame_prompt(None, state)
    assert terra["multi_modal_data"]["actions"].shape == (2, 6, 3)
    assert plain.frame_prompt(None, state) == {"prompt_token_ids": terra["prompt_token_ids"]}
    assert plain.prompt_limits(None) == {} and plain.generate is VLLMBackend.generate


def test_derived_ratios_and_table(bench):
    env = {"gpu": "GPU X", "cpu": "x86", "torch": "2", "vllm": "0.26.0", "transformers": "5", "date_utc": "today"}

    def row(b, s, fps):
        return {"rollouts": b, "frames_per_rollout": 22, "s_per_frame": s, "frames_per_s": fps}

    records = {
        "hf": {"description": "hf", "env": env, "single": row(1, 50.0, 0.02)},
        "vllm": {"description": "terra", "env": env,
                 "single": {**row(1, 1.0, 1.0), "wall_s": 8.0, "engine_steps": 4000, "engine_step_s": 6.0,
                            "add_request_s": 0.4}},
        "plain": {"description": "plain", "env": env, "single": row(1, 0.8, 1.25), "batched": [row(64, 3.0, 20.0)]},
        "batched": {"description": "bf16", "env": env, "batched": [row(8, 1.0, 8.0), row(64, 3.2, 16.0)],
                    "greedy_tokens": [1, 2, 3, 4]},
        "fp8": {"description": "fp8", "env": env, "batched": [row(64, 2.5, 20.0)], "greedy_tokens": [1, 2, 9, 4]},
    }
    d = bench.derived(records)
    assert d["vllm_speedup_vs_hf"] == pytest.approx(50.0)
    assert d["terra_overhead_single_pct"] == pytest.approx(25.0)
    assert d["terra_overhead_batched_pct"] == {64: pytest.approx(25.0)}
    assert d["fp8_speedup"] == {64: pytest.approx(1.25)}
    assert d["fp8_greedy"] == {"tokens": 4, "agreement": 0.75, "first_mismatch": 2, "distinct_tokens_bf16": 4}
    text = bench.table(records, {"eager": "exit 1"})
    assert "GPU X" in text and "eager    FAILED: exit 1" in text and text.count("\nbatched ") == 2
    assert ("time vllm B=1: 4000 engine steps, 1.50 ms/step, 75.0% in step, 5.0% in add_request, 20.0% in our loop"
            in text)
    met = {name: t["met"] for name, t in d["targets"].items()}
    assert met == {"terra single stream s/frame <= 0.8": False, "vLLM speed-up over Transformers >= 40": True,
                   "64 rollouts x 22 frames, frames/s >= 18": False,
                   "action/position overhead vs plain Llama % <= 3": False}


def test_busy_time_counts_overlapping_kernels_once(bench):
    assert bench.busy_time([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]) == (4.0, 6.0)
    assert bench.busy_time([]) == (0.0, 0.0)


def test_profile_record_in_table(bench):
    env = {"gpu": "GPU X", "cpu": "x86", "torch": "2", "vllm": "0.26.0", "transformers": "5", "date_utc": "today"}
    profile = {"ms_per_token_unprofiled": 2.3, "gpu_busy_ms_per_token": 1.6, "gpu_span_ms_per_token": 2.2,
               "gpu_kernels_per_token": 250, "cpu_ms_per_token": {"scheduler.schedule": 0.1, "rest": 1.9},
               "top_kernels": [{"name": "gemv", "ms_per_token": 0.4, "calls_per_token": 1}]}
    text = bench.table({"profile": {"description": "p", "env": env, "profile": profile}}, {})
    assert "2.30 ms wall, GPU busy 1.60 ms of a 2.20 ms span, 250 kernels" in text
    assert "CPU: scheduler.schedule 0.100 ms, rest 1.900 ms" in text and "GPU 0.400 ms (1x) gemv" in text


def test_boundary_record_in_table(bench):
    env = {"gpu": "GPU X", "cpu": "x86", "torch": "2", "vllm": "0.26.0", "transformers": "5", "date_utc": "today"}
    split = {"rollouts": 256, "context": 3, "frames_per_rollout": 22, "frames_per_s": 21.5, "gpu_busy_pct": 78.0,
             "share_pct": {"ours: frame_prompt (request building)": 4.25, "vLLM: rest of engine.step": 60.0}}
    text = bench.table({"boundary": {"description": "b", "env": env, "boundary": split}}, {})
    assert "boundary (engine core in-process): 256 rollouts x 22 frames after 3, 21.50 frames/s, GPU busy 78 %" in text
    assert "ours: frame_prompt (request building) 4.2 %, vLLM: rest of engine.step 60.0 %" in text


@pytest.mark.slow
def test_rollout_benchmark_runs_a_jsonl_and_reports_span(tmp_path):
    """scripts/bench/benchmark_rollout.py end to end on the CPU: samples written, one rollout run, rates from the
    manifest."""
    out = tmp_path / "br"
    proc = run_script("benchmark_rollout", "--demo", "--backend", "hf", "--gpus", "0", "--samples", "2",
                      "--frames", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    (run,) = summary["runs"]
    assert (run["num_gpus"], run["ok"], run["failed"], run["gpus_used"]) == (0, 2, 0, ["in-process"])
    assert 0 < run["span_s"] < run["wall_s"] and run["frames_per_s"] == pytest.approx(2 / run["span_s"])
    assert len(list((out / "run_gpus0").glob("*.gif"))) == 2 and "speed-up" in proc.stdout
    decoding = run["decoding"]  # the manifest summary's: two rollouts in flight, auto is speculative on Transformers
    assert decoding["decoding"] == "speculative" and decoding["frames"] == 2 and decoding["passes_per_frame"] < 144


def test_rollout_benchmark_projects_by_waves():
    """Four rollouts in flight, then a second wave of two: the last wave of a longer run is timed between them."""
    projection = load_script("bench/benchmark_rollout").projection_by_waves

    def record(admitted: float, out: float, written: float) -> dict:
        return {"generated_at": out, "generate_s": out - admitted, "finished_at": written}

    first = [record(0.1 * i, 10.0 + 0.5 * i / 3, 11.0) for i in range(4)]  # out 10.0-10.5
    second = [record(10.0, 15.0, 15.5), record(10.5, 16.5, 17.5)]  # admitted as the first left
    waves = projection(first + second, 30.0, 11)  # 11 samples: two waves of 4, then one of 3
    assert waves == pytest.approx({"in_flight": 4, "first_wave_s": 10.5, "second_wave": 2, "second_wave_s": 6.5,
                                   "projected_wall_s": 30.0 + 2 * 10.5 + (6.5 + 4.0 * (3 - 2) / (4 - 2)) + 1.0})
    assert projection(first + second, 30.0, 8)["projected_wall_s"] == pytest.approx(30.0 + 21.0 + 1.0)  # no last wave
    assert projection(first, 30.0, 11) is None  # one wave: nothing to time a smaller one by
    assert projection(first[:2] + [record(10.0, 20.0, 21.0)] * 2, 30.0, 11) is None  # second wave not smaller


def test_rollout_benchmark_bad_arguments(capsys):
    rollout_bench = load_script("bench/benchmark_rollout")
    with pytest.raises(SystemExit) as exit_:  # a flag's value: argparse's, one line and exit 2
        rollout_bench.main(["--gpus", "one"])
    assert exit_.value.code == 2
    assert rollout_bench.main(["--demo", "--model", "terra/assets/demo/world_model"]) == 2
    assert rollout_bench.main(["--backend", "hf", "--requests", "streaming"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "--gpus" in err[0] and "--demo" in err[1] and "--backend vllm" in err[2]
    assert rollout_bench.parse_args(["--requests", "per_frame"]).requests == "per_frame"


def test_benchmark_picks_the_request_path(bench):
    assert bench.parse_args(["--device", "cpu"]).requests == "per_frame"
    assert bench.parse_args(["--device", "cpu", "--requests", "streaming", "--parts", "vllm"]).requests == "streaming"
    with pytest.raises(TerraInputError, match="profile part"):
        bench.parse_args(["--device", "cpu", "--requests", "streaming", "--parts", "vllm,profile"])
    with pytest.raises(TerraInputError, match="the profile and boundary part"):
        bench.parse_args(["--device", "cpu", "--requests", "streaming", "--parts", "profile,boundary"])


@pytest.mark.slow
def test_memory_script_flat_over_sequential_calls(tmp_path):
    out = tmp_path / "memory.json"
    proc = run_script("benchmark_memory", "--iterations", "6", "--warmup", "2", "--frames", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "objects alive after their call: 0" in proc.stdout
    report = json.loads(out.read_text())
    assert report["leaked_objects"] == 0 and len(report["rss_mb"]) == 6 and report["ok"]


def test_memory_script_catches_pipelines_kept_alive(monkeypatch, single_thread, capsys):
    memory = load_script("bench/benchmark_memory")
    kept, load = [], memory.WorldModelPipeline.from_pretrained

    def leaky(*args, **kwargs):
        kept.append(load(*args, **kwargs))
        return kept[-1]

    monkeypatch.setattr(memory.WorldModelPipeline, "from_pretrained", leaky)
    assert memory.main(["--iterations", "4", "--warmup", "1", "--frames", "1"]) == 1
    assert "objects alive after their call: 12; LEAK" in capsys.readouterr().out


def test_memory_analysis_flags_growth():
    memory = load_script("bench/benchmark_memory")
    leaking = [500.0 + 2.0 * i for i in range(40)]
    verdict = memory.analyse(leaking, warmup=5, max_growth_mb=20.0)
    assert verdict["slope_mb_per_call"] == pytest.approx(2.0) and verdict["growth_mb"] == pytest.approx(50.0)
    assert not verdict["ok"]
    assert memory.analyse([500.0] * 5 + [510.0] * 35, warmup=5, max_growth_mb=20.0)["ok"]


def test_attention_benchmark_spreads_windows_and_rejects_bad_settings(capsys):
    attention = load_script("bench/benchmark_attention")
    lengths = attention.cached_lengths(5)
    assert lengths.tolist() == [1746, 4947, 8148, 11348, 14549]  # 3 frames of 582 .. a full 25-frame window
    for args in (["--page-sizes", "16,24"], ["--kv-dtypes", "fp16"], ["--splits", "a"]):
        with pytest.raises(SystemExit) as exit_:
            attention.main(args)
        assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "multiples of 16" in err[0] and "fp8" in err[1]
    assert "argument --splits: a comma list whose every item takes a whole number" in err[2]
    assert "Traceback" not in "".join(err)


def test_speculative_benchmark_counts_passes_and_compares_codes(tmp_path, single_thread):
    """scripts/bench/benchmark_speculative.py on the demo model: two sampled frames sequential and speculative (the
    first's passes run into the second: the default lookahead), then two rollouts at once both ways; the JSON has the
    passes, the profile and the comparison of the codes."""
    bench = load_script("bench/benchmark_speculative")
    out = tmp_path / "speculative.json"
    result = bench.main(["--rollouts", "1", "--frames", "2", "--temperatures", "0.9", "--draft-tokens", "144",
                         "--sequential-rollouts", "1", "--streams", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    sequential, speculative, *streams = result["records"]
    assert sequential["decoding"] == "sequential" and sequential["passes_per_frame"] == 144
    assert speculative["codes_equal_sequential"] and speculative["passes_per_frame"] < 144
    assert speculative["fewer_passes"] == pytest.approx(144 / speculative["passes_per_frame"], rel=1e-2)
    assert sum(row["passes"] for row in speculative["profile"]) == speculative["forward_passes"]
    assert [(r["streams"], r["decoding"]) for r in streams] == [(2, "sequential"), (2, "speculative")]
    assert all(r["frames_per_s"] > 0 for r in streams)
    with pytest.raises(SystemExit):
        bench.parse_args(["--draft-tokens", "0"])
