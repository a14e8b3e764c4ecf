"""The JSON sidecar written next to a video: run config, seed, trajectory/actions and timings."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf

from terra.core.atomic import json_text
from terra.decoder.writers import atomic_output


def to_jsonable(value: Any) -> Any:
    """Arrays, tensors, paths, dataclasses and OmegaConf configs → plain JSON values."""
    if isinstance(value, (DictConfig, ListConfig)):
        return to_jsonable(OmegaConf.to_container(value, resolve=True))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def write_sidecar(path: str | os.PathLike, config: Any = None, seed: int | None = None, actions: Any = None,
                  trajectory: Any = None, timings: dict[str, float] | None = None, **extra: Any) -> Path:
    """Write ``path`` (JSON, atomically) describing one run; ``extra`` adds further fields."""
    record = {"created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "seed": seed,
              "config": config, "actions": actions, "trajectory": trajectory, "timings_s": timings, **extra}
    text = json_text(to_jsonable(record), indent=2) + "\n"
    with atomic_output(path) as tmp:  # a full disk: one error line naming the file
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
