"""What a run reports as it goes (main process only): ``train_log.jsonl``, TensorBoard, a bar, a line per row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from terra.core.atomic import json_text, write_text
from terra.core.progress import shows_bars
from terra.training.settings import LOG_FILE, TENSORBOARD_DIR


class RunLog:
    def __init__(self, out: Path, start_step: int, max_steps: int, tensorboard: bool, progress: bool) -> None:
        self.path = out / LOG_FILE
        _drop_rows_after(self.path, start_step)
        self.file = self.path.open("a")
        self.board = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(str(out / TENSORBOARD_DIR), purge_step=start_step + 1)
        self.max_steps = max_steps
        self.bar = tqdm(total=max_steps, initial=start_step, unit="step", desc="training",
                        disable=not shows_bars(progress), dynamic_ncols=True)  # in a log: the rows' lines alone

    def write(self, row: dict[str, Any]) -> None:
        """Add one row (a dict with ``step``) to the log and to TensorBoard, and print it (``step=N/max_steps``)."""
        self.file.write(json_text(row) + "\n")
        self.file.flush()
        if self.board is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.board.add_scalar(f"train/{key}" if not key.startswith("val_") else f"val/{key[4:]}",
                                          value, row["step"])
            self.board.flush()
        if "loss" in row:
            self.bar.set_postfix_str(f"loss {row['loss']:.3f}, {row['tokens_per_s']:,.0f} tok/s", refresh=False)
        shown = {**row, "step": f"{row['step']}/{self.max_steps}"}
        tqdm.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()))

    def close(self) -> None:
        self.bar.close()
        self.file.close()
        if self.board is not None:
            self.board.close()


def _drop_rows_after(path: Path, step: int) -> None:
    """Drop log rows written after the checkpoint a run resumes from; a run from step 0 starts its log anew."""
    if not path.is_file():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in rows if json.loads(line)["step"] <= step] if step > 0 else []
    if len(kept) < len(rows):
        write_text(path, "".join(line + "\n" for line in kept))
