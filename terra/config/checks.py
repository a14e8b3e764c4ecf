"""The one check of each kind every entry point uses on its settings; a failure is one :class:`TerraInputError` line."""

from __future__ import annotations

import difflib
import math
import numbers
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from omegaconf import OmegaConf

from terra.core.errors import TerraInputError

__all__ = ["MAX_FRAMES", "MAX_SEED", "Range", "SEED", "check_choice", "check_file_size", "check_flag", "check_keys",
           "check_number", "check_settings", "check_whole_number", "did_you_mean", "known_settings", "one_line",
           "required_path", "select", "shown"]

MAX_FRAMES = 10_000  # frames of a rollout or trajectory: 1000 s at 10 Hz
MAX_SEED = 2**62 - 1  # a rollout's seed (and seed + sample index) stays inside torch's 64-bit generator seed


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a 400-digit number cannot swamp a one-line message."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) >= 10**limit:
        return f"a {len(str(abs(int(value))))}-digit number"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def did_you_mean(value: Any, choices: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` when ``value`` is a near miss of one of ``choices`` (difflib ratio >= 0.75), else
    ``""``.
    """
    if not isinstance(value, str):
        return ""
    digits = re.sub(r"\D", "", value)
    near = [c for c in choices if c != value and re.sub(r"\D", "", c) == digits]
    match = difflib.get_close_matches(value, near, n=1, cutoff=0.75)
    return f" (did you mean {match[0]!r}?)" if match else ""


def check_keys(mapping: Mapping, known: Iterable[str], where: str, holds: str,
               hints: Mapping[str, str] | None = None, strict: bool = True) -> None:
    """One line for the first key of ``mapping`` not in ``known``, with a spelling hint.

    Args:
        hints: spelling -> key to suggest (default: the known keys).
        strict: False refuses only keys that have a hint.
    """
    known = set(known)
    hints = {key: key for key in known} if hints is None else hints
    for key in mapping:
        if key in known:
            continue
        guess = None
        if isinstance(key, str):
            folded = re.sub(r"[\s-]+", "_", key.strip().lower())
            near = [folded] if folded in hints else difflib.get_close_matches(folded, list(hints), n=1, cutoff=0.75)
            guess = hints[near[0]] if near else None
        if guess is None and not strict:
            continue
        hint = f" (did you mean {guess!r}?)" if guess is not None else ""
        raise TerraInputError(f"{where}: unknown key {shown(key)}{hint}; {holds}")


def one_line(text: Any) -> str:
    """``text`` as it is when printable, else escaped as ``repr`` writes it."""
    text = str(text)
    return text if text.isprintable() else repr(text)


def check_whole_number(
    value: Any, name: str, minimum: int, example: str, maximum: int | None = None, where: str = "",
    bounds: str | None = None,
) -> int:
    """``value`` as an ``int`` if a whole number (not a bool) in ``[minimum, maximum]`` (None: no cap);
    ``example``, ``where`` and ``bounds`` word the error line."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum
            or (maximum is not None and value > maximum)):
        bounds = bounds or (f"of at least {minimum}" if maximum is None else f"from {minimum} to {maximum}")
        raise TerraInputError(f"{where}{name} must be a whole number {bounds} (got {shown(value)}); e.g. {example}")
    return int(value)


def check_number(
    value: Any, name: str, low: float, high: float, example: str | None = None, low_open: bool = False,
    where: str = "",
) -> float:
    """``value`` as a ``float`` if finite (not a bool) in ``[low, high]`` (``(low, high]`` when ``low_open``)."""
    finite = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if finite:
        try:
            number = float(value)
        except OverflowError:  # an integer beyond float range
            finite = False
        else:
            finite = math.isfinite(number)
    if finite and (low < number if low_open else low <= number) and number <= high:
        return number
    bounds = f"above {low:g} and at most {high:g}" if low_open else f"from {low:g} to {high:g}"
    kind = "a number" if finite else "a finite number"
    fix = f"; e.g. {example}" if example else ""
    raise TerraInputError(f"{where}{name} must be {kind} {bounds} (got {shown(value)}){fix}")


@dataclass(frozen=True)
class Range:
    """The sane values of a numeric setting: ``[low, high]`` (``(low, high]`` with ``low_open``); ``example`` for
    errors.
    """

    low: float
    high: float
    example: Any
    whole: bool = False
    low_open: bool = False
    nullable: bool = False

    def check(self, value: Any, name: str, where: str = "") -> Any:
        """``value`` checked (an ``int`` for whole numbers, else a ``float``); ``where`` starts the error line."""
        if value is None and self.nullable:
            return None
        example = f"{name}={self.example}"
        if self.whole:
            return check_whole_number(value, name, int(self.low), example, int(self.high), where)
        return check_number(value, name, self.low, self.high, example, self.low_open, where)


SEED = Range(0, MAX_SEED, 0, whole=True)  # every seed setting (a rollout's, a scene's, a drive's)


def known_settings(values: Mapping[str, Any], cls: type, block: str) -> Mapping[str, Any]:
    """``values`` when every key names a field of dataclass ``cls``; else one line naming ``block``."""
    known = {f.name for f in fields(cls)}
    if not isinstance(values, Mapping):
        given = "null" if values is None else shown(values)
        raise TerraInputError(f"{block} must be a block of settings ({', '.join(sorted(known))}), not {given}; leave "
                              f"it out for the defaults, or set {block}.KEY=VALUE")
    unknown = sorted(set(values) - known)
    if unknown:
        raise TerraInputError(f"unknown {block} settings {unknown}{did_you_mean(unknown[0], known)}; known: "
                              f"{', '.join(sorted(known))}")
    return values


def check_choice(value: Any, name: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise TerraInputError(f"unknown {name} {shown(value)}{did_you_mean(value, choices)}; choose one of: "
                              f"{', '.join(choices)}")
    return value


_SIZE = re.compile(r"(\d{1,15})(KB|MB|GB|KIB|MIB|GIB)", re.IGNORECASE)
_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
FILE_SIZES = (10**4, 10**12)  # a file size setting's range in bytes: 10 KB .. 1 TB


def check_file_size(value: Any, name: str) -> int:
    """A size such as ``15MB``, ``500KB``, ``2GiB`` or whole bytes, as bytes within :data:`FILE_SIZES`."""
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    size = int(match.group(1)) * _UNITS[match.group(2).upper()] if match else value
    low, high = FILE_SIZES
    if isinstance(size, bool) or not isinstance(size, int) or not low <= size <= high:
        raise TerraInputError(f"{name} must be a size from 10KB to 1000GB such as 15MB, 500KB or 2GiB (got "
                              f"{shown(value)}); e.g. {name}=15MB")
    return size


def check_flag(value: Any, name: str) -> bool:
    """``value`` if it is true or false (a YAML ``yes`` or ``1`` is no flag)."""
    if not isinstance(value, bool):
        raise TerraInputError(f"{name} must be true or false (got {shown(value)})")
    return value


def plain(value: Any) -> Any:
    """An OmegaConf node as plain Python values, interpolations resolved (anything else as it is)."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def select(cfg: Any, key: str) -> Any:
    """``cfg``'s value at the dotted ``key`` (an OmegaConf config or nested mappings), plain Python values."""
    if OmegaConf.is_config(cfg):
        return plain(OmegaConf.select(cfg, key, throw_on_missing=True))
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def required_path(cfg: Any, key: str, what: str, form: str = "DIR") -> Path:
    """``cfg``'s path setting ``key`` (``~`` expanded); missing or empty is one line (``form``: DIR or FILE)."""
    value = select(cfg, key)
    if value is None or value == "":
        raise TerraInputError(f"no {key} given; pass {key}={form} ({what})")
    return Path(str(value)).expanduser()


def check_settings(cfg: Any, ranges: Mapping[str, Range]) -> dict[str, Any]:
    """Check each dotted key of ``ranges`` in ``cfg``; return the checked values by key."""
    return {key: limits.check(select(cfg, key), key) for key, limits in ranges.items()}
