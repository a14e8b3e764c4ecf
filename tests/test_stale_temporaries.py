"""Temporary files of atomic writes (terra/core/atomic.py): a killed writer's is removed by the next write into a
folder the toolkit owns, and nothing else is: not a user's file of a similar name, not a temporary in a folder without
the toolkit's marker or for a name it does not list, not another host's, and never a live writer's, even one whose pid
means nothing here (another PID namespace: two containers of one host name sharing a volume), told by the lock it
holds on its temporary. A batch rerun's sweep (terra/batch/plan.py) keeps to the same names and the same lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from terra.batch.plan import remove_stale_temporaries
from terra.core import atomic
from terra.core.atomic import MARKER, temporary_target

HOST = atomic._owner().rsplit("-", 1)[0]

# A writer that claims to be ``owner`` (as a process of another PID namespace would: its pid means nothing here),
# writes half of its file, says its temporary's name, and finishes when told to.
WRITER = """
import sys
from terra.core import atomic
atomic._owner = lambda: sys.argv[2]
with atomic.atomic_path(sys.argv[1]) as tmp:
    tmp.write_bytes(b"first half, ")
    print(tmp.name, flush=True)
    sys.stdin.readline()
    with tmp.open("ab") as fh:
        fh.write(b"second half")
"""


def dead_pid() -> int:
    """The pid of a process that ran and ended."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)


def marked_folder(folder: Path, *names: str) -> Path:
    """``folder`` with the toolkit's marker listing ``names`` (written directly: an atomic write would sweep now)."""
    folder.mkdir(exist_ok=True)
    (folder / MARKER).write_text(json.dumps({"written_by": "terra-world-model", "names": list(names)}))
    return folder


def test_a_killed_writers_temporary_is_removed_by_the_next_write_and_no_other(tmp_path):
    dead = dead_pid()
    out = marked_folder(tmp_path / "out", "rollout.gif", "manifest.summary.json")
    stale = out / f".rollout.{HOST}-{dead}.ab12cd34.tmp.gif"
    stale_summary = out / f".manifest.summary.{HOST}-{dead}.x_9y8z7w.tmp.json"
    kept = [
        out / f".rollout.{HOST}-{os.getppid()}.ab12cd35.tmp.gif",  # a process that still runs
        out / f".rollout.elsewhere-{dead}.ab12cd36.tmp.gif",  # another machine's, on a shared folder
        out / f".notes.{HOST}-999999.keep.tmp.txt",  # a user's: not the toolkit's form
        out / f".notes.{HOST}-{dead}.abcdefgh.tmp.txt",  # the toolkit's form, for a name the marker does not list
        out / ".rollout.tmp",
    ]
    unmarked = tmp_path / "mine"
    unmarked.mkdir()
    kept.append(unmarked / f".rollout.{HOST}-{dead}.ab12cd37.tmp.gif")  # a folder without the toolkit's marker
    for path in (stale, stale_summary, *kept):
        path.write_bytes(b"partial")
    with pytest.raises(KeyboardInterrupt):
        with atomic.atomic_path(out / "rollout.gif") as tmp:
            tmp.write_bytes(b"half")
            assert tmp.name.startswith(f".rollout.{atomic._owner()}.") and temporary_target(tmp.name) == "rollout.gif"
            raise KeyboardInterrupt  # as SIGINT (or the runner's SIGTERM) raises it
    atomic.write_text(unmarked / "rollout.gif", "written")
    assert not stale.exists() and not stale_summary.exists()
    assert all(path.exists() for path in kept)
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, *(p.name for p in kept if p.parent == out)])


@pytest.mark.parametrize("claimed", ["a pid not running here", "a pid of another process here"])
def test_a_live_writer_of_another_pid_namespace_keeps_its_temporary(tmp_path, claimed):
    """The writer's name claims a pid that is no process here, or another one: only its lock says it is alive."""
    out = marked_folder(tmp_path / "out", "rollout.gif", "other.json")
    pid = dead_pid() if claimed == "a pid not running here" else os.getppid()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(out / "rollout.gif"), f"{HOST}-{pid}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        name = writer.stdout.readline().strip()  # the writer holds its temporary's lock from here on
        assert temporary_target(name) == "rollout.gif", name
        atomic.write_text(out / "other.json", "{}")  # this process's first write here sweeps the folder
        assert (out / name).exists()
        assert remove_stale_temporaries([SimpleNamespace(targets=[out / "rollout.gif"], videos={})]) == 0
        writer.stdin.write("\n")
        writer.stdin.close()
        assert writer.wait(60) == 0
    finally:
        writer.kill()
        writer.wait()
    assert (out / "rollout.gif").read_bytes() == b"first half, second half"
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "rollout.gif", "other.json"])


def test_a_batch_rerun_removes_its_targets_abandoned_temporaries_only(tmp_path):
    """A killed writer's temporary of one of the run's files goes, whatever host or pid it names (the run holds the
    folder's lock, and no process holds the temporary's); a user's file of a similar name stays."""
    out = tmp_path / "out"
    frames = out / "s1_frames"
    frames.mkdir(parents=True)
    abandoned = [out / ".s1.elsewhere-7.k1lled_0.tmp.mp4", frames / ".000.node-3-12.abcdefgh.tmp.png"]
    kept = [out / ".s1.k1lled_0.tmp.mp4", out / ".s2.elsewhere-7.k1lled_0.tmp.mp4", out / ".s1.mp4.tmp",
            frames / ".notes.tmp.png"]
    for path in (*abandoned, *kept):
        path.write_bytes(b"partial")
    item = SimpleNamespace(targets=[out / "s1.mp4", out / "s1.json"], videos={"png": frames})
    assert remove_stale_temporaries([item]) == 2
    assert not any(path.exists() for path in abandoned) and all(path.exists() for path in kept)
