"""Settings renamed in this release, still taken under their old names until 0.2.0.

:data:`MOVED` is the one table, mapped where a setting enters: command line, config file, Python keyword.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from terra.config.checks import Range, plain, shown
from terra.core.errors import TerraInputError
from terra.core.lazy import REMOVED_IN

PYTHON = "terra"  # who says it when a Python keyword or mapping used the old name


@dataclass(frozen=True)
class MovedSetting:
    """A setting renamed from ``old`` to ``new`` (dotted names); ``values`` maps old values to new (empty: unchanged).
    """

    old: str
    new: str
    values: Mapping[str, str] = field(default_factory=dict)
    check: Range | None = None  # the new setting's range, checked before the line that says the old name was used

    @property
    def values_only(self) -> bool:
        """Whether the setting kept its name and only some of its values were renamed."""
        return self.old == self.new

    def moves(self, value: Any) -> bool:
        """Whether ``value``, given under the old name, is a use of the old name or of an old value."""
        return not self.values_only or (isinstance(value, str) and value in self.values)

    def value(self, value: Any) -> Any:
        """``value`` of the old setting as the new one takes it; one error line for a value out of range or never valid.
        """
        if self.check is not None:
            return self.check.check(value, self.new, f"{self.old}={shown(value)}: ")
        if not self.values or value in self.values.values() or not self.moves(value):
            return value
        if value not in self.values:
            uses = " or ".join(f"{self.new}={new}" for new in dict.fromkeys(self.values.values()))
            raise TerraInputError(f"{self.old}={shown(value)} is unknown; {self.old}= is now {self.new}=: use {uses}")
        return self.values[value]

    def line(self, who: str, value: Any = None) -> str:
        """The one line that says the old name was used (and which new value an old ``value`` is)."""
        new = self.values.get(value, value) if isinstance(value, str) else value
        if self.values_only:
            was = f"{value} is now {self.new}={new}" if value is not None else "'s values " + ", ".join(
                f"{old} is now {new}" for old, new in self.values.items())
            return f"{who}: {self.old}={was}; the old value goes in {REMOVED_IN}"
        note = f" ({value} is {new})" if new != value else ""
        return f"{who}: {self.old}= is now {self.new}={note}; the old name goes in {REMOVED_IN}"


DECODER = MovedSetting("decoding", "decoder", {"framewise": "tokenizer", "refiner": "refiner"})
DRAFT_TOKENS = MovedSetting("sampling.block_size", "sampling.draft_tokens", check=Range(1, 4096, 32, whole=True))
# the gymnasium envs' keyword: "controls" are the worlds known to be wrong alone
ACTION_MODE = MovedSetting("action_mode", "action_mode", {"control": "actuation"})
# the pipeline's keyword: frames per tokenizer call, encoding as well as decoding
TOKENIZER_BATCH_SIZE = MovedSetting("decode_batch_size", "tokenizer_batch_size")
MOVED = (DECODER, DRAFT_TOKENS, ACTION_MODE, TOKENIZER_BATCH_SIZE)
_OVERRIDE = re.compile(r"(~|\+\+|\+)?([\w.]+)(=(.*))?", re.DOTALL)
_WORD = re.compile(r"[\w.-]+")


def moved_value(moved: MovedSetting, value: Any, who: str = PYTHON) -> Any:
    """``value`` given under ``moved``'s old name, as its new name takes it; says so in one line on stderr."""
    new = moved.value(value)  # a value the old name never had is the only line
    if moved.moves(value):
        print(moved.line(who, value), file=sys.stderr)
    return new


def moved_overrides(args: Sequence[str], who: str) -> list[str]:
    """Hydra command-line arguments with every old name of :data:`MOVED` renamed, one line on stderr for each."""
    out = []
    for arg in args:
        match = None if arg.startswith("-") else _OVERRIDE.fullmatch(arg)
        moved = next((m for m in MOVED if match and match.group(2) == m.old), None)
        prefix, _, assignment, value = match.groups() if moved else (None,) * 4
        if moved is None or (assignment is None and (prefix != "~" or moved.values_only)):  # not an old setting
            out.append(arg)
            continue
        if assignment is None:  # ~decoding: delete it
            print(moved.line(who), file=sys.stderr)
            out.append(f"~{moved.new}")
            continue
        bare = value.strip("'\"")
        if _WORD.fullmatch(bare):  # one value
            value = moved_value(moved, _parsed(bare) if moved.check is not None else bare, who)
        else:  # a sweep or a function of Hydra's override grammar: its old values renamed in place
            if not moved.values_only or any(word in moved.values for word in _WORD.findall(value)):
                print(moved.line(who), file=sys.stderr)
            value = _WORD.sub(lambda word, moved=moved: moved.values.get(word.group(), word.group()), value)
        # +old=: the old name was not in the config, the new one is: Hydra adds it or sets it (++)
        out.append(f"{'++' if prefix == '+' else prefix or ''}{moved.new}={value}")
    return out


def _parsed(value: str) -> Any:
    """A one-word command-line value as Hydra reads it (``8`` an int, ``0.5`` a float, ``null`` None)."""
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def move_settings(cfg: DictConfig, who: str) -> None:
    """Move the old names of :data:`MOVED` set in a composed config to the new names in place, one line each."""
    for moved in MOVED:
        parent, _, leaf = moved.old.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if not isinstance(node, DictConfig) or leaf not in node:
            continue
        value = moved_value(moved, plain(node[leaf]), who)
        with open_dict(node):
            if not moved.values_only:
                del node[leaf]
            node[moved.new.rpartition(".")[2]] = value
