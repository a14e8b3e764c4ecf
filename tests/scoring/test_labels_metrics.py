"""Tables for ACT-Bench's label mapping and reference-trajectory transform (terra/scoring/labels.py), the
samples reader (terra/scoring/samples.py) and the metrics (terra/scoring/metrics.py), against hand values."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from terra.core.errors import TerraInputError
from terra.scoring.labels import LABELS, SUMMARY_ORDER, command_label, reference_waypoints
from terra.scoring.metrics import compute_metrics, confusion_counts, displacement_errors, row_normalized
from terra.scoring.samples import read_bench_samples


@pytest.mark.parametrize("label, expected", [
    ("curving_to_left/r20m", "curving_to_left"),
    ("curving_to_right/anything", "curving_to_right"),
    ("straight_constant_speed/0kmph", "straight_constant_low_speed"),
    ("straight_constant_speed/19kmph", "straight_constant_low_speed"),
    ("straight_constant_speed/20kmph", "straight_constant_low_speed"),  # the split: 20 is still low
    ("straight_constant_speed/21kmph", "straight_constant_high_speed"),
    ("straight_constant_speed/from_30_to_120kmph", "straight_constant_high_speed"),  # the number at the end
    ("straight_accelerating/2mps2", "straight_accelerating"),
    ("straight_decelerating/x", "straight_decelerating"),
    ("starting/x", "starting"),
    ("stopping/x", "stopping"),
    ("stopped/x", "stopped"),
    ("straight_constant_high_speed/x", "straight_constant_high_speed"),  # a class name as category is that class
    ("shifting_to_left/lane", None),  # not one of the nine: left out
    ("curving_to_left_sharply/x", None),
    ("Curving_to_left/x", None),
])
def test_labels_map_to_actbenchs_classes(label, expected):
    assert command_label(label) == expected


@pytest.mark.parametrize("label, reason", [
    ("curving_to_left", "is not 'category/subcategory'"),
    ("a/b/c", "is not 'category/subcategory'"),
    (None, "is not 'category/subcategory'"),
    (7, "is not 'category/subcategory'"),
    ("straight_constant_speed/fast", "has no speed"),
    ("straight_constant_speed/30kmph_then", "has no speed"),
])
def test_malformed_labels_say_why(label, reason):
    with pytest.raises(ValueError, match=reason):
        command_label(label)


def test_class_ids_and_summary_order_are_actbenchs():
    assert LABELS[2:4] == ("straight_constant_high_speed", "straight_constant_low_speed") and len(LABELS) == 9
    assert SUMMARY_ORDER[:4] == ("curving_to_left", "curving_to_right", "starting", "stopped")


@pytest.mark.parametrize("trajectory, num_points, expected", [
    ([[1.0, 2.0, 0.5], [3.0, -4.0, 0.0]], 2, [[-2.0, 1.0], [4.0, 3.0]]),  # (x, y, _) → (-y, x)
    ([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], 2, [[-2.0, 1.0], [-4.0, 3.0]]),  # the first num_points only
    ([[0, 0, 0, 9]], 1, [[0.0, 0.0]]),  # -0.0 == 0.0
])
def test_reference_trajectory_is_turned_into_the_estimators_frame(trajectory, num_points, expected):
    points = reference_waypoints(trajectory, num_points)
    assert points.dtype == np.float64 and points.tolist() == expected


@pytest.mark.parametrize("trajectory, reason", [
    ([[1.0, 2.0]], "has 1 points; scoring compares the first 2"),
    ([1.0, 2.0], "must be a list of [x, y, ...] points"),
    ([[1.0], [2.0]], "must be a list of [x, y, ...] points"),
    ([[1.0, 2.0], [3.0]], "must be a list of [x, y, ...] points"),
    ("path.json", "must be a list of [x, y, ...] points"),
    ([[1.0, 1e308 * 10], [0, 0]], "not finite"),
])
def test_bad_reference_trajectories_say_why(trajectory, reason):
    with pytest.raises(ValueError) as err:
        reference_waypoints(trajectory, 2)
    assert reason in str(err.value)


def rows_file(tmp_path, rows: list) -> list:
    path = tmp_path / "samples.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return [path]


def test_samples_left_out_and_carried(tmp_path):
    traj = [[float(i), 0.0, 0.0] for i in range(3)]
    files = rows_file(tmp_path, [
        {"sample_id": 5, "label": "straight_constant_speed/20kmph", "reference_traj": traj, "context_frames": ["a"]},
        "",
        {"sample_id": 6, "label": "shifting_to_right/x"},  # left out: needs nothing else
    ])
    [sample], left_out = read_bench_samples(files, 2)
    assert left_out == 1 and sample.sample_id == 5 and sample.cond_class == 3
    assert sample.reference.tolist() == [[-0.0, 0.0], [-0.0, 1.0]]
    assert sample.passed_on == {"context_frames": '["a"]', "instruction_trajs": "null",
                                "reference_traj": json.dumps(traj)}


@pytest.mark.parametrize("rows, reason", [
    ([{"sample_id": 1, "label": "starting/x"}], "line 1: sample 1 has no reference_traj"),
    ([{"sample_id": "1", "label": "starting/x", "reference_traj": [[0, 0]] * 2}], "sample_id must be a whole number"),
    ([{"sample_id": 1, "label": "starting"}], "line 1: label 'starting' is not"),
    ([{"sample_id": 1, "label": "starting/x", "reference_traj": [[0, 0]] * 2}] * 2, "line 2: sample_id 1 again"),
    (["[1, 2]"], "line 1: expected a JSON object"),
    (['{"sample_id": NaN}'], "line 1: NaN"),
    ([{"sample_id": 1, "label": "other/x"}], "no row of"),
])
def test_bad_rows_are_one_line_naming_the_line(tmp_path, rows, reason):
    with pytest.raises(TerraInputError) as err:
        read_bench_samples(rows_file(tmp_path, rows), 2)
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_displacement_errors_by_hand():
    reference = np.zeros((2, 3, 2))
    estimated = np.array([[[0, 0], [3, 4], [6, 8]], [[1, 0], [1, 0], [0, 2]]], dtype=np.float32)
    ade, fde = displacement_errors(estimated, reference)
    assert ade.tolist() == [5.0, pytest.approx(4 / 3)] and fde.tolist() == [10.0, 2.0]


def test_confusion_and_per_class_metrics():
    commanded = ["stopping", "stopping", "starting", "curving_to_left"]
    estimated = ["stopping", "starting", "starting", "stopped"]
    counts = confusion_counts(commanded, estimated)
    index = SUMMARY_ORDER.index
    assert counts.sum() == 4 and counts[index("stopping"), index("starting")] == 1
    assert counts[index("curving_to_left"), index("stopped")] == 1
    shares = row_normalized(counts)
    assert shares[index("stopping")].tolist()[index("stopping")] == 0.5 and shares[index("stopped")].sum() == 0
    metrics = compute_metrics(commanded, estimated, np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 6.0, 8.0]))
    assert metrics.accuracy == 0.5 and metrics.num_samples == 4
    assert metrics.recall["stopping"] == 0.5 and metrics.recall["curving_to_left"] == 0.0
    assert metrics.recall["stopped"] is None and metrics.ade_per_class["stopped"] is None
    assert metrics.ade == 2.5 and metrics.fde == 5.0 and metrics.ade_per_class["stopping"] == 1.5
    assert metrics.counts == {label: commanded.count(label) for label in SUMMARY_ORDER}
    assert math.isclose(metrics.fde_per_class["starting"], 6.0)
