"""docs/serve.md's WebSocket protocol is the code's: the client's message types are the ones the socket takes
(terra/serve/sockets.py, ``MESSAGE_TYPES``), the server's the ones its code sends, the frame header's fields the ones
a frame's header holds (terra/serve/service.py), the page's reader reads a frame message as the server writes it
(terra/serve/media.py), and the defaults it quotes are terra-serve's schema's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from terra.config.schema import schema_settings
from terra.serve.media import frame_message
from terra.serve.settings import ServeBlock
from terra.serve.sockets import MESSAGE_TYPES

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "terra" / "serve"


def section() -> str:
    text = (ROOT / "docs" / "serve.md").read_text()
    return text[text.index("## The WebSocket protocol"):]


def table_types(text: str, after: str) -> list[str]:
    """The first column of the Markdown table that follows the line starting with ``after``."""
    rest = text[text.index(after):]
    return re.findall(r"^\| `(\w+)` \|", rest[: rest.index("\n\n", rest.index("|"))], re.M)


def sent_types() -> set[str]:
    """The ``"type"`` of every dict literal the server's code builds (the messages it sends)."""
    types = set()
    for path in (SERVE / "sockets.py", SERVE / "app.py", SERVE / "service.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "type" and isinstance(value, ast.Constant):
                        types.add(value.value)
    return types


def header_fields() -> list[str]:
    """The keys of the frame header ``SessionService.step`` builds."""
    for node in ast.walk(ast.parse((SERVE / "service.py").read_text())):
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["header"]:
            return [key.value for key in node.value.keys]
    raise AssertionError("no header in terra/serve/service.py")


def test_the_documented_message_types_are_the_codes():
    text = section()
    assert table_types(text, "The client sends") == list(MESSAGE_TYPES)
    assert set(table_types(text, "The server sends")) == sent_types() == {"ready", "frame", "reset", "error"}


def test_the_documented_header_fields_are_a_frames():
    text = section()
    described = text[text.index("The header holds"):text.index("Read in Python")]
    fields = header_fields()
    assert fields and [f for f in fields if f"`{f}`" not in described] == []
    named = re.findall(r"`(\w+)` \(", described)  # the fields named with an explanation
    assert set(named) <= set(fields), named


def test_the_documented_reader_reads_a_frame_message():
    [code] = re.findall(r"```python\n(.*?)```", section(), re.S)
    scope: dict = {}
    exec(code, scope)  # noqa: S102  (the page's own example)
    header = {"type": "frame", "index": 3, "pose": [1.5, 0.0, 0.1]}
    assert scope["read_frame"](frame_message(header, b"\xff\xd8 a JPEG")) == (header, b"\xff\xd8 a JPEG")


def test_the_quoted_defaults_are_the_schemas():
    settings = {key: item.default for key, item in schema_settings(ServeBlock).items()}
    quoted = re.findall(r"`serve\.(\w+)` \((\d+)( s| KiB)?\)", section())
    assert len(quoted) >= 4, quoted
    for name, value, unit in quoted:
        assert int(value) * (1024 if unit == " KiB" else 1) == settings[name], name
