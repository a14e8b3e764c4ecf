"""A disk that fills during a run (here a file-size limit, RLIMIT_FSIZE: writing more fails with EFBIG, as a full
disk fails with ENOSPC): every write of the toolkit's ends with terra/core/atomic.py's one line naming the file
(``write_failed``), exit 2, as terra-generate's does (tests/test_hostile_inputs.py), and nothing is torn."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from terra.config.manifest import Manifest
from terra.core.atomic import MARKER, atomic_dir, atomic_path, write_text
from terra.core.errors import TerraInputError
from tests.conftest import one_error_line

BIN = Path(sys.executable).parent
ENV = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
ENV.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def limit_file_size() -> None:
    """In the child: files may grow to 5 kB (a drive's JSON is about 6 kB, a shard of two clips about 90 kB)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (5_000, 5_000))


def full_disk_run(script: str, *args: str, cwd: Path) -> str:
    result = subprocess.run([str(BIN / script), *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                            timeout=600, preexec_fn=limit_file_size)
    return one_error_line(result, script, "; free disk space or choose another output folder")


@pytest.mark.parametrize("fmt, written", [("shards", "out/shard-00000.npz"), ("driving_logs", "out/day-0-0000")])
def test_make_dataset_on_a_full_disk_is_one_line(tmp_path, fmt, written):
    line = full_disk_run("terra-make-dataset", f"format={fmt}", "out_dir=out", "num_clips=2", "num_frames=4",
                         "workers=1", cwd=tmp_path)
    assert f"cannot write {written}" in line and "(File too large)" in line, line
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [MARKER]  # no temporary, no half a clip


@pytest.mark.slow
def test_drive_on_a_full_disk_is_one_line(tmp_path):
    line = full_disk_run("terra-drive", "world=truth", "num_scenarios=1", "num_steps=3", "output_dir=out",
                         "videos=false", "num_threads=1", cwd=tmp_path)
    assert f"cannot write {tmp_path / 'out'}" in line, line
    for path in (tmp_path / "out").iterdir():  # what is there is whole: a drive's JSON or a video, or nothing
        assert not path.name.startswith(".") or path.name == MARKER, path.name
        if path.suffix == ".json":
            json.loads(path.read_text())


def test_each_write_that_finds_no_space_names_its_file_and_leaves_the_target(tmp_path):
    def no_space(*_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    write_text(tmp_path / "kept.json", "{}")
    with pytest.raises(TerraInputError, match=r"cannot write .*kept\.json \(No space left on device\); free disk"):
        with atomic_path(tmp_path / "kept.json") as tmp:
            tmp.write_text("half")
            no_space()
    with pytest.raises(TerraInputError, match=r"cannot write .*clip \(No space left on device\)"):
        with atomic_dir(tmp_path / "clip") as tmp:
            (tmp / "frame.png").write_bytes(b"half")
            no_space()
    with pytest.raises(OSError, match="Permission denied"):  # any other OSError stays what it is
        with atomic_path(tmp_path / "other.json"):
            raise PermissionError(errno.EACCES, "Permission denied")
    manifest = Manifest(tmp_path / "manifest.jsonl")
    real_write, os.write = os.write, no_space
    try:
        with pytest.raises(TerraInputError, match=r"cannot write .*manifest\.jsonl \(No space left on device\)"):
            manifest.add({"n": 1})
    finally:
        os.write = real_write
    manifest.close()
    assert (tmp_path / "kept.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "manifest.jsonl"]  # no temporary left
