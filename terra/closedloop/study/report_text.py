"""The fidelity report as people read it: a sentence per world first, then the run, a legend, the tables.

terra/closedloop/study/report.py gathers the verdicts (terra/closedloop/study/verdict.py), the per-policy outcomes and
the exploitability study; this module writes them. ``fidelity.md`` holds everything (:func:`full_report`); the terminal
gets the headline, the run and a compact table of the worlds (:func:`terminal_report`). Every ``n/a`` and every
undecided statistic carries its reason; a world whose statistics cannot be decided is said to be too small to judge.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from terra.closedloop.study.verdict import (
    FLAGGED, MIN_SCENARIOS, OUTCOMES, PASSED, RANK_METRIC, STATISTICS, TOO_FEW, WorldVerdict,
)
from terra.stats import FAIL, INCONCLUSIVE, PASS, Interval

PROBE_REWARD = ("scene_score", "time_in_lane", "progress_along_road_m")  # a probe's outcomes compared world - truth
MARKS = {PASS: "pass", FAIL: "**fail**", INCONCLUSIVE: "?", TOO_FEW: "too few"}


def shown(value: Interval | None) -> str:
    """An interval as the tables write it: ``estimate [low, high]``, ``n/a`` without an estimate."""
    return "n/a" if value is None or not np.isfinite(value.estimate) else str(value)


def _statistic(name: str):
    return next(s for s in STATISTICS if s.name == name)


def _value(verdict: WorldVerdict, name: str) -> str:
    band = _statistic(name).band
    return f"{name} {shown(verdict.values[name])}, band [{band[0]:g}, {band[1]:g}]"


def _margin(verdict: WorldVerdict, name: str) -> float:
    """How far inside its band a passing statistic's interval lies (m or its unit; the smaller the closer)."""
    low, high = _statistic(name).band
    value = verdict.values[name]
    return min(value.low - low, high - value.high)


def headline(verdict: WorldVerdict) -> str:
    """One sentence: is the world a simulator of the synthetic world, and which statistic decided it."""
    if verdict.state == FLAGGED:
        first, *rest = verdict.flagged_by
        more = f" (and {len(rest)} more: {', '.join(rest)})" if rest else ""
        return f"**{verdict.world}** is not a simulator of the synthetic world: {_value(verdict, first)} fails{more}."
    if verdict.state == PASSED:
        closest = min(verdict.decisions, key=lambda name: _margin(verdict, name))
        return (f"**{verdict.world}** passes as a simulator of the synthetic world, every one of {len(STATISTICS)} "
                f"statistics decided inside its band (the closest to an edge: {_value(verdict, closest)}).")
    undecided = ", ".join(f"{name} ({verdict.reasons.get(name, 'interval straddles the band')})"
                          for name in verdict.undecided)
    small = "the study is too small to judge it; " if verdict.too_small else ""
    return (f"**{verdict.world}** is undecided: nothing fails, but {small}{len(verdict.undecided)} statistic"
            f"{'s' * (len(verdict.undecided) != 1)} undecided: {undecided}.")


def run_lines(settings: dict) -> list[str]:
    """The run's settings as a list."""
    return [f"- {key}: {value}" for key, value in settings.items()]


def legend() -> list[str]:
    """Every judged statistic: its band, what it rests on and what it shows; then how decisions are made."""
    lines = ["| statistic | band | rests on | what it shows |", "|---|---|---|---|"]
    lines += [f"| {s.name} | [{s.band[0]:g}, {s.band[1]:g}] | {s.rests_on} | {s.meaning} |" for s in STATISTICS]
    lines += ["", "Each interval is a 95 % cluster bootstrap over scenarios, widened for their number (Student's t "
                  "over the scenarios); **pass**: inside the band, **fail**: entirely outside, **?**: it straddles an "
                  f"edge or has no value (reason below), **too few**: fewer than {MIN_SCENARIOS} scenarios, not "
                  "decided. A world is flagged when a statistic fails, passed when every one passes, undecided "
                  f"otherwise. The ranking is by each policy's mean {RANK_METRIC}."]
    return lines


def verdict_table(verdicts: Sequence[WorldVerdict]) -> str:
    """Markdown: a row per statistic (its band), a column per world: the estimate, its interval and the decision;
    each world's state, the reasons of its undecided statistics, the policies its outcome statistics rest on and its
    ranking; then the measurements and the paired differences, a row each."""
    worlds = " | ".join(v.world for v in verdicts)
    lines = [f"| statistic | band | {worlds} |", "|---|---|" + "---|" * len(verdicts)]
    for s in STATISTICS:
        cells = [f"{shown(v.values[s.name])} {MARKS[v.decisions[s.name]]}" for v in verdicts]
        lines.append(f"| {s.name} | [{s.band[0]:g}, {s.band[1]:g}] | " + " | ".join(cells) + " |")
    lines.append("")
    for v in verdicts:
        failed = f" by {', '.join(v.flagged_by)}" if v.flagged_by else ""
        lines.append(f"- **{v.world}** ({v.drives} drives): {v.state}{failed}; undecided: "
                     f"{', '.join(v.undecided) or 'none'}")
        lines += [f"  - {name}: {'n/a' if not np.isfinite(v.values[name].estimate) else MARKS[v.decisions[name]]}"
                  f" because {reason}" for name, reason in v.reasons.items()]
        lines.append(f"  - outcome statistics ({OUTCOMES}) rest on: {', '.join(v.policies) or 'no policy'}")
        if v.ranking is not None:
            order = ", ".join(f"{p} {w:.3f} / {t:.3f}" for p, w, t in zip(v.ranking.policies, v.ranking.world,
                                                                         v.ranking.truth))
            ties = v.ranking.ties
            tied = (f"; {len(ties)} pair{'s' * (len(ties) != 1)} tie in truth: "
                    + ", ".join(f"{a} = {b}" for a, b in ties)) if ties else "; no two policies tie in truth"
            lines.append(f"  - ranking by {RANK_METRIC} (world / truth): {order}{tied}")
    for title, table in (("measured (not judged)", "measured"), ("world - truth, paired drives", "differences")):
        names = list(dict.fromkeys(name for v in verdicts for name in getattr(v, table)))
        lines += ["", f"| {title} | {worlds} |", "|---|" + "---|" * len(verdicts)]
        lines += [f"| {name} | " + " | ".join(shown(getattr(v, table).get(name)) for v in verdicts) + " |"
                  for name in names]
    return "\n".join(lines) + "\n"


def compact_table(verdicts: Sequence[WorldVerdict]) -> str:
    """Markdown for the terminal: a row per world, its state, the statistic that decided it and what stayed
    undecided."""
    lines = ["| world | drives | state | failed | undecided |", "|---|---:|---|---|---|"]
    for v in verdicts:
        failed = ", ".join(f"{n} {shown(v.values[n])}" for n in v.flagged_by) or "-"
        lines.append(f"| {v.world} | {v.drives} | {v.state} | {failed} | {', '.join(v.undecided) or '-'} |")
    return "\n".join(lines) + "\n"


def probe_line(policy: str, difference: dict[str, Interval | None]) -> str:
    """Whether the world rewards a probe policy (``brake_hard``) more than the truth does, by its paired outcome
    differences world - truth (:data:`PROBE_REWARD`)."""
    parts = []
    for key in PROBE_REWARD:
        value = difference.get(key)
        if value is None or not np.isfinite(value.estimate):
            parts.append(f"{key} n/a")
            continue
        verdict = "more" if value.low > 0 else "less" if value.high < 0 else "as much (the interval holds 0)"
        parts.append(f"{key} {shown(value)}: {verdict}")
    score = difference.get("scene_score")
    rewarded = score is not None and np.isfinite(score.low) and score.low > 0
    head = "rewards it more than the truth does" if rewarded else "does not reward it more than the truth does"
    return f"- probe **{policy}** (model - truth, paired drives): the model {head}; " + "; ".join(parts)


def separation_lines(separations: dict[str, list[str]]) -> list[str]:
    return [f"- the model told from **{control}** by: {', '.join(names) if names else 'no statistic'}"
            for control, names in separations.items()]
