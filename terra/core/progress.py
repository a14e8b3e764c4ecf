"""Progress as every run shows it, one rule for the apps and the Python API."""

from __future__ import annotations

import sys
from typing import Any, Iterable, Iterator, TypeVar

from tqdm import tqdm

T = TypeVar("T")

EVERY_S = 60.0  # a progress line at most this often (a run that ends sooner prints none)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (tqdm.auto draws its bars there as widgets)."""
    ipython = sys.modules.get("IPython")
    try:
        return type(ipython.get_ipython()).__name__ == "ZMQInteractiveShell"
    except AttributeError:  # IPython not imported, or not running
        return False


def shows_bars(progress: bool = True) -> bool:
    """Whether a run that asks for ``progress`` draws bars: only on a terminal (stderr) or in a notebook."""
    return bool(progress) and (sys.stderr.isatty() or in_notebook())


def prints_lines(progress: bool = True) -> bool:
    """Whether a run that asks for ``progress`` prints progress lines."""
    return bool(progress) and not in_notebook() and not (sys.stdout.isatty() and sys.stderr.isatty())


def announce(text: str, progress: bool = True) -> None:
    """A line of a run that asks for ``progress`` about what it is doing (its plan, a stage)."""
    if prints_lines(progress):
        print(text, flush=True)
    if shows_bars(progress):
        tqdm.write(text, file=sys.stderr)


def duration(seconds: float) -> str:
    """``seconds`` as ``1h 02m``, ``3m 05s`` or ``42s``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


class LogLines(tqdm):
    """tqdm's count as lines in a log (stdout): none before ``delay`` s, then one at most every ``mininterval`` s,
    and one as it ends."""

    def __init__(self, total: float | None, desc: str, unit: str, every_s: float) -> None:
        super().__init__(total=total, desc=desc, unit=unit, file=sys.stdout, mininterval=every_s, delay=every_s,
                         miniters=0)
        self._decr_instances(self)  # not a bar: tqdm.write and the bars never clear, redraw or make room for it

    def display(self, msg: str | None = None, pos: int | None = None) -> None:
        self.fp.write(line(self.desc, self.n, self.total, self.unit, self.format_dict["elapsed"]) + "\n")
        self.fp.flush()

    def close(self) -> None:
        if not self.disable and self.n != self.last_print_n and self.format_dict["elapsed"] >= self.delay:
            self.display()
        self.sp = None  # no bar to clear
        super().close()


def line(desc: str, n: float, total: float | None, unit: str, elapsed: float) -> str:
    """Done of total, the time so far and the time left at the rate so far."""
    done = f"{n:g}" if total is None else f"{n:g}/{total:g}"
    share = f" ({100 * n / total:.0f}%)" if total else ""
    left = ""
    if total and total / 20 <= n < total:  # a rate of the first few (a batch's start) misleads
        left = f", about {duration(elapsed * (total - n) / n)} left"
    elif total and n >= total:
        left = ", done"
    return f"{desc}: {done} {unit}s{share} in {duration(elapsed)}{left}"


class Progress:
    """A count of ``unit`` towards ``total``, named ``desc``: a bar on a terminal, lines in a log."""

    def __init__(self, total: float | None = None, desc: str = "", unit: str = "it", enabled: bool = True,
                 lines: bool = True, every_s: float | None = None, **bar_options: Any) -> None:
        from tqdm.auto import tqdm as auto_tqdm

        self.bar = auto_tqdm(total=total, desc=desc, unit=unit, disable=not shows_bars(enabled), **bar_options)
        every_s = EVERY_S if every_s is None else every_s
        self.lines = LogLines(total, desc, unit, every_s) if lines and prints_lines(enabled) else None

    @property
    def total(self) -> float | None:
        return self.bar.total

    def update(self, n: float = 1) -> None:
        self.bar.update(n)
        if self.lines is not None:
            self.lines.update(n)

    def counted(self, items: Iterable[T]) -> Iterator[T]:
        """``items`` one by one, each counted done when the next is asked for (or the items end)."""
        for item in items:
            yield item
            self.update(1)

    def set_total(self, total: float | None) -> None:
        """A new total (work that will not come any more is taken off)."""
        self.bar.total = total
        self.bar.refresh()
        if self.lines is not None:
            self.lines.total = total

    def set_postfix(self, values: dict, refresh: bool = False) -> None:
        self.bar.set_postfix(values, refresh=refresh)

    def close(self) -> None:
        """End the bar, with a last line where lines were printed."""
        self.bar.close()
        if self.lines is not None:
            self.lines.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
