"""Progress, one rule for the apps and the Python API (terra/core/progress.py): a bar only where someone watches (a
terminal, a notebook's widgets), none in a pipe; off a terminal a long run prints a line now and then with the time
left, and a short one stays quiet."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import tqdm.std

import terra.core.progress as progress_module
from terra.config.sampling import SamplingConfig
from terra.core.progress import Progress, duration, prints_lines, shows_bars
from terra.generation.backends import model_backend
from terra.generation.rollout import RolloutRequest
from tests.closedloop.conftest import drive_settings_of
from tests.conftest import tiny_model


class Terminal:
    """A stream that says it is a terminal (and keeps what is written)."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


def test_bars_only_on_a_terminal_and_lines_only_off_one(monkeypatch):
    # under pytest both streams are captured: a log, as in CI or behind nohup
    assert not shows_bars() and prints_lines() and not prints_lines(False)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert shows_bars() and not shows_bars(False)
    assert prints_lines()  # stdout still goes to a file: `terra-drive ... > log` gets the lines
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert not prints_lines()  # both on the terminal: the bar alone


def test_a_long_count_prints_lines_with_the_time_left_and_a_short_one_none(capsys, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])  # tqdm's clock
    bar = Progress(8, "drives (model)", "frame")
    for now[0], count in ((30, 1), (60, 3), (90, 2), (100, 1)):
        bar.update(count)  # a line at 60 s (a minute since the start), none at 90 or 100 s
    now[0] = 130
    bar.close()  # and one as it ends
    out = capsys.readouterr()
    assert out.err == ""  # no bar drawn into the captured stderr
    assert out.out.splitlines() == ["drives (model): 4/8 frames (50%) in 1m 00s, about 1m 00s left",
                                    "drives (model): 7/8 frames (88%) in 2m 10s, about 19s left"]
    quiet = Progress(8, "drives (model)", "frame")  # ends within the minute: no line at all
    now[0] = 150
    quiet.update(8)
    quiet.close()
    assert Progress(8, "off", enabled=False).lines is None and capsys.readouterr().out == ""
    assert [duration(s) for s in (42, 185, 3720)] == ["42s", "3m 05s", "1h 02m"]


def test_the_python_api_draws_no_bar_into_a_pipe(capsys):
    """pipeline.generate(progress=True), the API's default, drew tqdm's bar into whatever stderr was (a pipe, a
    log); now only a terminal gets it."""
    backend = model_backend(tiny_model())
    context = np.random.default_rng(0).integers(0, 64, (2, 64))
    actions = np.zeros((4, 6, 3), np.float32)
    [codes] = backend.generate([RolloutRequest(context, actions, 3, seed=1)], SamplingConfig(temperature=1.0))
    assert codes.shape == (3, 64)
    out = capsys.readouterr()
    assert out.err == "" and out.out == "", out.err


def test_a_drive_off_a_terminal_says_how_far_it_is(tmp_path, capsys, monkeypatch):
    """terra-drive in a log (`> log`, CI, nohup) printed nothing for minutes; now a line a minute with the time left
    (every 0 s here, so each step prints one) and one as the world ends."""
    from terra.closedloop.study.drives import terra_drive

    monkeypatch.setattr(progress_module, "EVERY_S", 0.0)
    settings = drive_settings_of(tmp_path / "out", "num_scenarios=1", "num_steps=3", "policies=[constant_speed]",
                                 "videos=false")
    outcome = terra_drive(settings)
    assert outcome.exit_code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and lines[-1].startswith("drives (truth): 3/3 frames (100%) in ") and lines[-1].endswith(", done")
    assert any("left" in line for line in lines[:-1]), lines
    monkeypatch.setattr(progress_module, "EVERY_S", 60.0)
    settings = drive_settings_of(tmp_path / "out2", "num_scenarios=1", "num_steps=3", "policies=[constant_speed]",
                                 "videos=false", "progress=false")
    terra_drive(settings)
    assert capsys.readouterr().out == ""  # progress=false: no line either


@pytest.mark.parametrize("kernel, expected", [("ZMQInteractiveShell", False), ("TerminalInteractiveShell", True)])
def test_a_notebook_keeps_its_widgets_and_prints_no_lines(monkeypatch, kernel, expected):
    shell = type(kernel, (), {})()
    monkeypatch.setitem(sys.modules, "IPython", type("IPython", (), {"get_ipython": staticmethod(lambda: shell)}))
    assert prints_lines() is expected and shows_bars() is not expected
