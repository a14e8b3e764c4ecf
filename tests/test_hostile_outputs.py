"""The one rule for output folders (terra/config/output_dir.py), the toolkit's marker (terra/core/atomic.py) and
strict JSON, on their own; each app's use of them is tested beside the app (test_hostile_inputs.py,
tests/training/, tests/scoring/, tests/batch/).

Hostile outputs, by class: a folder that is, holds or lies inside an input (also through a symbolic link or a
glob); an existing file or folder the run would write over that the toolkit did not write; a folder of another
app's run (also one whose marker predates owners); a folder replaced whole that holds a user's file beside the
toolkit's; a file where a folder goes and the reverse; kernel file systems named as output folders; NaN in a JSON
file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from terra.config.checks import one_line
from terra.config.output_dir import check_output_dir, claim_output_dir, claim_output_file
from terra.config.manifest import Manifest
from terra.core.atomic import MARKER, atomic_dir, json_text, mark, marked, owner
from terra.core.errors import TerraInputError

APP = "terra-test"  # the app whose outputs these claims are


@pytest.fixture
def inputs(tmp_path) -> Path:
    """data/frames/000.png, data/samples.jsonl, and a link to data/frames."""
    (tmp_path / "data" / "frames").mkdir(parents=True)
    (tmp_path / "data" / "frames" / "000.png").write_bytes(b"png")
    (tmp_path / "data" / "samples.jsonl").write_text("{}\n")
    (tmp_path / "link").symlink_to(tmp_path / "data" / "frames")
    return tmp_path


@pytest.mark.parametrize("output, given, message", [
    ("data/frames", "data/frames", "is the frames"),
    ("link", "data/frames", "is the frames"),  # the same folder through a symbolic link
    ("data/frames/out", "data/frames", "lies inside the frames data/frames"),
    ("link/out", "data/frames", "lies inside the frames"),
    ("data", "data/frames", "holds the frames data/frames, which the run reads"),
    ("data", "data/samples.jsonl", "holds the frames data/samples.jsonl"),
    (".", "data/frames/*.png", "holds the frames data/frames/000.png"),  # a glob's matches
])
def test_an_output_folder_apart_from_every_input(inputs, monkeypatch, output, given, message):
    monkeypatch.chdir(inputs)
    with pytest.raises(TerraInputError, match="^output_dir=.* " + message.replace("*", r"\*")) as err:
        claim_output_dir(output, "output_dir", files=["report.json"], inputs=[("frames", given), ("none", None)],
                         app=APP)
    assert "\n" not in str(err.value)
    assert claim_output_dir("elsewhere", "output_dir", inputs=[("frames", given)], app=APP).path == inputs / "elsewhere"
    assert not (inputs / "elsewhere").exists()  # a claim creates nothing


def test_a_single_output_file_may_sit_beside_its_inputs_but_not_on_or_in_them(inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    assert claim_output_file("data/tokens.safetensors", "out", [("dataset", "data/frames")], app=APP).names == (
        "tokens.safetensors",)
    with pytest.raises(TerraInputError, match="out=.*samples.jsonl is the dataset"):
        claim_output_file("data/samples.jsonl", "out", [("dataset", "data/samples.jsonl")], app=APP)
    with pytest.raises(TerraInputError, match="lies inside the dataset data/frames"):
        claim_output_file("data/frames/tokens.safetensors", "out", [("dataset", "data/frames")], app=APP)


def test_only_what_the_toolkit_wrote_is_written_over(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    claim_output_dir(out, "output_dir", files=["summary.json"], app=APP)  # another file beside is fine
    (out / "summary.json").write_text("mine")
    with pytest.raises(TerraInputError, match=r"holds 'summary.json', which this run would overwrite and which the "
                                              r"toolkit did not write there; move it away"):
        claim_output_dir(out, "output_dir", files=["summary.json", "*.mp4"], app=APP)
    (out / "0001.mp4").write_bytes(b"")
    with pytest.raises(TerraInputError, match=r"holds '0001.mp4', 'summary.json', which"):
        claim_output_dir(out, "output_dir", files=["summary.json", "*.mp4"], app=APP)
    mark(out, ["summary.json", "0001.mp4"])  # as a run of the toolkit leaves the folder: the names it wrote
    claim_output_dir(out, "output_dir", files=["summary.json", "*.mp4"], app=APP).record()
    assert marked(out) == {"summary.json", "0001.mp4"}  # a pattern is never listed: it would claim a user's file
    (out / "0002.mp4").write_bytes(b"")
    with pytest.raises(TerraInputError, match=r"holds '0002.mp4', which this run would overwrite"):
        claim_output_dir(out, "output_dir", files=["*.mp4"], app=APP)


def test_a_file_where_a_folder_goes_and_the_reverse_are_refused(tmp_path):
    (tmp_path / "summary.json").mkdir()
    (tmp_path / "clip_frames").write_text("")
    mark(tmp_path, ["summary.json", "*_frames"])
    with pytest.raises(TerraInputError, match="holds a folder 'summary.json' where the run writes a file of that name"):
        claim_output_dir(tmp_path, "output_dir", files=["summary.json"], app=APP)
    with pytest.raises(TerraInputError, match="holds a file 'clip_frames' where the run writes a folder of that name"):
        claim_output_dir(tmp_path, "output_dir", folders=["*_frames"], app=APP)


def test_a_folder_replaced_whole_holds_only_what_its_marker_lists(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a user's model: no marker
    with pytest.raises(TerraInputError, match=r"model holds files the toolkit did not write \('config.json'\)"):
        claim_output_dir(model, "output_dir", replaced=True, app=APP)
    with pytest.raises(TerraInputError, match=r"out=.*: model/ holds files the toolkit did not write"):
        claim_output_dir(tmp_path, "out", whole=["model"], app=APP)
    with atomic_dir(tmp_path / "blend") as folder:  # what a run writes: its marker lists the folder's content
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"")
    assert marked(tmp_path / "blend") == {"config.json", "model.safetensors"}
    claim_output_dir(tmp_path / "blend", "output_dir", replaced=True, app=APP)
    (tmp_path / "blend" / "README.md").write_text("my notes")  # a user's file beside an earlier blend
    with pytest.raises(TerraInputError, match=r"holds 'README.md' beside what the toolkit wrote there"):
        claim_output_dir(tmp_path / "blend", "output_dir", replaced=True, app=APP)


@pytest.mark.parametrize("folder", ["/proc", "/sys", "/proc/self/out", "/sys/kernel/out"])
def test_kernel_file_systems_are_no_output_folder_and_no_full_disk(folder):
    with pytest.raises(TerraInputError, match="is not a disk|not on a disk|not writable") as err:
        check_output_dir(folder, ["report.json"], "out_dir")
    assert "full disk" not in str(err.value)


def test_names_with_control_characters_stay_on_one_line(tmp_path):
    assert one_line("clip\nA") == "'clip\\nA'" and one_line("clip A") == "clip A"
    weird = tmp_path / "a\nb"
    weird.mkdir()
    with pytest.raises(TerraInputError) as err:
        claim_output_dir(weird, "output_dir", inputs=[("frames", weird)], app=APP)
    assert "\n" not in str(err.value) and "a\\nb" in str(err.value)


def test_json_written_by_the_toolkit_has_no_nan():
    text = json_text({"loss": float("nan"), "psnr": [1.5, float("inf")], "ade": np.float64("-inf"), "n": 3})
    assert json.loads(text) == {"loss": None, "psnr": [1.5, None], "ade": None, "n": 3}
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))


def test_marking_twice_rewrites_nothing(tmp_path):
    mark(tmp_path, ["a.json"])
    before = os.stat(tmp_path / MARKER).st_mtime_ns, (tmp_path / MARKER).read_bytes()
    mark(tmp_path, ["a.json"])
    assert (os.stat(tmp_path / MARKER).st_mtime_ns, (tmp_path / MARKER).read_bytes()) == before


def test_a_run_folder_belongs_to_the_app_that_wrote_it(tmp_path):
    out = tmp_path / "out"
    claim_output_dir(out, "output_dir", files=["manifest.jsonl"], app="terra-rollout").record()
    assert owner(out) == "terra-rollout" and marked(out) == {"manifest.jsonl"}
    with pytest.raises(TerraInputError, match=r"^output_dir=.*out holds the outputs of terra-rollout, which "
                                              r"terra-drive would write over or mix with; give terra-drive a folder "
                                              r"of its own \(another output_dir\)$"):
        claim_output_dir(out, "output_dir", files=["manifest.jsonl", "a.mp4"], app="terra-drive")
    with pytest.raises(TerraInputError, match="holds the outputs of terra-rollout"):  # also under other names
        claim_output_dir(out, "output_dir", files=["report.json"], app="terra-evaluate")
    with pytest.raises(TerraInputError, match="holds the outputs of terra-rollout"):  # a single file too
        claim_output_file(out / "tokens.safetensors", "out", app="terra-tokenize")
    claim_output_dir(out, "output_dir", files=["manifest.jsonl"], app="terra-rollout").record()  # its own rerun
    # a run of one file takes no folder: a plain folder holds several apps' files
    shared = tmp_path / "shared"
    claim_output_file(shared / "tokens.safetensors", "out", app="terra-tokenize").record()
    assert owner(shared) is None and marked(shared) == {"tokens.safetensors"}
    claim_output_file(shared / "bench.json", "--out", app="scripts/bench/benchmark_drive.py").record()
    claim_output_dir(shared, "output_dir", files=["report.json"], app="terra-evaluate").record()
    assert owner(shared) == "terra-evaluate"
    # a folder replaced whole keeps its owner
    with atomic_dir(tmp_path / "blend", "terra-blend") as folder:
        (folder / "config.json").write_text("{}")
    with atomic_dir(tmp_path / "blend") as folder:
        (folder / "config.json").write_text("{}")
    assert owner(tmp_path / "blend") == "terra-blend"
    with pytest.raises(TerraInputError, match="holds the outputs of terra-blend"):
        claim_output_dir(tmp_path / "blend", "output_dir", replaced=True, app="terra-train")


@pytest.mark.parametrize("record, owner_app", [({"drive": "s__p", "status": "ok"}, "terra-drive"),
                                               ({"sample_id": "a", "status": "ok"}, "terra-rollout")])
def test_a_marker_from_before_owners_is_read_by_its_manifests_shape(tmp_path, record, owner_app):
    """A marker written before owners were recorded names none: a folder whose manifest holds an app's records is
    that app's; a folder without a manifest is adopted by the next app that claims it."""
    out = tmp_path / "old"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"written_by": "terra-world-model", "names": ["manifest.jsonl"]}))
    manifest = Manifest(out / "manifest.jsonl")
    manifest.add(record)
    manifest.close()
    other = {"terra-drive": "terra-rollout", "terra-rollout": "terra-drive"}[owner_app]
    with pytest.raises(TerraInputError, match=f"holds the outputs of {owner_app}, which {other} would"):
        claim_output_dir(out, "output_dir", files=["manifest.jsonl"], app=other)
    claim_output_dir(out, "output_dir", files=["manifest.jsonl"], app=owner_app).record()
    assert owner(out) == owner_app  # recorded from now on
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / MARKER).write_text(json.dumps({"written_by": "terra-world-model", "names": ["report.json"]}))
    claim_output_dir(plain, "out_dir", files=["report.json"], app="terra-evaluate").record()
    assert owner(plain) == "terra-evaluate"
    with pytest.raises(TerraInputError, match="holds the outputs of terra-evaluate"):
        claim_output_dir(plain, "output_dir", files=["manifest.jsonl"], app=owner_app)
