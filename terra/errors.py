"""Errors for user mistakes and the number checks that raise them.

:class:`TerraInputError` is :class:`tokenizer.errors.InputError` (one class for the whole toolkit, defined in
the tokenizer package, which stands alone): one line naming the input and the fix; the entry points print it
and exit with code 2 (:func:`terra.hydra_app.run_app`). Files, paths and settings are checked in
:mod:`terra.validation`, which builds on these.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from tokenizer.errors import InputError as TerraInputError

__all__ = ["TerraInputError", "check_number", "check_whole_number", "shown"]


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a 400-digit number cannot swamp a one-line message."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) >= 10**limit:
        return f"a {len(str(abs(int(value))))}-digit number"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def check_whole_number(
    value: Any, name: str, minimum: int, example: str, maximum: int | None = None, where: str = ""
) -> int:
    """``value`` as an ``int`` if it is a whole number (not a bool) of at least ``minimum`` and at most
    ``maximum`` (None: no cap); ``example`` shows a fix, ``where`` (e.g. a file name) starts the message."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum
            or (maximum is not None and value > maximum)):
        bounds = f"of at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise TerraInputError(f"{where}{name} must be a whole number {bounds} (got {shown(value)}); e.g. {example}")
    return int(value)


def check_number(
    value: Any, name: str, low: float, high: float, example: str, low_open: bool = False, where: str = ""
) -> float:
    """``value`` as a ``float`` if it is a finite real number (not a bool) in ``[low, high]`` (``(low, high]``
    when ``low_open``); ``example`` shows a fix, ``where`` starts the message."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        try:
            number = float(value)
        except OverflowError:  # an integer beyond float range
            ok = False
        else:
            ok = math.isfinite(number) and (low < number if low_open else low <= number) and number <= high
    if not ok:
        bounds = f"above {low:g} and at most {high:g}" if low_open else f"from {low:g} to {high:g}"
        raise TerraInputError(f"{where}{name} must be a number {bounds} (got {shown(value)}); e.g. {example}")
    return number
