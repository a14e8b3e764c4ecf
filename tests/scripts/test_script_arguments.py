"""Every script of scripts/ that takes user input refuses a bad input in one line with exit 2 before any work: numbers
out of their range (NaN, infinities, negatives, sizes that would eat memory), paths that are not there, outputs that
cannot be written or would overwrite an input, torn input files; and leaves no output behind. Most cases call the
script's parser (or its ``main``) in this process; a few run scripts as programs, from another folder, to show the
exit code and the one line as a user sees them. The recipes' shell checks run last."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

from tests.conftest import SCRIPTS, load_script

DEMO_MODEL = "terra/assets/demo/world_model"  # the docs' path, relative to the checkout


@functools.cache
def script(name: str):
    return load_script(name)


def one_line(name: str, function: str, argv: list[str], capsys) -> str:
    """``function`` of script ``name`` on ``argv`` (its ``main`` as the script's ``__main__`` runs it: a bad input is
    exit 2); the one stderr line it ends with."""
    module = script(name)  # puts scripts/ on sys.path for bench.lib
    from bench.lib.cli import exit_2_on_input_error

    try:
        code = exit_2_on_input_error(name.split("/")[1])(getattr(module, function))(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    assert "Traceback" not in err[0]
    return err[0]


# (script, function, arguments, words of the one line); {tmp}: the test's folder, {file}: a file in it (an input),
# {missing}: a file in a folder that does not exist
CASES = [
    ("experiments/lane_keeping_alpasim", "parse_args", ["--scenarios", "0"], "--scenarios", "from 1 to 256"),
    ("experiments/lane_keeping_alpasim", "parse_args", ["--map-shift-m", "nan"], "--map-shift-m", "from -10 to 10"),
    ("experiments/lane_keeping_alpasim", "parse_args", ["--out", "{tmp}"], "--out", "is a folder"),
    ("experiments/lane_keeping_alpasim", "main", ["--policies", "no_such"], "unknown policy 'no_such'"),
    ("experiments/measure_decoding", "parse_args", ["--rollouts", "0"], "--rollouts", "from 1 to 4096"),
    ("experiments/measure_decoding", "parse_args", ["--temperatures", "0,nan"], "--temperatures", "from 0 to 10"),
    ("experiments/measure_decoding", "parse_args", ["--seed", "-1"], "--seed", "from 0 to 4611686018427387903"),
    ("experiments/measure_decoding", "parse_args", ["--device", "gpu"], "--device", "not a device"),
    ("experiments/measure_decoding", "parse_args", ["--world-model", "no/such/model"], "--world-model", "no folder"),
    ("experiments/measure_decoding", "parse_args", ["--out", "{missing}"], "--out", "does not exist"),
    ("experiments/measure_decoding", "parse_args", ["--out", "{tmp}"], "--out", "is a folder"),
    ("experiments/measure_decoding", "parse_args", ["--out", f"{DEMO_MODEL}/config.json"], "would overwrite the input"),
    ("experiments/train_learned_policy", "main", ["--train", "1000000"], "--train", "from 1 to 100000"),
    ("experiments/train_learned_policy", "main", ["--size", "8", "256"], "--size", "from 16 to 1024"),
    ("experiments/train_learned_policy", "main", ["--threads", "0"], "--threads", "from 1 to 1024"),
    ("experiments/train_learned_policy", "main", ["--out", "{missing}"], "--out", "does not exist"),
    ("experiments/route_reading", "main", ["--out", "{tmp}/run", "--frames", "4"], "--frames 4 is shorter than"),
    ("experiments/route_reading", "main", ["--out", "{tmp}/run", "--drives", "32"], "--drives 32 leaves no training"),
    ("experiments/route_reading", "main", ["--out", "{tmp}/run", "--input-noise", "0.9"], "--input-noise", "0.5"),
    ("experiments/route_reading", "main", ["--out", "{file}/run"], "output folder", "not a folder"),
    ("experiments/measure_fp8", "main", ["--out", "{tmp}/f.json", "--models", "demo,best"], "--models", "NAME="),
    ("experiments/measure_fp8", "main", ["--out", "{tmp}/f.json", "--models", "m=no/such"], "no/such is no folder"),
    ("experiments/measure_fp8", "main", ["--out", "{tmp}/f.json", "--settings", "bf16,fp4"], "--settings", "fp4"),
    ("experiments/measure_fp8", "main", ["--out", "{tmp}/f.json", "--models", "demo", "--context", "10", "--frames",
                                         "10"], "--context + --frames (20)", "window of 16"),
    ("experiments/measure_fp8", "main", ["--out", "{tmp}/f.json", "--gpu-memory-utilization", "0"], "more than 0"),
    ("bench/benchmark", "main", ["--context", "0"], "--context", "from 1 to 24"),
    ("bench/benchmark", "main", ["--part-timeout", "inf"], "--part-timeout", "more than 0"),
    ("bench/benchmark", "main", ["--model", "no/such"], "--model", "no folder with a config.json"),
    ("bench/benchmark", "main", ["--e2e-video", "../e2e.mp4"], "--e2e-video", "file name ending .mp4 or .gif"),
    ("bench/benchmark", "main", ["--out", "{file}"], "output folder", "not a folder"),
    ("bench/benchmark", "main", ["--table", "--out", "{tmp}/none"], "--table reads", "no folder"),
    ("bench/benchmark_alpasim", "parse_args", ["--sessions", "1,0"], "--sessions", "from 1 to 1024"),
    ("bench/benchmark_alpasim", "parse_args", ["--read-maps", "1,x"], "--read-maps"),
    ("bench/benchmark_alpasim", "parse_args", ["--out", "{missing}"], "--out", "does not exist"),
    ("bench/benchmark_attention", "parse_args", ["--rollouts", "100000"], "--rollouts", "from 1 to 1024"),
    ("bench/benchmark_attention", "parse_args", ["--page-sizes", "16,24"], "multiples of 16"),
    ("bench/benchmark_attention", "parse_args", ["--iters", "nan"], "--iters"),
    ("bench/benchmark_drive", "main", ["--model", "no/such"], "--model", "demo, terra, tiny or a model folder"),
    ("bench/benchmark_drive", "main", ["--policies", "lane_follower,ghost"], "--policies", "'ghost'"),
    ("bench/benchmark_drive", "main", ["--temperature", "-1"], "--temperature", "from 0 to 10"),
    ("bench/benchmark_fidelity", "main", ["--frames", "10"], "--frames", "from 23"),
    ("bench/benchmark_fidelity", "main", ["--out", "{missing}"], "--out", "does not exist"),
    ("bench/benchmark_guesses", "parse_args", ["--draft-tokens", "frame,0"], "--draft-tokens", "frame or"),
    ("bench/benchmark_guesses", "parse_args", ["--oracle-shares", "1.5"], "--oracle-shares", "from 0 to 1"),
    ("bench/benchmark_guesses", "parse_args", ["--manoeuvres", "fly"], "--manoeuvres", "'fly'"),
    ("bench/benchmark_guesses", "parse_args", ["--tokenizer", "no/such"], "--tokenizer", "no folder"),
    ("bench/benchmark_guesses", "parse_args", ["--out", "terra/assets/demo/tokenizer/config.json"],
     "would overwrite the input"),
    ("bench/benchmark_gym_ppo", "main", ["--minutes", "0"], "--minutes", "more than 0"),
    ("bench/benchmark_gym_ppo", "main", ["--image-size", "8", "8"], "--image-size", "from 36"),
    ("bench/benchmark_memory", "parse_args", ["--frames", "30"], "--frames"),
    ("bench/benchmark_memory", "parse_args", ["--iterations", "4", "--warmup", "5"], "must exceed --warmup"),
    ("bench/benchmark_memory", "parse_args", ["--device", "tpu"], "--device", "not a device"),
    ("bench/benchmark_memory_table", "main", ["--device", "cpu", "--caps", "8GiB"], "--caps", "'8GiB'"),
    ("bench/benchmark_memory_table", "main", ["--device", "cpu", "--timeout-s", "0"], "--timeout-s"),
    ("bench/benchmark_memory_table", "main", ["--device", "cpu", "--out", "{missing}"], "--out", "does not exist"),
    ("bench/benchmark_refiner", "main", ["--frames", "25,0"], "--frames", "from 1 to 1000"),
    ("bench/benchmark_refiner", "main", ["--device", "cpu", "--out", "{tmp}"], "--out", "is a folder"),
    ("bench/benchmark_rollout", "parse_args", ["--samples", "0"], "--samples", "from 1"),
    ("bench/benchmark_rollout", "parse_args", ["--max-concurrent", "0"], "--max-concurrent", "auto or"),
    ("bench/benchmark_rollout", "main", ["--gpus", "2"], "--gpus takes 0 or 1"),
    ("bench/benchmark_rollout", "main", ["--out", "{file}"], "output folder", "not a folder"),
    ("bench/benchmark_scoring", "parse_args", ["--height", "287"], "must be even"),
    ("bench/benchmark_scoring", "parse_args", ["--num-workers", "-1"], "--num-workers", "from 0 to 256"),
    ("bench/benchmark_scoring", "parse_args", ["--workdir", "{file}"], "output folder", "not a folder"),
    ("bench/benchmark_speculative", "parse_args", ["--streams", "1,0"], "--streams"),
    ("bench/benchmark_speculative", "parse_args", ["--num-context", "0"], "--num-context"),
    ("bench/benchmark_study_plan", "main", ["--steps", "0"], "--steps", "from 1 to 10000"),
    ("bench/benchmark_tokenizer", "main", ["--models", "vq99"], "--models", "'vq99'"),
    ("bench/benchmark_tokenizer", "main", ["--json", "{missing}"], "--json", "does not exist"),
    ("bench/benchmark_training", "parse_args", ["--out", "{missing}"], "--out", "does not exist"),
    ("bench/benchmark_training", "parse_args", ["--out", "{tmp}/t.jsonl", "--memory-cap-gib", "0"], "--memory-cap"),
    ("bench/benchmark_training", "parse_args", ["--out", "{tmp}/t.jsonl", "--activation-checkpointing", "99"],
     "--activation-checkpointing", "from 1 to 22"),
    ("checks/check_jacobi_vllm", "parse_args", ["--out", "{tmp}/j.json", "--demo-draft-tokens", "32x0"],
     "--demo-draft-tokens", "1-64 passes"),
    ("checks/check_jacobi_vllm", "parse_args", ["--out", "{tmp}/j.json", "--e2e-engines", "plain:0"], "--e2e-engines"),
    ("checks/check_jacobi_vllm", "parse_args", ["--out", "{missing}"], "--out", "does not exist"),
    ("checks/check_jacobi_vllm", "main", ["--out", "{file}", "--parts", ""], "{file}", "malformed JSON"),
    ("checks/check_vllm_gpu", "main", ["--out", "{tmp}/g.json", "--context", "9"], "--context", "from 1 to 5"),
    ("checks/check_vllm_gpu", "main", ["--out", "{tmp}/g.json", "--gpu-memory-utilization", "1.5"], "more than 0"),
    ("tools/compile_alpasim_proto", "main", ["--out", "{tmp}/none"], "--out", "does not exist"),
    ("bench/benchmark_sessions", "parse_args", ["--frames", "0"], "--frames", "from 1 to 10000"),
    ("bench/benchmark_sessions", "parse_args", ["--max-num-seqs", "nan"], "--max-num-seqs"),
    ("bench/benchmark_sessions", "parse_args", ["--out", "{missing}"], "--out", "does not exist"),
]
DEFAULTS = {"experiments/measure_decoding": ["--world-model", DEMO_MODEL, "--tokenizer", "terra/assets/demo/tokenizer",
                                             "--out", "{tmp}/decoding.json"]}


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0].split('/')[1]}-{' '.join(c[2])[:40]}" for c in CASES])
def test_a_bad_input_is_one_line_and_exit_2_and_leaves_nothing(case, tmp_path, capsys):
    name, function, argv, *words = case
    (tmp_path / "input.json").write_text('{"torn": [1, 2')  # an input file, torn
    fill = {"{tmp}": str(tmp_path), "{file}": str(tmp_path / "input.json"),
            "{missing}": str(tmp_path / "missing" / "out.json")}

    def filled(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    before = sorted(tmp_path.rglob("*"))
    line = one_line(name, function, [filled(a) for a in DEFAULTS.get(name, []) + argv], capsys)
    assert line.startswith(f"{name.split('/')[1]}: error: ") and all(filled(w) in line for w in words), line
    assert sorted(tmp_path.rglob("*")) == before  # no output, no folder made


def test_every_script_parses_its_arguments_through_the_bounded_parser():
    """No script builds argparse's own parser or reads a bare number (scripts/bench/lib/cli.py's ``Parser`` and its
    ranged types)."""
    own = [str(path.relative_to(SCRIPTS)) for path in SCRIPTS.rglob("*.py") if path.name != "cli.py"
           and any(words in path.read_text() for words in ("argparse.ArgumentParser(", "type=int,", "type=float,"))]
    assert own == []


def test_a_bad_hydra_override_is_one_line():
    script("bench/benchmark_alpasim")  # puts scripts/ on sys.path for bench.lib
    from bench.lib.cli import compose_config

    from terra.core.errors import TerraInputError

    with pytest.raises(TerraInputError) as caught:
        compose_config("alpasim", ["alpasim.no_such_setting=1"])
    assert "\n" not in str(caught.value) and "no_such_setting" in str(caught.value)


@pytest.mark.parametrize("passes, words", [('{"layout": {"image_tokens": 5', "malformed JSON"),
                                           ('{"modes": []}', "not measure_decoding.py's report")])
def test_a_torn_passes_file_is_one_line_and_the_report_is_kept(tmp_path, capsys, passes, words):
    (tmp_path / "passes.json").write_text(passes)
    out = tmp_path / "jacobi.json"
    out.write_text(report := json.dumps({"terra": [{"draft_tokens": 0, "runs": [{"streams": 1, "step_s": 0.01}]}]}))
    line = one_line("checks/check_jacobi_vllm", "main", ["--out", str(out), "--parts", "", "--passes",
                                                         str(tmp_path / "passes.json")], capsys)
    assert words in line and "passes.json" in line and out.read_text() == report


@pytest.mark.parametrize("script_name, args, words", [
    ("bench/benchmark_renderer.py", ["--frames", "-1"], "argument --frames: takes a whole number from 1"),
    ("bench/benchmark_vehicle.py", ["--repeats", "nan"], "argument --repeats: takes a whole number"),
    ("bench/benchmark_memory_table.py", ["--device", "cpu", "--workflows", "vllm,train"], "'train'"),
    ("tools/compile_alpasim_proto.py", ["--imports-out", "no/such/folder/imports.pb"], "does not exist"),
    ("bench/benchmark_sessions.py", ["--sessions", "1000000"], "argument --sessions: a comma list whose every item "
                                                               "takes a whole number from 1 to 1024"),
])
def test_a_script_run_as_a_program_prints_one_line_and_exits_2(tmp_path, script_name, args, words):
    done = subprocess.run([sys.executable, str(SCRIPTS / script_name), *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert words in lines[0] and not any(tmp_path.iterdir())


@pytest.mark.parametrize("recipe, args, env, words", [
    ("train_demo.sh", ["data", "more"], {}, "unexpected argument 'more'"),
    ("train_demo.sh", ["data"], {"MINUTES": "-1"}, "MINUTES=-1 is not a number of minutes"),
    ("finetune_demo.sh", ["evaluate"], {"JOBS": "x"}, "JOBS=x is not a whole number of at least 1"),
    ("train_terra_layout.sh", ["data"], {"CLIPS": "1e3"}, "CLIPS=1e3 is not a whole number"),
    ("train_terra_layout.sh", ["tokenizer"], {"TOK_STEPS": "0"}, "TOK_STEPS=0 is not a whole number"),
])
def test_a_recipe_refuses_a_bad_argument_before_any_stage(tmp_path, recipe, args, env, words):
    done = subprocess.run(["bash", str(SCRIPTS / "recipes" / recipe), *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "RUN": str(tmp_path / "run"), **env})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and words in lines[0], done.stderr
    assert not (tmp_path / "run").exists()
