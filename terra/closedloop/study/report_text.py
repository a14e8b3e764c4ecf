"""The fidelity report as people read it: a sentence per world first, then the run, a legend, the tables."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from terra.closedloop.study.horizons import PARTS, WorldHorizon
from terra.closedloop.study.statistics import OUTCOMES, RANK_METRIC, STATISTICS, statistic
from terra.closedloop.study.verdict import FLAGGED, MIN_SCENARIOS, PASSED, TOO_FEW, WorldVerdict
from terra.fidelity.horizon import horizon_text, shown_seconds
from terra.stats import FAIL, INCONCLUSIVE, PASS, Interval

PROBE_REWARD = ("scene_score", "time_in_lane", "progress_along_road_m")  # a probe's outcomes compared world - truth
MARKS = {PASS: "pass", FAIL: "**fail**", INCONCLUSIVE: "?", TOO_FEW: "too few"}
MOST_SCENARIOS = 100  # a statistic that would need more to decide is said to sit near its band's edge
GPU_PRESET = "study=gpu (16 scenarios x 20 s on a GPU)"
GPU_PRESET_SIZE = (16, 200)  # its scenarios and steps: a study as large is not told to run it


def shown(value: Interval | None) -> str:
    """An interval as the tables write it: ``estimate [low, high]``, ``n/a`` without an estimate."""
    return "n/a" if value is None or not np.isfinite(value.estimate) else str(value)


def plain(text: str) -> str:
    """Markdown's bold marks taken out: the terminal's text."""
    return text.replace("**", "")


def _value(verdict: WorldVerdict, name: str) -> str:
    band = statistic(name).band
    return f"{name} {shown(verdict.values[name])}, band [{band[0]:g}, {band[1]:g}]"


def _margin(verdict: WorldVerdict, name: str) -> float:
    """How far inside its band a passing statistic's interval lies (m or its unit; the smaller the closer)."""
    low, high = statistic(name).band
    value = verdict.values[name]
    return min(value.low - low, high - value.high)


def horizon_sentence(world: str, horizon: WorldHorizon | None) -> str:
    """How long the world stays a simulator: its closed-loop median horizon with its interval and 10th percentile."""
    found = None if horizon is None else horizon.closed_loop
    if found is None:
        return ""
    median, p10, longest = found.median, found.p10, found.longest_s
    if not np.isfinite(median.estimate):
        return (f"**{world}** stays a simulator for a median of at least its drives' {longest:g} s ({found.departed} "
                f"of {found.drives} drives' roads departed from the truth's; 10th percentile "
                f"{shown_seconds(p10.estimate, longest)}). ")
    bounds = ", ".join(shown_seconds(v, longest) for v in (median.low, median.high))
    return (f"**{world}** stays a simulator for a median of {median.estimate:.1f} s [{bounds}] (10th percentile "
            f"{shown_seconds(p10.estimate, longest)}; {found.departed} of {found.drives} drives departed). ")


def scenarios_to_decide(name: str, value: Interval, scenarios: int) -> float:
    """About how many scenarios would decide statistic ``name`` of interval ``value`` if its estimate held."""
    low, high = statistic(name).band
    if not (np.isfinite(value.low) and np.isfinite(value.high)):
        return float("inf")
    edge = min((low, high), key=lambda e: abs(value.estimate - e))
    distance = abs(value.estimate - edge)
    width = value.estimate - value.low if edge < value.estimate else value.high - value.estimate
    return float("inf") if distance <= 0 else scenarios * (width / distance) ** 2


def next_step(verdict: WorldVerdict) -> str:
    """What would decide an undecided world."""
    straddling = [name for name in verdict.undecided if verdict.decisions[name] == INCONCLUSIVE
                  and name not in verdict.reasons]
    needs = {name: scenarios_to_decide(name, verdict.values[name], verdict.scenarios[name]) for name in straddling}
    finite = {name: n for name, n in needs.items() if n <= MOST_SCENARIOS}
    parts = []
    if verdict.too_few is not None:
        parts.append(f"num_scenarios={MIN_SCENARIOS} or more (every statistic needs {MIN_SCENARIOS} scenarios)")
    if finite:
        most = max(finite, key=finite.get)
        parts.append(f"about num_scenarios={int(np.ceil(finite[most]))} if the estimates held (the widest: {most})")
    edge = [name for name in needs if name not in finite]
    if edge:
        parts.append(f"{', '.join(edge)} sit{'s' * (len(edge) == 1)} near a band's edge (more than "
                     f"{MOST_SCENARIOS} scenarios): more narrow the interval but may not decide it")
    if any("23 steps" in reason for reason in verdict.reasons.values()):
        parts.append("num_steps=23 or more for the lag")
    if max(verdict.scenarios.values(), default=0) < GPU_PRESET_SIZE[0] or verdict.steps < GPU_PRESET_SIZE[1]:
        parts.append(f"or {GPU_PRESET}, which decides what short drives cannot"
                     + (" (the demo world models' verdicts over 20 s: docs/fidelity.md, \"The demo model's verdict\")"
                        if verdict.world == "model" else ""))
    return f" To decide it: {'; '.join(parts)}." if parts else ""


def verdict_sentence(verdict: WorldVerdict) -> str:
    """Is the world a simulator of the synthetic world over its whole drives, and which statistic decided it."""
    if verdict.state == FLAGGED:
        first, *rest = verdict.flagged_by
        more = f" (and {len(rest)} more: {', '.join(rest)})" if rest else ""
        return f"**{verdict.world}** is not a simulator of the synthetic world: {_value(verdict, first)} fails{more}."
    if verdict.state == PASSED:
        closest = min(verdict.decisions, key=lambda name: _margin(verdict, name))
        return (f"**{verdict.world}** passes as a simulator of the synthetic world, every one of "
                f"{len(verdict.decisions)} statistics decided inside its band (the closest to an edge: "
                f"{_value(verdict, closest)}).")
    others = [name for name in verdict.undecided if verdict.decisions[name] != TOO_FEW]
    listed = ", ".join(f"{name} ({verdict.reasons.get(name, 'interval straddles the band')})" for name in others)
    few = verdict.too_few
    small = (f"the study is too small to judge it ({few} scenario{'s' * (few != 1)}, fewer than {MIN_SCENARIOS})"
             if few is not None else "the study is too small to judge it" if verdict.too_small else "")
    undecided = f"{len(others)} statistic{'s' * (len(others) != 1)} undecided: {listed}" if others else ""
    return (f"**{verdict.world}** is undecided: nothing fails, but {'; '.join(p for p in (small, undecided) if p)}."
            + next_step(verdict))


def headline(verdict: WorldVerdict) -> str:
    """A world's sentences: how long it stays a simulator, then its verdict over the whole drives."""
    return horizon_sentence(verdict.world, verdict.horizon) + verdict_sentence(verdict)


def within_line(verdict: WorldVerdict) -> str | None:
    """The verdict within the world's horizon, when one was judged."""
    if verdict.within is None:
        return None
    inner = verdict_sentence(verdict.within).replace(f"**{verdict.world}**", f"**{verdict.world}** within its "
                                                     f"first {verdict.within_s:.1f} s")
    return f"  - {inner}"


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
                  f"otherwise. The ranking is by each policy's mean {RANK_METRIC}. A world's frames are compared "
                  "with the true frames at the same poses, for a world model the true frames through its tokenizer "
                  "(what a perfect model of that tokenizer shows). The fidelity horizon is the time "
                  "a drive's road departs from the truth's (the lane 10 m ahead 0.5 m off, or the forward motion "
                  "half off, for 0.5 s): its median and 10th percentile over drives (Kaplan-Meier, censored at the "
                  "drive's end) with intervals over scenarios."]
    return lines


def horizon_table(verdicts: Sequence[WorldVerdict]) -> list[str]:
    """Markdown."""
    lines = ["| world | drives | horizon | surviving at 1 / 2 / 5 / 10 / 20 s |", "|---|---|---|---|"]
    for v in verdicts:
        for name, found in ({} if v.horizon is None else v.horizon.parts()).items():
            surviving = " / ".join(f"{found.curve[int(round(t * 10)) - 1]:.2f}" if t * 10 <= len(found.curve) else "-"
                                   for t in (1, 2, 5, 10, 20))
            lines.append(f"| {v.world} | {PARTS[name]} | {horizon_text(found)} | {surviving} |")
    return lines


def verdict_table(verdicts: Sequence[WorldVerdict]) -> str:
    """Markdown: a row per statistic (its band), a column per world: the estimate, its interval and the decision."""
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


def world_rows(verdicts: Sequence[WorldVerdict]) -> list[list[str]]:
    """A row per world: its drives, its closed-loop median horizon, its state, what failed, what stayed undecided."""
    rows = [["world", "drives", "horizon", "state", "failed", "undecided"]]
    for v in verdicts:
        found = None if v.horizon is None else v.horizon.closed_loop
        horizon = "-" if found is None else shown_seconds(found.median.estimate, found.longest_s)
        rows.append([v.world, str(v.drives), horizon, v.state, _names(v.flagged_by), _names(v.undecided)])
    return rows


def _names(names: Sequence[str], most: int = 2) -> str:
    """A table cell of statistics' names: the first ``most``, then how many more."""
    return ", ".join(names[:most]) + (f" (+{len(names) - most})" if len(names) > most else "") if names else "-"


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows as plain text, each column padded to its widest cell."""
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def probe_line(policy: str, difference: dict[str, Interval | None]) -> str:
    """Whether the world rewards probe policy ``brake_hard`` more than the truth does."""
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


def separation_lines(separations: dict[str, list[str]], verdicts: Sequence[WorldVerdict]) -> list[str]:
    """Per control, the statistics that pass the model and fail the control; where there is none, why."""
    by_world = {v.world: v for v in verdicts}
    lines = []
    for control, names in separations.items():
        if names:
            lines.append(f"- the model told from **{control}** by: {', '.join(names)}")
            continue
        failed = by_world[control].flagged_by
        why = (f"{control} fails {', '.join(failed)}, which the model fails or leaves undecided too" if failed else
               f"{control} fails none")
        lines.append(f"- the model told from **{control}** by: no statistic (none passes the model and fails "
                     f"{control}: {why})")
    return lines
