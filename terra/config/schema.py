"""An app's settings written once: a dataclass of :func:`setting` fields gives its defaults, checks and help."""

from __future__ import annotations

import copy
import dataclasses
import textwrap
import typing
from dataclasses import dataclass
from typing import Any, Callable

from hydra.core.config_store import ConfigStore

from terra.config.checks import Range, check_choice, check_flag, known_settings, select, shown
from terra.core.errors import TerraInputError

__all__ = ["Setting", "allowed_values", "block_settings", "check_schema", "flag", "group", "refusal", "register_schema",
           "schema_settings", "setting", "settings_help"]


def setting(default: Any, help: str, range: Range | None = None, choices: tuple | None = None,
            check: Callable[[Any], Any] | None = None) -> Any:
    """A schema field: its default, one line of help, and the ``range``, ``choices`` or ``check`` its value must
    pass."""
    metadata = {"help": help, "range": range, "choices": choices, "check": check}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag(default: bool | None, help: str) -> Any:
    """A true-or-false field, declared ``Any``: a ``bool`` field would let OmegaConf read ``yes`` or ``1`` as true."""
    return dataclasses.field(default=default, metadata={"help": help, "flag": True})


def group() -> Any:
    """A block a config group fills (``model=...``): its keys are the group's, checked where they are read."""
    return dataclasses.field(default_factory=dict, metadata={"group": True})


@dataclass(frozen=True)
class Setting:
    """One field of a schema, by its dotted key."""

    key: str
    default: Any
    help: str
    type: Any
    range: Range | None = None
    choices: tuple | None = None
    checker: Callable[[Any], Any] | None = None
    flag: bool = False

    def check(self, value: Any) -> Any:
        """``value`` checked against the range or choices (a flag: true or false); one line if it is outside."""
        if self.range is not None:
            return self.range.check(value, self.key)
        if self.choices is not None:
            return check_choice(value, self.key, self.choices)
        if self.checker is not None:
            return self.checker(value)
        if self.flag and (value is not None or self.default is not None):
            return check_flag(value, self.key)
        return value

    def refusal(self, value: Any) -> str:
        """The line refusing ``value``, which does not fit the field's type."""
        try:
            self.check(value)
        except TerraInputError as err:
            return str(err)
        return f"{self.key} must be {_type_name(self.type)} (got {shown(value)})"

    def bounds(self) -> str:
        return allowed_values(self.choices if self.choices is not None else self.range)


def allowed_values(allowed: Range | tuple | None) -> str:
    """A range or choices as a help page shows them: ``1 .. 64``, ``null or above 0 .. 1``, ``a | b`` ("" for None)."""
    if isinstance(allowed, tuple):
        return " | ".join("null" if choice is None else str(choice) for choice in allowed)
    if allowed is None:
        return ""
    low, high = (int(allowed.low), int(allowed.high)) if allowed.whole else (allowed.low, allowed.high)
    text = f"above {low:g} .. {high:g}" if allowed.low_open else f"{low} .. {high}"
    return f"null or {text}" if allowed.nullable else text


def _type_name(kind: Any) -> str:
    names = {int: "a whole number", float: "a number", str: "text", bool: "true or false", list: "a list"}
    args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    if typing.get_origin(kind) in (list, dict):
        return {list: "a list", dict: "a mapping"}[typing.get_origin(kind)]
    if args:
        return " or ".join(names.get(arg, getattr(arg, "__name__", str(arg))) for arg in args) + " or null"
    return names.get(kind, getattr(kind, "__name__", str(kind)))


def schema_settings(schema: type, prefix: str = "") -> dict[str, Setting]:
    """Every field of ``schema`` by its dotted key (nested blocks flattened), in the order written."""
    hints = typing.get_type_hints(schema)
    found = {}
    for field in dataclasses.fields(schema):
        kind, key = hints[field.name], f"{prefix}{field.name}"
        if field.metadata.get("group"):
            continue
        if dataclasses.is_dataclass(kind):
            found.update(schema_settings(kind, f"{key}."))
            continue
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        found[key] = Setting(key, default, field.metadata.get("help", ""), kind, field.metadata.get("range"),
                             field.metadata.get("choices"), field.metadata.get("check"),
                             field.metadata.get("flag", False))
    return found


def block_settings(block: type, name: str) -> dict[str, Setting]:
    """The settings of the block ``name`` (keyed ``name.field``) by their field names."""
    return {key.removeprefix(f"{name}."): item for key, item in schema_settings(block, f"{name}.").items()}


def block_values(values: dict[str, Any], name: str) -> dict[str, Any]:
    """The values of block ``name`` among ``values`` (keyed ``name.field``) by their field names."""
    return {key.partition(".")[2]: value for key, value in values.items() if key.startswith(f"{name}.")}


def check_schema(cfg: Any, schema: type) -> dict[str, Any]:
    """Every setting of ``schema`` in ``cfg`` (an OmegaConf config or nested mappings), checked, by dotted key."""
    return {key: item.check(select(cfg, key)) for key, item in schema_settings(schema).items()}


def refusal(schema: type, key: str, value: Any) -> str | None:
    """The line refusing ``value`` for the setting or block ``key`` of ``schema`` (its type refused it), or None."""
    block = schema
    for part in key.split("."):
        kind = typing.get_type_hints(block).get(part) if dataclasses.is_dataclass(block) else None
        if kind is None:
            return None
        block = kind
    if dataclasses.is_dataclass(block):
        try:
            known_settings(value, block, key)
        except TerraInputError as err:
            return str(err)
        return None
    item = schema_settings(schema).get(key)
    return item.refusal(value) if item is not None else None


def _yaml(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_yaml(item) for item in value)}]"
    return str(value)


def settings_help(schema: type, width: int) -> str:
    """``key: default  # help; bounds`` lines, one per setting of ``schema``, wrapped at ``width`` columns."""
    items = schema_settings(schema).values()
    heads = [f"{item.key}: {_yaml(item.default)}" for item in items]
    column = min(max(len(head) for head in heads), 32) + 2
    lines = []
    for head, item in zip(heads, items):
        bounds = item.bounds()
        text = f"{item.help}{'; ' if item.help and bounds else ''}{bounds}"
        first = f"{head.ljust(column - 2)}  # " if len(head) <= column - 2 else f"{head}  # "
        lines.append(textwrap.fill(text, width, initial_indent=first, subsequent_indent=" " * column + "# ",
                                   break_on_hyphens=False, break_long_words=False))
    return "\n".join(lines)


def register_schema(config_name: str, schema: type) -> None:
    """Store ``schema`` in Hydra's ConfigStore as ``<config_name>_schema``, the first entry of the app's defaults."""
    ConfigStore.instance().store(name=f"{config_name}_schema", node=schema)
