"""Modules that moved (terra/core/lazy.py, ``moved_modules``): the closed-loop wing's into its sub-packages
(terra/closedloop/__init__.py), terra/session/controls.py to driver_input.py and the two prepare.py to names of
their own (terra/batch/prepared_sample.py, terra/training/prepare_logs.py), and the model's contract a floor down,
from terra/generation/ to terra/contract/ (actions, routes, layout). Every old path still imports until
0.2.0, as the same module object, with one FutureWarning naming the new path; the gymnasium ids work
through the old module too. A name that never was a module of the wing still fails."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
OLD = ("alpasim_metrics", "control_worlds", "drive_fidelity", "drives", "egodriver", "exploit_drives", "fidelity",
       "gym_env", "gym_spaces", "imitation", "learned", "metrics", "motion", "navsim", "plan_following", "prepare",
       "ray_executor", "record", "reference", "run", "settings", "tracking", "truth", "vehicle", "verdict", "vision",
       "drivers", *(f"drivers.{name}" for name in ("builtin", "egodriver", "imitation", "learned", "navsim", "vision"))
       )  # every module of terra/closedloop/ that moved out of its root, and the policies' package named for them
CONTRACT = ("actions", "layout", "routes")  # terra/generation/ -> terra/contract/
MOVED = [*(f"terra.closedloop.{name}" for name in OLD), "terra.session.controls", "terra.batch.prepare",
         "terra.training.prepare", *(f"terra.generation.{name}" for name in CONTRACT)]
PROBE = """
import importlib, json, sys, warnings
import terra.batch, terra.closedloop, terra.generation, terra.session, terra.training
out = {}
tables = (terra.batch, terra.closedloop, terra.generation, terra.session, terra.training)
for old, new in {old: new for package in tables for old, new in package.MOVED_MODULES.items()}.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        space = {}
        exec(f"import {old} as module", space)  # an import statement, as a user's code has it
        module = space["module"]
    out[old] = [module is importlib.import_module(new), module.__name__,
                [f"{w.category.__name__}: {w.message}" for w in caught], [w.filename for w in caught]]
print(json.dumps(out))
"""


def test_every_old_path_imports_the_moved_module_with_one_warning():
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert sorted(found) == sorted(MOVED)
    for old, (same, name, warned, where) in found.items():
        wing = "terra.contract" if old.startswith("terra.generation.") else ".".join(old.split(".")[:2])
        assert same and name != old and name.startswith(wing + "."), old  # within its wing, or the contract down
        assert warned == [f"FutureWarning: {old} moved to {name}; the old name goes in 0.2.0"], old
        assert where == ["<string>"], old  # the warning points at the importing line, not at the import system


def test_old_names_of_functions_and_the_from_form_still_resolve(monkeypatch):
    monkeypatch.delitem(sys.modules, "terra.closedloop.run", raising=False)  # imported before: import it anew
    with pytest.warns(FutureWarning):
        from terra.closedloop.run import record_run  # noqa: F401 (the old path, on purpose)
    from terra.closedloop import recording
    from terra.closedloop.recording.run import record_run as moved

    assert record_run is moved and recording.run.record_run is moved


def test_a_name_that_never_was_a_module_of_the_wing_still_fails():  # the control: the finder adds nothing else
    with pytest.raises(ModuleNotFoundError):
        import terra.closedloop.no_such_module  # noqa: F401


def test_the_gymnasium_ids_work_through_the_old_module(monkeypatch):
    gym = pytest.importorskip("gymnasium")
    monkeypatch.delitem(sys.modules, "terra.closedloop.gym_env", raising=False)
    from terra.closedloop.gym.env import DriveEnv

    with pytest.warns(FutureWarning, match="terra.closedloop.gym_env moved to terra.closedloop.gym.env"):
        env = gym.make("terra.closedloop.gym_env:terra/Drive-v0", num_scenarios=1, image_size=(36, 64), num_steps=2)
    assert isinstance(env.unwrapped, DriveEnv) and env.spec.id == "terra/Drive-v0"
    env.close()


def test_a_renamed_public_function_is_found_under_its_old_name_for_one_release():
    from terra.closedloop.study import report

    with pytest.warns(FutureWarning, match="report.run_fidelity is now terra.closedloop.study.report.run_study"):
        from terra.closedloop.study.report import run_fidelity
    assert run_fidelity is report.run_study
    with pytest.raises(ImportError):  # the control: a name that never was there
        from terra.closedloop.study.report import run_nothing  # noqa: F401


def test_the_forward_pass_figures_old_name_is_found_for_one_release():
    from terra.generation import pass_stats, rollout

    with pytest.warns(FutureWarning, match="rollout.DecodeStats is now terra.generation.pass_stats.PassStats"):
        from terra.generation.rollout import DecodeStats
    assert DecodeStats is pass_stats.PassStats is rollout.PassStats  # its module's own, and the rollout's name for it


def test_the_policies_old_class_names_are_found_for_one_release():
    from terra.closedloop.study import exploit

    with pytest.warns(FutureWarning, match="exploit.TunedDriver is now terra.closedloop.study.exploit.TunedPolicy"):
        from terra.closedloop.study.exploit import TunedDriver
    with pytest.warns(FutureWarning, match="exploit.tuned_driver is now terra.closedloop.study.exploit.tuned_policy"):
        from terra.closedloop.study.exploit import tuned_driver
    assert TunedDriver is exploit.TunedPolicy and tuned_driver is exploit.tuned_policy
    with pytest.raises(ImportError):  # the control: a name the module never had
        from terra.closedloop.study.exploit import NoDriver  # noqa: F401


def test_the_policies_old_module_names_are_found_on_the_policies_package_for_one_release():
    from terra.closedloop import policies
    from terra.closedloop.policies import builtin

    with pytest.warns(FutureWarning, match="policies.policy_factories is now terra.closedloop.policies.builtin"):
        from terra.closedloop.policies import policy_factories
    assert policy_factories is builtin.policy_factories
    with pytest.raises(AttributeError):  # the control: a name the module never had
        policies.no_such_policy  # noqa: B018 (the attribute access is the test)


def test_a_module_under_the_policies_old_package_is_the_moved_module_not_a_copy(monkeypatch):
    for old in ("terra.closedloop.drivers", "terra.closedloop.drivers.vision"):
        monkeypatch.delitem(sys.modules, old, raising=False)
    from terra.closedloop.policies import vision

    with pytest.warns(FutureWarning) as caught:
        from terra.closedloop.drivers.vision import LaneFollower
    assert LaneFollower is vision.LaneFollower and sys.modules["terra.closedloop.drivers.vision"] is vision
    assert [str(w.message) for w in caught] == [
        f"terra.closedloop.{old} moved to terra.closedloop.{new}; the old name goes in 0.2.0"
        for old, new in (("drivers", "policies"), ("drivers.vision", "policies.vision"))]


def test_the_old_names_go_in_the_release_their_warnings_name():
    from terra.core.lazy import REMOVED_IN

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert Version(version) < Version(REMOVED_IN), \
        f"version {version}: remove the old names docs/moved-names.md says go in {REMOVED_IN}"
