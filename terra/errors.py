"""Typed errors for user mistakes.

Every entry point (CLI, scripts, Python API) raises :class:`TerraInputError` for bad input: its message is
one line that names the offending input and says how to fix it. The CLI prints that line and exits with
code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import numbers
from typing import Any


class TerraInputError(ValueError):
    """Bad user input (file, array, config value); ``str(err)`` is one line naming the input and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def check_whole_number(value: Any, name: str, minimum: int, example: str) -> int:
    """``value`` as an ``int`` if it is a whole number (not a bool) of at least ``minimum``; ``example`` shows a fix."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise TerraInputError(f"{name} must be a whole number of at least {minimum} (got {value!r}); e.g. {example}")
    return int(value)
