"""Progress as every run shows it, one rule for the apps and the Python API."""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable, Iterator, TypeVar

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
        from tqdm.auto import tqdm

        tqdm.write(text, file=sys.stderr)


def duration(seconds: float) -> str:
    """``seconds`` as ``1h 02m``, ``3m 05s`` or ``42s``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


class Progress:
    """A count of ``unit`` towards ``total``, named ``desc``."""

    def __init__(self, total: float | None = None, desc: str = "", unit: str = "it", enabled: bool = True,
                 lines: bool = True, every_s: float | None = None, **bar_options: Any) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=not shows_bars(enabled), **bar_options)
        self.desc, self.unit = desc, unit
        self.every_s = EVERY_S if every_s is None else every_s
        self.lines = lines and prints_lines(enabled)
        self.total, self.n = total, 0.0
        self.started = self.last = time.monotonic()
        self.said: float | None = None  # the count of the last line printed

    def update(self, n: float = 1) -> None:
        """``n`` more done; a line when the last one is ``every_s`` old."""
        self.n += n
        self.bar.update(n)
        if self.lines and time.monotonic() - self.last >= self.every_s:
            self.say()

    def counted(self, items: Iterable[T]) -> Iterator[T]:
        """``items`` one by one, each counted done when the next is asked for (or the items end)."""
        for item in items:
            yield item
            self.update(1)

    def set_total(self, total: float | None) -> None:
        """A new total (work that will not come any more is taken off)."""
        self.total = self.bar.total = total
        self.bar.refresh()

    def set_postfix(self, values: dict, refresh: bool = False) -> None:
        self.bar.set_postfix(values, refresh=refresh)

    def line(self) -> str:
        """Done of total, the time so far and the time left at the rate so far."""
        elapsed = time.monotonic() - self.started
        done = f"{self.n:g}" if self.total is None else f"{self.n:g}/{self.total:g}"
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        left = ""
        if self.total and self.total / 20 <= self.n < self.total:  # a rate of the first few (a batch's start) misleads
            left = f", about {duration(elapsed * (self.total - self.n) / self.n)} left"
        elif self.total and self.n >= self.total:
            left = ", done"
        return f"{self.desc}: {done} {self.unit}s{share} in {duration(elapsed)}{left}"

    def say(self) -> None:
        """Print :meth:`line` now."""
        print(self.line(), flush=True)
        self.last, self.said = time.monotonic(), self.n

    def close(self) -> None:
        """End the bar, with a last line where lines were printed."""
        self.bar.close()
        long = self.said is not None or time.monotonic() - self.started >= self.every_s
        if self.lines and long and self.said != self.n:
            self.say()
        self.lines = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
