"""Settings renamed in this release, still taken under their old names until the next one (docs/moved-names.md).

:data:`MOVED` is the one table; each entry of it is mapped once, where the setting enters: on an app's command
line (:func:`moved_overrides`, called by terra/apps/runner.py's ``run_app`` before Hydra reads the arguments), in
a config file the user composed (:func:`move_settings`, on the apps' composed config) and as a Python keyword
(:func:`moved_value`: ``SamplingConfig(block_size=)``, ``BatchConfig(decoding=)``,
``WorldModelPipeline.from_pretrained(block_size=)``). Each prints one line on stderr naming the old and the new
setting; an old name with a value it never had is one error line. Light (no torch): the apps load it first.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from terra.config.checks import plain, shown
from terra.core.errors import TerraInputError

PYTHON = "terra"  # who says it when a Python keyword or mapping used the old name


@dataclass(frozen=True)
class MovedSetting:
    """A setting renamed from ``old`` to ``new`` (dotted names), its values renamed as ``values`` says (old value →
    new value; empty: the values stay)."""

    old: str
    new: str
    values: Mapping[str, str] = field(default_factory=dict)

    def value(self, value: Any) -> Any:
        """``value`` of the old setting as the new one takes it; one error line for a value the old one never had."""
        if not self.values or value in self.values.values():
            return value
        if value not in self.values:
            uses = " or ".join(f"{self.new}={new}" for new in dict.fromkeys(self.values.values()))
            raise TerraInputError(f"{self.old}={shown(value)} is unknown; {self.old}= is now {self.new}=: use {uses}")
        return self.values[value]

    def line(self, who: str, value: Any = None) -> str:
        """The one line that says the old name was used (and which new value an old ``value`` is)."""
        new = self.values.get(value, value) if isinstance(value, str) else value
        note = f" ({value} is {new})" if new != value else ""
        return f"{who}: {self.old}= is now {self.new}={note}; the old name goes in the next release"


DECODER = MovedSetting("decoding", "decoder", {"framewise": "tokenizer", "refiner": "refiner"})
DRAFT_TOKENS = MovedSetting("sampling.block_size", "sampling.draft_tokens")
MOVED = (DECODER, DRAFT_TOKENS)
_OVERRIDE = re.compile(r"(~|\+\+|\+)?([\w.]+)(=(.*))?", re.DOTALL)
_WORD = re.compile(r"[\w.-]+")


def moved_value(moved: MovedSetting, value: Any, who: str = PYTHON) -> Any:
    """``value`` given under ``moved``'s old name, as its new name takes it; says so in one line on stderr."""
    new = moved.value(value)  # a value the old name never had is the only line
    print(moved.line(who, value), file=sys.stderr)
    return new


def moved_overrides(args: Sequence[str], who: str) -> list[str]:
    """Hydra command-line arguments with every old setting name of :data:`MOVED` (``decoding=framewise``,
    ``+sampling.block_size=8``, a sweep ``decoding=framewise,refiner``, ``~decoding``) given its new name and
    values, one line on stderr for each; other arguments as they are."""
    out = []
    for arg in args:
        match = None if arg.startswith("-") else _OVERRIDE.fullmatch(arg)
        moved = next((m for m in MOVED if match and match.group(2) == m.old), None)
        prefix, _, assignment, value = match.groups() if moved else (None,) * 4
        if moved is None or (assignment is None and prefix != "~"):  # not an old setting (an option's value)
            out.append(arg)
            continue
        if assignment is None:  # ~decoding: delete it
            print(moved.line(who), file=sys.stderr)
            out.append(f"~{moved.new}")
            continue
        bare = value.strip("'\"")
        if _WORD.fullmatch(bare):  # one value
            value = moved_value(moved, bare, who)
        else:  # a sweep or a function of Hydra's override grammar: its old values renamed in place
            print(moved.line(who), file=sys.stderr)
            value = _WORD.sub(lambda word: moved.values.get(word.group(), word.group()), value)
        out.append(f"{prefix or ''}{moved.new}={value}")
    return out


def move_settings(cfg: DictConfig, who: str) -> None:
    """A composed app config with the old names of :data:`MOVED` that a user's config file set moved to the new
    names, in place (the old value wins over the new name's default), one line on stderr for each."""
    for moved in MOVED:
        parent, _, leaf = moved.old.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if not isinstance(node, DictConfig) or leaf not in node:
            continue
        value = moved_value(moved, plain(node[leaf]), who)
        with open_dict(node):
            node[moved.new.rpartition(".")[2]] = value
            del node[leaf]
