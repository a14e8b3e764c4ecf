"""What the benchmark scripts' command lines share: comma lists of numbers, exit 2 with one line for bad input,
N client threads timed together."""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Callable, Sequence, TypeVar

from terra.core.errors import TerraInputError

T = TypeVar("T")


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
