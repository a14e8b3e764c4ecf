"""ACT-Bench's samples, as scoring reads them: JSONL rows with ``sample_id``, ``label`` and ``reference_traj``
(ACT-Bench's ``act_bench.jsonl``; a folder means every ``*.jsonl`` in it, in name order)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from terra.config.actbench import MAX_SAMPLES_BYTES
from terra.config.checks import shown
from terra.config.files import parse_json, read_input_text
from terra.core.errors import TerraInputError
from terra.scoring.labels import LABELS, command_label, reference_waypoints

PASSED_ON = ("context_frames", "instruction_trajs", "reference_traj")  # columns copied to results.jsonl


@dataclass(frozen=True)
class BenchSample:
    """One scored row: id, class, reference waypoints ``[T, 2]`` and the JSON text of the :data:`PASSED_ON` fields."""

    sample_id: int
    cond_label: str
    reference: np.ndarray
    passed_on: dict[str, str]

    @property
    def cond_class(self) -> int:
        """The class id: the position of :attr:`cond_label` in :data:`~terra.scoring.labels.LABELS`."""
        return LABELS.index(self.cond_label)


def sample_files(path: Path) -> tuple[Path, ...]:
    """``path`` itself, or the ``*.jsonl`` files of a folder in name order; one line when there are none."""
    if path.is_dir():
        files = tuple(sorted(path.glob("*.jsonl")))
        if not files:
            raise TerraInputError(f"samples folder {path} has no *.jsonl file; pass ACT-Bench's act_bench.jsonl")
        return files
    return (path,)


def read_bench_samples(files: Sequence[Path], num_points: int) -> tuple[list[BenchSample], int]:
    """The scored samples of ``files`` in file and line order, and how many rows were left out."""
    samples: list[BenchSample] = []
    seen: dict[int, str] = {}
    left_out = 0
    for file in files:
        text = read_input_text(file, "samples file", MAX_SAMPLES_BYTES)
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{file} line {number}"
            row = parse_json(line, where)
            if not isinstance(row, dict):
                raise TerraInputError(f"{where}: expected a JSON object, got {type(row).__name__}")
            try:
                cond_label = command_label(row.get("label"))
            except ValueError as err:
                raise TerraInputError(f"{where}: {err}") from None
            if cond_label is None:
                left_out += 1
                continue
            sample = _sample(row, cond_label, num_points, where)
            if sample.sample_id in seen:
                raise TerraInputError(f"{where}: sample_id {sample.sample_id} again (first at "
                                      f"{seen[sample.sample_id]})")
            seen[sample.sample_id] = where
            samples.append(sample)
    if not samples:
        raise TerraInputError(f"no row of {', '.join(map(str, files))} has a label of ACT-Bench's nine classes "
                              f"({', '.join(LABELS)}); pass ACT-Bench's act_bench.jsonl")
    return samples, left_out


def _sample(row: dict, cond_label: str, num_points: int, where: str) -> BenchSample:
    sample_id = row.get("sample_id")
    if isinstance(sample_id, bool) or not isinstance(sample_id, int) or sample_id < 0:
        raise TerraInputError(f"{where}: sample_id must be a whole number of at least 0 (got {shown(sample_id)}); "
                              "videos are matched to it by the number at the end of their names")
    if "reference_traj" not in row:
        raise TerraInputError(f"{where}: sample {sample_id} has no reference_traj (the trajectory ADE and FDE "
                              "compare with); pass ACT-Bench's act_bench.jsonl")
    try:
        reference = reference_waypoints(row["reference_traj"], num_points)
    except ValueError as err:
        raise TerraInputError(f"{where}: sample {sample_id}: {err}") from None
    passed_on = {key: json.dumps(row.get(key), ensure_ascii=False) for key in PASSED_ON}
    return BenchSample(sample_id, cond_label, reference, passed_on)
