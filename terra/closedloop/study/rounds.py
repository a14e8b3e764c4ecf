"""``until=decided``: a fidelity study in rounds of more scenarios until every statistic is decided."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from terra.closedloop.recording.drives import DriveOutcome
from terra.closedloop.study.report import scenarios_to_decide
from terra.closedloop.study.verdict import MIN_SCENARIOS, TOO_FEW
from terra.stats import INCONCLUSIVE, Interval

if TYPE_CHECKING:
    from terra.closedloop.study.settings import StudySettings

REPORT_JSON = "fidelity.json"


@dataclass(frozen=True)
class Until:
    """``until=decided``'s budget and how to size the study."""

    minutes: float | None
    scenarios: int
    resize: Callable[[int, bool], "StudySettings"]


def open_statistics(report: dict) -> dict[str, float]:
    """The model's undecided statistics that more scenarios could decide, each with about how many would."""
    model = report["verdicts"][0]
    needed = {}
    for name, found in model["statistics"].items():
        if found["decision"] == TOO_FEW:
            needed[name] = float(MIN_SCENARIOS)
        elif found["decision"] == INCONCLUSIVE and found["reason"] is None:
            value = Interval(*(math.nan if found[k] is None else found[k] for k in ("estimate", "low", "high")),
                             found["level"])
            needed[name] = scenarios_to_decide(name, value, found["scenarios"])
    return needed


def next_size(scenarios: int, needed: float, until: Until, elapsed_s: float) -> int:
    """The next round's scenarios."""
    size = min(until.scenarios, max(2 * scenarios, math.ceil(needed) if math.isfinite(needed) else until.scenarios))
    if until.minutes is not None:
        per_scenario = elapsed_s / scenarios
        size = min(size, scenarios + int((60 * until.minutes - elapsed_s) / per_scenario))
    return max(size, scenarios)


def left_line(needed: dict[str, float], scenarios: int, seconds_a_scenario: float) -> str:
    """What the budget left undecided and what deciding it would cost at the rounds' rate."""
    parts = []
    for name, count in needed.items():
        if math.isfinite(count):
            more = max(0, math.ceil(count) - scenarios)
            parts.append(f"{name} (about {math.ceil(count)} scenarios if the estimate held: {more} more, about "
                         f"{more * seconds_a_scenario / 60:.0f} min at this study's rate)")
        else:
            parts.append(f"{name} (its estimate sits on a band's edge: more scenarios narrow it but may not decide it)")
    return f"terra-drive: until=decided: the budget left undecided: {'; '.join(parts)}"


def drive_until_decided(until: Until, first: int, exploitability: bool,
                        study: Callable[["StudySettings"], DriveOutcome]) -> DriveOutcome:
    """The study of ``first`` scenarios, then rounds of more until every decidable statistic is decided or ``until``."""
    started, scenarios, lines = time.monotonic(), first, []
    while True:
        settings = until.resize(scenarios, False)
        outcome = study(settings)
        if outcome.exit_code:
            return DriveOutcome(lines + outcome.lines, outcome.exit_code)
        needed = open_statistics(json.loads((settings.folders.top.path / REPORT_JSON).read_text()))
        elapsed = time.monotonic() - started
        lines.append(f"terra-drive: until=decided: {scenarios} scenarios, {elapsed / 60:.1f} min so far: "
                     + (f"undecided {', '.join(needed)}" if needed else "every statistic decided"))
        size = next_size(scenarios, max(needed.values(), default=0.0), until, elapsed) if needed else scenarios
        if size == scenarios:
            break
        scenarios = size
    if exploitability:
        outcome = study(until.resize(scenarios, True))  # every drive made: the exploitability study and the report
    tail = [left_line(needed, scenarios, elapsed / scenarios)] if needed else []
    return DriveOutcome(lines + outcome.lines + tail, outcome.exit_code)
