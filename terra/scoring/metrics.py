"""ACT-Bench's metrics (``act_bench/metrics.py``, ``act_bench/compute_score.py``), in numpy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from terra.scoring.labels import SUMMARY_ORDER


def displacement_errors(estimated: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ADE and FDE of each sample: ``[N]`` each, for trajectories ``[N, T, 2]``."""
    distances = np.sqrt(((np.asarray(estimated, np.float64) - reference) ** 2).sum(axis=-1))
    return distances.mean(axis=1), distances[:, -1]


def confusion_counts(commanded: Sequence[str], estimated: Sequence[str]) -> np.ndarray:
    """Counts ``[9, 9]``: row = commanded class, column = estimated class, both in ``SUMMARY_ORDER``."""
    index = {label: i for i, label in enumerate(SUMMARY_ORDER)}
    counts = np.zeros((len(SUMMARY_ORDER), len(SUMMARY_ORDER)), dtype=np.int64)
    np.add.at(counts, ([index[c] for c in commanded], [index[e] for e in estimated]), 1)
    return counts


def row_normalized(counts: np.ndarray) -> np.ndarray:
    """Each row divided by its sum (rows without samples stay 0)."""
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros(counts.shape), where=totals > 0)


@dataclass(frozen=True)
class Metrics:
    """The score of a run."""

    num_samples: int
    counts: dict[str, int]
    accuracy: float
    recall: dict[str, float | None]
    ade: float
    fde: float
    ade_per_class: dict[str, float | None]
    fde_per_class: dict[str, float | None]
    confusion: np.ndarray  # counts [9, 9]


def compute_metrics(commanded: Sequence[str], estimated: Sequence[str], ade: np.ndarray, fde: np.ndarray) -> Metrics:
    """:class:`Metrics` of samples given their commanded and estimated labels and their ADE and FDE."""
    commanded, estimated = np.asarray(commanded), np.asarray(estimated)
    correct = commanded == estimated
    members = {label: commanded == label for label in SUMMARY_ORDER}

    def per_class(values: np.ndarray) -> dict[str, float | None]:
        return {label: float(values[rows].mean()) if rows.any() else None for label, rows in members.items()}

    return Metrics(len(commanded), {label: int(rows.sum()) for label, rows in members.items()}, float(correct.mean()),
                   per_class(correct), float(ade.mean()), float(fde.mean()), per_class(ade), per_class(fde),
                   confusion_counts(list(commanded), list(estimated)))
