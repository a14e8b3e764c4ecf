"""What the command lines of scripts/bench/ and scripts/experiments/ share: a parser whose bad input is one line and
exit 2, number ranges, input paths found from any folder, outputs checked before the work, comma lists of numbers,
N client threads timed together."""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, NoReturn, Sequence, TypeVar

from terra.core.errors import TerraInputError

T = TypeVar("T")
CHECKOUT = Path(__file__).resolve().parents[3]  # the repository root: scripts/bench/lib/cli.py


class Parser(argparse.ArgumentParser):
    """An argument parser whose bad input is one line ``<prog>: error: ...`` on stderr and exit 2, without the usage
    block (``--help`` still prints it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def in_range(kind: Callable[[str], T], low: float | None = None, high: float | None = None, *,
             above: bool = False) -> Callable[[str], T]:
    """An argparse ``type``: a finite ``kind`` (``int`` or ``float``) of at least ``low`` (more than it, ``above``)
    and at most ``high``; NaN, infinities and values outside are one line naming the range."""
    noun = "a whole number" if kind is int else "a number"
    if low is not None and high is not None and not above:
        wanted = f"{noun} from {low:g} to {high:g}"
    else:
        bounds = [f"{'more than' if above else 'at least'} {low:g}" if low is not None else "",
                  f"at most {high:g}" if high is not None else ""]
        wanted = f"{noun} {' and '.join(b for b in bounds if b)}".strip()

    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or (high is not None and value > high) or (
                low is not None and (value <= low if above else value < low)):
            raise argparse.ArgumentTypeError(f"takes {wanted} (got {text!r})")
        return value

    parse.__name__ = wanted  # argparse names a type by it
    return parse


def existing(what: str = "folder", holding: str | None = None) -> Callable[[str], Path]:
    """An argparse ``type``: a ``what`` ("folder" or "file") as given, else relative to the checkout, so the paths the
    docs give from the repository root work from any folder; ``holding``: a file the folder must contain (a
    checkpoint's ``config.json``)."""

    def parse(text: str) -> Path:
        for path in (Path(text).expanduser(), CHECKOUT / text):
            if (path.is_dir() if what == "folder" else path.is_file()) and (
                    holding is None or (path / holding).is_file()):
                return path
        extra = f" with a {holding}" if holding else ""
        raise argparse.ArgumentTypeError(f"{text} is no {what}{extra} (here or in the checkout {CHECKOUT})")

    parse.__name__ = what
    return parse


def check_output(path: Path, flag: str, inputs: Iterable[Path] = ()) -> Path:
    """``path``, a file to write, checked before any work: its folder exists and is writable, it is not a folder, and
    it is none of ``inputs`` nor inside an input folder; otherwise one line naming ``flag``."""
    folder = path.resolve().parent
    if not folder.is_dir():
        raise TerraInputError(f"{flag} {path}: the folder {folder} does not exist; create it or choose another")
    if path.is_dir():
        raise TerraInputError(f"{flag} {path} is a folder; give a file name in it")
    if not os.access(folder, os.W_OK):
        raise TerraInputError(f"{flag} {path}: the folder {folder} is not writable; choose another")
    target = path.resolve()
    for source in inputs:
        source = Path(source).resolve()
        if target == source or source in target.parents:
            raise TerraInputError(f"{flag} {path} would overwrite the input {source}; choose another file")
    return path


def numbers(text: str, kind: Callable[[str], T], flag: str) -> list[T]:
    """``"1,2,4"`` as ``[1, 2, 4]`` (``kind`` per item; an empty text is no items); one line naming ``flag``
    for anything else."""
    try:
        return [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        noun = {int: "whole numbers", float: "numbers"}.get(kind, "values")
        raise TerraInputError(f"{flag} takes a comma list of {noun}, e.g. 1,4,16 (got {text!r})") from None


def exit_2_on_input_error(name: str) -> Callable[[Callable[..., object]], Callable[..., int]]:
    """A script's ``main(argv)`` whose bad input (:class:`TerraInputError`) is one line ``<name>: error: ...`` on
    stderr and exit code 2; any other result is its exit code when whole, else 0."""

    def wrap(main: Callable[..., object]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(argv: Sequence[str] | None = None) -> int:
            try:
                result = main(argv)
            except TerraInputError as err:
                print(f"{name}: error: {err}", file=sys.stderr)
                return 2
            return result if isinstance(result, int) else 0

        return run

    return wrap


def run_threads(count: int, work: Callable[[int], None]) -> float:
    """``work(i)`` for ``i`` in ``range(count)``, each on its own thread, all at once; the wall time in seconds.
    The first error a thread raised is raised here once all have ended."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            work(i)
        except BaseException as err:  # noqa: BLE001  (raised in the caller's thread)
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    begin = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - begin
    if errors:
        raise errors[0]
    return wall
