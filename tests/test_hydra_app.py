"""The Hydra apps' shared error handling (terra/apps/runner.py) in the scripts: an unknown setting or a malformed
override ends ``terra-rollout`` and ``terra-evaluate`` with exit code 2, exactly one line on stderr
and no traceback, as it does ``terra-generate`` (tests/test_bad_inputs.py). Each case is one process that stops
before any model loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from terra.apps.runner import hydra_error_line

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)

# case → (override, text the error line must contain)
HYDRA_ERRORS = {
    "unknown_key": ("foo=1", "unknown setting 'foo'; `{prog} --cfg job` lists the settings"),
    "malformed_override": ("num_context=[1,2", "'[1,2'"),
}


@pytest.mark.slow
@pytest.mark.parametrize("app", ["rollout", "evaluate"])
@pytest.mark.parametrize("case", list(HYDRA_ERRORS))
def test_hydra_errors_exit_2_with_one_line(app, case, tmp_path):
    override, expected = HYDRA_ERRORS[case]
    prog = f"terra-{app}"  # the console script of terra.apps.<app>, named in its error lines
    result = subprocess.run([sys.executable, "-m", f"terra.apps.{app}", override], cwd=tmp_path, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: ") and expected.format(prog=prog) in lines[0], lines[0]
    assert lines[0].endswith(f"; see {prog} --help")
    assert list(tmp_path.iterdir()) == []  # nothing written in the working folder


# the messages a new user meets first: a near miss is named, a range says its cap, a required path shows one
FIRST_MISTAKES = [
    ("generate", ["num_frame=3"], "unknown setting 'num_frame' (did you mean 'num_frames'?); `terra-generate --cfg "
                                  "job` lists the settings"),
    ("generate", ["+num_frame=3"], "unknown setting 'num_frame' (did you mean 'num_frames'?)"),
    ("generate", ["output.formts=[gif]"], "unknown setting 'output.formts' (did you mean 'output.formats'?)"),
    ("drive", ["+sampling.temprature=1"], "unknown setting 'sampling.temprature' (did you mean "
                                          "'sampling.temperature'?)"),
    ("generate", ["model=demoo"], "unknown model 'demoo' (did you mean 'demo'?); choose one of: demo, terra_v1, "
                                  "terra_v2; see terra-generate --help"),
    ("drive", ["backend=vlm"], "unknown backend 'vlm' (did you mean 'vllm'?); choose one of: auto, hf, vllm"),
    ("generate", ["model=nothing_like_it"], "unknown model 'nothing_like_it'; choose one of: demo, terra_v1"),
    ("generate", ["num_frames=0"], "num_frames must be a whole number from 1 to max_num_frames (1000) (got 0)"),
    ("generate", ["num_frames=9", "max_num_frames=8"], "num_frames=9 is more than max_num_frames=8"),
    ("drive", ["world=bothh"], "unknown world 'bothh' (did you mean 'both'?); choose one of: model, truth, both, or "
                               "package.module:Class"),
    ("drive", ["policies=[brake_hardd]"], "unknown policy 'brake_hardd' (did you mean 'brake_hard'?)"),
    ("drive", ["vehicle=bicycel"], "unknown vehicle 'bicycel' (did you mean 'bicycle'?); choose one of: bicycle, "
                                   "exact"),
    ("serve", ["sampling.draft_tokens=0"], "sampling.draft_tokens must be a whole number from 1 to 4096 (got 0); e.g. "
                                          "sampling.draft_tokens=32"),
    ("generate", ["decoder=framewise"], "decoder='framewise' is unknown; use decoder=tokenizer (the tokenizer's "
                                        "frames) or decoder=refiner (Terra's video refiner, GPU)"),
    ("rollout", ["output=null"], "output=null picks no option of the configuration group 'output'; choose one of: "
                                 "default"),
    ("serve", ["serve.cors=yes"], "serve.cors must be true or false (got 'yes')"),  # a flag is true or false, in
    ("train", ["train.compile=on"], "train.compile must be true or false (got 'on')"),  # every app alike
    ("tokenize_dataset", [], "no tokenizer_path given; pass tokenizer_path=DIR (a saved tokenizer folder, e.g. the "
                             "demo tokenizer's: tokenizer_path="),
]


@pytest.mark.parametrize("app, args, expected", FIRST_MISTAKES, ids=[" ".join(c[1]) or c[0] for c in FIRST_MISTAKES])
def test_a_first_mistake_names_the_near_miss_and_the_fix(app, args, expected, tmp_path):
    """Each mistake of a first hour, through the app's entry point: one line, exit 2, the likely meaning named."""
    prog = {"tokenize_dataset": "terra-tokenize"}.get(app, f"terra-{app}")
    result = subprocess.run([sys.executable, "-m", f"terra.apps.{app}", *args], cwd=tmp_path, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, (result.returncode, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith(f"{prog}: error: ") and expected in line, line
    if app == "tokenize_dataset":  # the demo tokenizer's folder, as this install has it
        assert Path(line.rpartition("tokenizer_path=")[2].rstrip(")")).joinpath("config.json").is_file(), line
    assert list(tmp_path.iterdir()) == []


def test_one_line_joins_hydras_option_list_and_drops_key_details():
    err = ValueError("Could not find 'model/nope'\nAvailable options in 'model':\n\tdemo\n\tterra_v1\n"
                     "Config search path:\n\tprovider=main, path=pkg://terra.conf")
    assert hydra_error_line(err) == "Could not find 'model/nope' Available options in 'model': demo, terra_v1"
    assert hydra_error_line(ValueError("Key 'x' is not in struct\n    full_key: x\n    object_type=dict")) == (
        "Key 'x' is not in struct")
    assert hydra_error_line(KeyError()) == "KeyError"


@pytest.mark.parametrize("app", ["generate", "rollout", "serve", "evaluate", "train_world_model",
                                 "prepare_driving_logs"])
def test_terras_models_sample_as_terra_unless_told_otherwise(app):
    """model=terra_v1|terra_v2 select conf/sampling/terra.yaml (Terra's generate.py: temperature 0.9, no top-k,
    top-p 1); a sampling choice or value on the command line still wins; the demo model keeps the app's own."""
    from hydra import compose, initialize_config_dir

    from terra.apps.runner import CONF_DIR

    def sampling(*overrides: str) -> dict | None:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            cfg = compose(app, overrides=list(overrides))
        return None if cfg.get("sampling") is None else dict(cfg.sampling)

    terra = {"temperature": 0.9, "top_k": 0, "top_p": 1.0, "decoding": "auto", "draft_tokens": "auto",
             "guesses": "auto"}
    assert sampling("model=terra_v1") == sampling("model=terra_v2") == terra
    if app in ("train_world_model", "prepare_driving_logs"):  # they do not sample (the key is left unused)
        return
    assert sampling("model=terra_v1", "sampling=default")["temperature"] == 1.0
    assert sampling("model=terra_v2", "sampling.temperature=0.5") == {**terra, "temperature": 0.5}
    assert sampling()["temperature"] == (0.0 if app == "evaluate" else 1.0)  # the demo model: greedy / default


@pytest.mark.parametrize("app, extra, package, module", [
    ("serve", "serve", "uvicorn", "uvicorn"), ("drive", "closedloop", "scipy", "scipy"),
    ("evaluate", "eval", "scikit-image", "skimage"), ("alpasim", "alpasim", "protobuf", "google.protobuf"),
])
def test_an_app_without_its_extra_names_the_extra_before_anything_runs(app, extra, package, module, tmp_path):
    """make demo installs the project alone: an app whose extra is missing (here one package of it, hidden from the
    metadata and from import) stops with one line naming the extra, where it printed a traceback at import
    (terra-serve) or an internal error, minutes into its work (terra-evaluate)."""
    code = ("import importlib.metadata as metadata, sys\n"
            "found = metadata.distribution\n"
            f"def distribution(name):\n    if name == {package!r}:\n        raise metadata.PackageNotFoundError(name)\n"
            "    return found(name)\n"
            f"metadata.distribution = distribution\nsys.modules[{module!r}] = None\n"
            f"from terra.apps.{app} import main\nmain()\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, (result.returncode, result.stderr)
    prog = f"terra-{app}"
    assert result.stderr.splitlines() == [f"{prog}: error: the {extra} extra is not installed ({package} missing): "
                                          f"pip install -e '.[{extra}]' (make test installs every extra)"]
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


def test_help_and_cfg_need_no_extra(tmp_path):
    """--help and --cfg run nothing: without terra-drive's extra (SciPy hidden) they still print, the help page
    saying why its choices are not listed."""
    code = ("import sys\nsys.modules['scipy'] = None\nsys.argv[1:] = sys.argv[2:]\n"
            "from terra.apps.drive import main\nmain()\n")
    for flag, text in (("--help", "not listed here: they need scipy, which is not installed; terra-drive without "
                                  "--help names the extra to install"), ("--cfg", "world: model")):
        args = [flag, "job"] if flag == "--cfg" else [flag]
        result = subprocess.run([sys.executable, "-c", code, "--", *args], cwd=tmp_path, env=ENV, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0 and text in result.stdout, (flag, result.stdout[-500:], result.stderr)


@pytest.mark.parametrize("app", ["drive", "generate"])
def test_a_config_of_yours_without_the_apps_settings_is_refused_before_hydra_writes_anything(app, tmp_path):
    """``--config-dir DIR --config-name NAME`` of a config that lacks the app's settings, and leaves Hydra's own run
    folder settings at Hydra's defaults: one line, exit 2, and no ``outputs/<date>/<time>/`` with Hydra's ``.hydra``
    folder and log in the working folder."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "mine.yaml").write_text("a: 1\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    prog = f"terra-{app}"
    result = subprocess.run([sys.executable, "-m", f"terra.apps.{app}", "--config-dir", str(tmp_path / "mine"),
                             "--config-name", "mine", "a=2"], cwd=cwd, env=ENV, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert list(cwd.rglob("*")) == []
    [line] = result.stderr.splitlines()
    assert line.startswith(f"{prog}: error: the config 'mine' (--config-dir / --config-name) lacks {prog}'s "
                           "settings"), line


def test_an_override_holding_a_newline_is_one_line(tmp_path):
    """The value shows with its newline escaped, in the line and in its quoted example."""
    result = subprocess.run([sys.executable, "-m", "terra.apps.drive", "seed=1\n2"], cwd=tmp_path, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, (result.returncode, result.stderr)
    [line] = result.stderr.splitlines()
    assert line == ("terra-drive: error: cannot parse the override 'seed=1\\n2': quote a value with spaces, non-ASCII "
                    "letters or special characters for Hydra, e.g. \"seed='1\\n2'\"; see terra-drive --help"), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("app, arg, name", [("generate", "decoding=framewise", "decoding"),
                                            ("serve", "sampling.block_size=8", "sampling.block_size"),
                                            ("rollout", "+decoding=refiner", "decoding")])
def test_a_settings_earlier_name_is_an_unknown_setting(app, arg, name, tmp_path):
    result = subprocess.run([sys.executable, "-m", f"terra.apps.{app}", arg], cwd=tmp_path, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, (result.returncode, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith(f"terra-{app}: error: unknown setting '{name}'"), line
    assert list(tmp_path.iterdir()) == []
