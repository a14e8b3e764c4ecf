"""The bars of a batch run (terra/batch/progress.py): frames of every sample in flight, and samples written."""

from __future__ import annotations

import sys
from pathlib import Path

from terra.batch.plan import Item
from terra.batch.progress import BatchProgress
from terra.inputs.samples import Sample


def items(frames: list[int]) -> list[Item]:
    return [Item(Sample("s.jsonl", i + 1, i, {"sample_id": i}), i, n, {}, Path(f"{i}.json"), None, "")
            for i, n in enumerate(frames)]


def test_frames_count_while_samples_are_in_flight_and_failures_leave_the_total():
    progress = BatchProgress(items([4, 4, 4]), enabled=False)
    assert (progress.frames_total, progress.samples.total) == (12, 3)
    for count in (1, 2):  # one engine step after another: a frame of every rollout
        for index in range(3):
            progress.generated(index, count)
    assert progress.frames_done == 6 and progress.samples.total == 3  # moving before any sample is written
    progress.generated(2, 0)  # sample 2 starts again (its Ray actor died)
    assert progress.frames_done == 4
    records = [{"index": 0, "status": "ok"}]
    progress.recorded(records[0], records)
    assert progress.frames_done == 6  # its last two frames came with the record
    progress.generated(0, 3)  # a late poll of a written sample changes nothing
    assert progress.frames_done == 6
    records.append({"index": 1, "status": "failed"})
    progress.recorded(records[1], records)
    assert progress.frames_total == 10 and progress.frames_done == 6  # its two missing frames will never come
    progress.close()


def test_the_bars_show_frames_per_second_and_the_sample_count(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: bars (none off one: terra/core/progress.py)
    progress = BatchProgress(items([2, 2]), enabled=True)
    progress.generated(0, 1)
    progress.generated(1, 1)
    records = [{"index": 0, "status": "ok"}, {"index": 1, "status": "ok"}]
    progress.recorded(records[0], records[:1])
    progress.recorded(records[1], records)
    progress.close()
    err = capsys.readouterr().err
    assert "generated frames: 100%" in err and "4/4" in err and "frame/s" in err
    assert "samples written: 100%" in err and "2/2" in err and "ok=2, failed=0" in err
