"""What a scoring run writes into its output folder, all or nothing."""

from __future__ import annotations

import io
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from terra.core.atomic import atomic_path, json_text, mark
from terra.scoring.labels import SHORT_NAMES, SUMMARY_ORDER
from terra.scoring.metrics import Metrics, row_normalized

FILES = ("summary.json", "results.jsonl", "confusion_matrix.png")
COLUMNS = ("sample_id", "context_frames", "cond_label", "cond_class", "instruction_trajs", "reference_traj",
           "reference_traj_transformed", "video_path", "estimated_class", "estimated_label", "estimated_traj",
           "ade", "fde")
NOT_AVAILABLE = "N/A"  # ACT-Bench's value for a class without samples


def summary(metrics: Metrics) -> dict:
    """``summary.json``'s content."""

    def per_class(values: dict[str, float | None]) -> dict[str, float | str]:
        return {label: NOT_AVAILABLE if value is None else value for label, value in values.items()}

    return {
        "number_of_samples": metrics.num_samples,
        "number_of_samples_per_action_class": {k: n for k, n in metrics.counts.items() if n > 0},
        "instruction_fidelity": {"recall": per_class(metrics.recall), "accuracy": metrics.accuracy},
        "action_fidelity": {
            "ADE_per_cond_class": per_class(metrics.ade_per_class),
            "ADE": metrics.ade,
            "FDE_per_cond_class": per_class(metrics.fde_per_class),
            "FDE": metrics.fde,
        },
    }


def result_line(fields: dict[str, str]) -> str:
    """One ``results.jsonl`` line from the JSON text of each of :data:`COLUMNS`."""
    return "{" + ", ".join(f"{json.dumps(name)}: {fields[name]}" for name in COLUMNS) + "}\n"


def confusion_png(metrics: Metrics) -> bytes:
    """The confusion matrix figure as PNG bytes (matplotlib's Agg canvas, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shares = np.round(row_normalized(metrics.confusion), 2)
    names = [SHORT_NAMES[label] for label in SUMMARY_ORDER]
    figure = Figure(figsize=(6, 5))
    axes = figure.add_subplot()
    image = axes.imshow(shares, cmap="Purples", vmin=0.0, vmax=1.0)
    figure.colorbar(image, ax=axes)
    for (row, column), share in np.ndenumerate(shares):
        axes.text(column, row, format(share, ".2g"), ha="center", va="center", fontsize=8.5,
                  color="white" if share > 0.5 else "black")
    axes.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=9)
    axes.set_yticks(range(len(names)), names, fontsize=9)
    axes.set_xlabel("Estimated Action", fontsize=12)
    axes.set_ylabel("Conditioned Action", fontsize=12)
    axes.set_title(f"N={metrics.num_samples:,}, Accuracy={metrics.accuracy * 100:.2f}%")
    figure.tight_layout()
    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return buffer.getvalue()


def write_report(output_dir: Path, metrics: Metrics, lines: Iterable[str]) -> list[Path]:
    """Write :data:`FILES` into ``output_dir``, renamed into place only once all three are complete."""
    png = confusion_png(metrics)
    paths = [output_dir / name for name in FILES]
    output_dir.mkdir(parents=True, exist_ok=True)
    mark(output_dir, FILES)
    with ExitStack() as stack:
        summary_tmp, results_tmp, png_tmp = (stack.enter_context(atomic_path(path)) for path in paths)
        summary_tmp.write_text(json_text(summary(metrics), indent=4) + "\n", encoding="utf-8")
        with results_tmp.open("w", encoding="utf-8") as fh:
            fh.writelines(lines)
        png_tmp.write_bytes(png)
    return paths


def text_summary(metrics: Metrics, left_out: int, unmatched_videos: int, paths: Sequence[Path], seconds: float) -> str:
    """One screen: accuracy, ADE and FDE overall and per class, what was left out, the files written."""
    def number(value: float | None, scale: float = 1.0, fmt: str = ".2f") -> str:
        return "-" if value is None else format(value * scale, fmt)

    lines = [f"ACT-Bench score of {metrics.num_samples} samples ({left_out} rows of other classes left out"
             f"{f', {unmatched_videos} videos of no scored sample' if unmatched_videos else ''}; {seconds:.0f} s)",
             f"instruction accuracy {metrics.accuracy * 100:.2f} %   ADE {metrics.ade:.4f} m   FDE {metrics.fde:.4f} m",
             f"{'class':<30} {'samples':>7} {'recall %':>9} {'ADE':>7} {'FDE':>7}"]
    for label in SUMMARY_ORDER:
        lines.append(f"{label:<30} {metrics.counts[label]:>7} {number(metrics.recall[label], 100):>9} "
                     f"{number(metrics.ade_per_class[label]):>7} {number(metrics.fde_per_class[label]):>7}")
    lines.append("wrote " + ", ".join(str(p) for p in paths))
    return "\n".join(lines)
