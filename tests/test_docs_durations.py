"""One duration per claim: a command a page shows with its time in a comment (README.md and docs/, as
``.venv/bin/terra-X ...   # 2 min: ...``, the first time in the comment) is given the planning figure
benchmarks/durations.md has for that command, the one table the pages take their durations from."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATION = re.compile(r"(\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:s|min|h))\b")
COMMENTED = re.compile(r"^\s*\.venv/bin/(terra-[^#]*?)\s+# (.*)$")


def planned() -> dict[str, str]:
    """benchmarks/durations.md's rows: the command (its first code span, without the ``.venv/bin/``) → the first
    duration of the plan's column."""
    rows = {}
    for line in (ROOT / "benchmarks" / "durations.md").read_text().splitlines():
        row = re.match(r"\| `([^`]+)`[^|]*\| ([^|]+) \|", line)
        found = row and DURATION.match(row.group(2).strip())
        if found:
            rows[row.group(1)] = found.group(1)
    return rows


def shown() -> list[tuple[str, str, str]]:
    """(where, command, the first duration of its comment) of every commented command of README.md and docs/."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = COMMENTED.match(line)
            duration = match and DURATION.search(match.group(2))
            if duration:
                found.append((f"{path.relative_to(ROOT)}:{number}", " ".join(match.group(1).split()),
                              duration.group(1)))
    return found


def test_a_commands_time_on_every_page_is_the_tables():
    rows, claims = planned(), shown()
    checked = [(where, command, said, rows[command]) for where, command, said in claims if command in rows]
    assert len(checked) >= 5, claims  # README's first runs at least
    assert [c for c in checked if c[2] != c[3]] == [], "a page's time differs from benchmarks/durations.md"


def test_the_matcher_reads_a_time_and_a_differing_one_is_seen():
    """Control: a planted line is read, and its time told apart from the table's."""
    match = COMMENTED.match(".venv/bin/terra-drive num_steps=20       # 4 policies x 4 scenarios (~1.5 min, 2 cores)")
    assert match and match.group(1) == "terra-drive num_steps=20"
    assert DURATION.search(match.group(2)).group(1) == "1.5 min" != planned()["terra-drive num_steps=20"]
