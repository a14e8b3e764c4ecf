"""The input formats the docs show are read as the docs say: docs/generate.md's trajectory files (CSV and JSON, x
forward and y to the left) and docs/rollout.md's samples file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from terra.core.errors import TerraInputError
from terra.inputs.actions import load_actions
from terra.inputs.samples import read_samples

ROOT = Path(__file__).resolve().parents[1]


def fenced(page: str, language: str) -> list[str]:
    """The code blocks of ``language`` in a docs page, their indentation removed."""
    text = (ROOT / "docs" / page).read_text()
    blocks = re.findall(rf"^( *)```{language}\n(.*?)^\1```", text, re.S | re.M)
    return ["\n".join(line[len(indent):] for line in body.splitlines()) + "\n" for indent, body in blocks]


@pytest.mark.parametrize("language, suffix", [("csv", ".csv"), ("json", ".json")])
def test_the_trajectory_examples_load_and_drive_forward_then_left(tmp_path, language, suffix):
    [example] = fenced("generate.md", language)
    path = tmp_path / f"traj{suffix}"
    path.write_text(example)
    actions = load_actions(path, 3)  # [frames, 6, 3] of [y, x, time] in each frame's ego frame
    assert actions.shape == (3, 6, 3)
    assert (actions[:, :, 1] > 0).all()  # x: forward, 12 m/s
    assert actions[0, -1, 0] > 0  # y: the example yaws to the left


def test_a_trajectory_example_with_a_broken_key_is_one_error(tmp_path):
    """Control: the loader does refuse what the docs do not show (a misspelt key)."""
    [example] = fenced("generate.md", "json")
    path = tmp_path / "traj.json"
    path.write_text(example.replace('"trajectory"', '"trajectroy"'))
    with pytest.raises(TerraInputError, match="expected exactly one of the keys"):
        load_actions(path, 3)


def test_the_samples_example_parses_line_by_line(tmp_path):
    [block] = [b for b in fenced("rollout.md", "jsonl")]
    lines = [line for line in block.splitlines() if "..." not in line]  # the elided ACT-Bench row aside
    assert len(lines) == 3
    (tmp_path / "samples.jsonl").write_text("\n".join(lines) + "\n")
    samples = read_samples(tmp_path / "samples.jsonl")
    assert [s.error for s in samples] == [None, None, None]
    assert [s.kind for s in samples] == ["terra"] * 3
    assert json.loads(lines[2])["trajectory"]["x"][-1] > 0
