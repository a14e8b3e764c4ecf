"""Errors for user mistakes and the checks that raise them.

:class:`TerraInputError` is :class:`tokenizer.errors.InputError` (one class for the whole toolkit, defined in
the tokenizer package, which stands alone): one line naming the input and the fix; the CLI prints it and
exits with code 2.
"""

from __future__ import annotations

import numbers
from typing import Any

from tokenizer.errors import InputError as TerraInputError

__all__ = ["TerraInputError", "check_whole_number"]


def check_whole_number(value: Any, name: str, minimum: int, example: str) -> int:
    """``value`` as an ``int`` if it is a whole number (not a bool) of at least ``minimum``; ``example`` shows a fix."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise TerraInputError(f"{name} must be a whole number of at least {minimum} (got {value!r}); e.g. {example}")
    return int(value)
