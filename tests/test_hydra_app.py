"""The Hydra apps' shared error handling (terra/apps/runner.py) in the scripts: an unknown setting or a malformed
override ends ``terra-rollout`` and ``terra-evaluate`` with exit code 2, exactly one line on stderr
and no traceback, as it does ``terra-generate`` (tests/test_bad_inputs.py). Each case is one process that stops
before any model loads.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from terra.apps.runner import hydra_error_line

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)

# case → (override, text the error line must contain)
HYDRA_ERRORS = {
    "unknown_key": ("foo=1", "unknown setting 'foo' (`{prog} --cfg job` lists the settings)"),
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
