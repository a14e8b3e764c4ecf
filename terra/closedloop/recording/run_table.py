"""The short table a ``terra-drive`` run ends with: one row per world and policy."""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from terra.closedloop.outcomes.alpasim import scene_scores
from terra.stats import Bootstrap

HEADER = ("world", "policy", "drives", "scene score [95% CI]", "distance m", "in lane", "off road", "collided",
          "comfortable")
LEGEND = ("scene score: AlpaSim's, 0 .. 1 (0: a collision at fault, off road or a failed drive), mean over scenarios",
          "in lane: share of frames; off road, collided, comfortable (NAVSIM's history comfort): drives measured; "
          "-: none")


def _metric(content: Mapping, *path: str):
    """``content["metrics"][path...]``, or None where a drive lacks it."""
    value = content.get("metrics") or {}
    for key in path:
        if not isinstance(value, Mapping) or value.get(key) is None:
            return None
        value = value[key]
    return value


def _share(values: list) -> str:
    """``k/n``: how many of the measured drives were flagged; ``-`` when none was measured."""
    flags = [bool(v) for v in values if v is not None]
    return f"{sum(flags)}/{len(flags)}" if flags else "-"


def _mean(values: list, form: str) -> str:
    numbers = [float(v) for v in values if v is not None]
    return format(float(np.mean(numbers)), form) if numbers else "-"


def _interval(found: Mapping | None) -> str:
    if not found or found.get("estimate") is None:
        return "-"
    if found.get("low") is None or found["low"] == found["high"]:
        return f"{found['estimate']:.2f}"
    return f"{found['estimate']:.2f} [{found['low']:.2f}, {found['high']:.2f}]"


def policy_rows(world: str, drives: Iterable[Mapping], bootstrap: Bootstrap = Bootstrap()) -> list[tuple[str, ...]]:
    """The table's rows of one world: per policy (in the order the drives name them) of its drives' JSON contents."""
    contents = list(drives)
    scores = (scene_scores(contents, bootstrap) or {}).get("by_policy", {})
    rows = []
    for policy in dict.fromkeys(c["policy"] for c in contents):
        mine = [c for c in contents if c["policy"] == policy]
        ok = [c for c in mine if c.get("status") == "ok"]
        failed = len(mine) - len(ok)
        rows.append((
            world, policy, f"{len(ok)} ok" + (f", {failed} failed" if failed else ""),
            _interval(scores.get(policy)),
            _mean([_metric(c, "progress", "distance_m") for c in ok], ".1f"),
            _mean([_metric(c, "truth", "time_in_lane") for c in ok], ".0%"),
            _share([_metric(c, "truth", "off_road") for c in ok]),
            _share([_metric(c, "truth", "collision") for c in ok]),
            _share([_metric(c, "history_comfort", "comfortable") for c in ok]),
        ))
    return rows


def run_table(worlds: Mapping[str, Iterable[Mapping]], bootstrap: Bootstrap = Bootstrap()) -> list[str]:
    """The table's lines for each world's drives, and the legend; none when there is no drive."""
    rows = [row for world, drives in worlds.items() for row in policy_rows(world, drives, bootstrap)]
    if not rows:
        return []
    widths = [max(len(row[i]) for row in (HEADER, *rows)) for i in range(len(HEADER))]
    left = 2  # world and policy read left-aligned, the numbers right-aligned

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(HEADER), *(line(row) for row in rows), *LEGEND]
