"""terra-evaluate keeps each phase as it finishes (terra/evaluation/phases.py): an interrupted run keeps its finished
phases and says how to resume, the rerun measures only what is left and reports the same numbers, and a phase whose
inputs changed is measured again, with a line saying why. A tiny world model and tokenizer made here keep it fast."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from terra.apps.evaluate import resume_command
from terra.apps.runner import CONF_DIR
from terra.config.assets import register_resolvers
from terra.evaluation.run import MEASURES, format_table, run
from terra.evaluation.settings import evaluate_spec
from terra.pipeline import WorldModelPipeline
from tests.conftest import save_tiny_pair, tiny_model

register_resolvers()  # conf/ uses ${terra_asset:...}

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread

ROOT = Path(__file__).resolve().parents[2]
TIMINGS = ("generate_s", "s_per_frame")  # of each measurement: how long it took, not what it measured


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """A tiny world model (a window of 6 frames) and the random LFQ tokenizer whose 8x8 codes fit it, saved."""
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def arguments(pair: Path, out: Path, *overrides: str) -> list[str]:
    """terra-evaluate's command line for the tiny pair: two clips, one adherence case, two frames each."""
    return [f"model.world_model={pair / 'world_model'}", f"tokenizer.path={pair / 'tokenizer'}", "quality.num_clips=2",
            "horizon=2", "adherence.num_cases=1", "adherence.pairs=[[curve_left,curve_right]]", "device=cpu",
            "progress=false", "num_threads=1", f"out_dir={out}", *overrides]


def spec(pair: Path, out: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return evaluate_spec(compose("evaluate", overrides=arguments(pair, out, *overrides)))


def numbers(report: dict) -> dict:
    """A report without how long it took, which phases an earlier run measured and where it lies."""
    kept = {k: v for k, v in report.items() if k not in ("timings", "reused", "path")}
    for key in ("quality", "adherence"):
        kept[key] = {k: v for k, v in kept[key].items() if k not in TIMINGS}
    return kept


def test_an_interrupted_run_keeps_its_first_phase_and_the_rerun_measures_the_rest(pair, tmp_path, monkeypatch,
                                                                                    capsys):
    whole = run(spec(pair, tmp_path / "whole"))  # uninterrupted
    out = tmp_path / "cut"
    adherence = MEASURES["adherence"]

    def ctrl_c(*args):
        raise KeyboardInterrupt

    monkeypatch.setitem(MEASURES, "adherence", ctrl_c)
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        run(spec(pair, out), resume_command="terra-evaluate out_dir=OUT")
    assert sorted(os.listdir(out)) == [".terra-output.json", "quality.json"]  # no report, lock or temporary file
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"terra-evaluate: interrupted during manoeuvre adherence; kept frame quality (quality.json) in {out}; "
        "resume with: terra-evaluate out_dir=OUT")
    kept = json.loads((out / "quality.json").read_text())
    assert kept["complete"] and kept["inputs"]["quality.num_clips"] == 2 and kept["inputs"]["seed"] == 0

    def measured_again(*args):
        raise AssertionError("the kept phase was measured again")

    monkeypatch.setitem(MEASURES, "quality", measured_again)
    monkeypatch.setitem(MEASURES, "adherence", adherence)
    resumed = run(spec(pair, out))
    assert "terra-evaluate: phase 1 of 2, frame quality: kept from an earlier run into this folder (quality.json), " \
           "not measured again" in capsys.readouterr().err
    assert (resumed["reused"], whole["reused"]) == (["quality"], [])
    assert format_table(resumed).endswith(" s; frame quality kept from an earlier run)")
    assert resumed["quality"] == kept["result"]  # the kept results as they are, their timings included
    saved, uninterrupted = (json.loads((folder / "report.json").read_text()) for folder in (out, tmp_path / "whole"))
    assert numbers(saved) == numbers(resumed) == numbers(uninterrupted) == numbers(whole)
    assert saved["quality"]["psnr"]["mean"] == whole["quality"]["psnr"]["mean"]  # numbers, not empty blocks
    assert len(saved["adherence"]["pairs"]["curve_left/curve_right"]["cases"]) == 1


def test_a_rerun_measures_again_the_phases_whose_inputs_changed(pair, tmp_path, monkeypatch, capsys):
    pair = Path(shutil.copytree(pair, tmp_path / "pair"))  # its weights change below
    out = tmp_path / "eval"
    first = run(spec(pair, out))
    measured = []
    for key, measure in list(MEASURES.items()):
        monkeypatch.setitem(MEASURES, key, lambda *args, key=key, measure=measure: measured.append(key)
                            or measure(*args))

    with monkeypatch.context() as patch:  # a target is read by the report alone: no phase measured, no model loaded
        patch.setattr(WorldModelPipeline, "from_run", None)
        capsys.readouterr()
        report = run(spec(pair, out, "targets.mean_psnr_db=99"))
    assert measured == [] and report["reused"] == ["quality", "adherence"]
    assert report["targets"]["mean_psnr_db"]["target"] == 99 and report["timings"]["load_s"] == 0
    assert (report["quality"], report["adherence"]) == (first["quality"], first["adherence"])
    assert (report["backend"], report["device"], report["image_size"]) == ("HFBackend", "cpu", [64, 64])
    assert "measuring it again" not in capsys.readouterr().err

    report = run(spec(pair, out, "quality.scene_seed=10000100"))  # read by frame quality alone
    assert measured == ["quality"] and report["reused"] == ["adherence"]
    assert report["quality"]["scene_seeds"][0] == 10_000_100 != first["quality"]["scene_seeds"][0]
    assert ("terra-evaluate: frame quality: measuring it again: quality.json was measured with "
            "quality.scene_seed=10000000, now 10000100\n") in capsys.readouterr().err

    tiny_model(seed=1).save_pretrained(pair / "world_model")  # other weights: read by both phases
    report = run(spec(pair, out, "quality.scene_seed=10000100", "seed=3"))
    assert measured == ["quality", "quality", "adherence"] and report["reused"] == []
    err = capsys.readouterr().err
    for phase, name in (("frame quality", "quality"), ("manoeuvre adherence", "adherence")):
        assert (f"terra-evaluate: {phase}: measuring it again: {name}.json was measured with other files of the "
                "world model (config or weights) (and 1 more input)\n") in err


def test_a_kept_phase_without_the_fields_the_report_reads_is_measured_again(pair, tmp_path, capsys):
    """A kept phase of the same inputs whose ``result`` and ``pipeline`` are ``{}``: one line and the phase measured
    again, not an internal error."""
    out = tmp_path / "eval"
    first = run(spec(pair, out))
    record = json.loads((out / "quality.json").read_text())
    (out / "quality.json").write_text(json.dumps({**record, "result": {}, "pipeline": {}}))
    capsys.readouterr()
    report = run(spec(pair, out))
    assert ("terra-evaluate: frame quality: measuring it again: quality.json lacks what this version reads of it "
            "(KeyError: 'backend')\n") in capsys.readouterr().err
    assert report["reused"] == ["adherence"] and numbers(report) == numbers(first)


def test_sigterm_keeps_the_finished_phase_and_the_printed_command_resumes(pair, tmp_path):
    """The app itself: SIGTERM while the second phase runs (a stand-in that tells it started, then waits) keeps the
    first phase and prints the command that resumes; that command, run as printed, measures only the second."""
    out, started = tmp_path / "eval", tmp_path / "second phase started"
    given = arguments(pair, out, "quality.scene_seed=10000003")
    code = ("import pathlib, sys, threading, terra.apps.evaluate, terra.evaluation.run as run\n"
            f"run.MEASURES['adherence'] = lambda *args: pathlib.Path({str(started)!r}).touch() or "
            "threading.Event().wait()\n"
            f"sys.argv = ['terra-evaluate', *{given!r}]\n"
            "terra.apps.evaluate.main()\n")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not started.exists():
        assert time.monotonic() < deadline, "the second phase did not start within 5 min"
        try:
            process.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"ended before the second phase: {process.communicate()}")
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert sorted(os.listdir(out)) == [".terra-output.json", "quality.json"]
    command = shlex.join(["terra-evaluate", *(a for a in given if not a.startswith("out_dir=")), f"out_dir={out}"])
    assert err.splitlines()[-2:] == [
        f"terra-evaluate: interrupted during manoeuvre adherence; kept frame quality (quality.json) in {out}; "
        f"resume with: {command}", "terra-evaluate: interrupted by SIGTERM"]

    program, *rest = shlex.split(re.search(r"resume with: (.*)", err)[1])
    resumed = subprocess.run([str(Path(sys.executable).with_name(program)), *rest], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "frame quality: kept from an earlier run into this folder (quality.json)" in resumed.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["reused"] == ["quality"] and report["adherence"]["pairs"]["curve_left/curve_right"]["num_cases"] == 1
    assert report["quality"] == json.loads((out / "quality.json").read_text())["result"]


@pytest.mark.parametrize("folder", ["/data/eval run", "/data/it's", "/data/a,b=[c]", "/data/ends\\", "/data/plain-1.0"])
def test_the_resume_command_names_the_folder_as_hydra_and_the_shell_read_it(folder):
    command = resume_command(["quality.num_clips=2", "out_dir=old", "++out_dir=older"], Path(folder))
    program, setting, out_dir = shlex.split(command)
    assert (program, setting) == ("terra-evaluate", "quality.num_clips=2")
    (override,) = OverridesParser.create().parse_overrides([out_dir])
    assert (override.key_or_group, override.value()) == ("out_dir", folder)
