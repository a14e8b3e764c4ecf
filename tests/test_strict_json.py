"""terra/config/files.py's strict JSON: numbers json would take but the toolkit refuses, on both of its paths (orjson
when no integer of the text can be past 64 bits, each number checked by json as it decodes otherwise)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from terra.config import files
from terra.config.files import _plain_numbers, parse_json
from terra.core.errors import TerraInputError

REFUSED = {
    "[1e400]": "beyond the range of numbers", "[-1.5E+999]": "beyond the range of numbers",
    '{"a": [0, 2e308]}': "beyond the range of numbers", "[" + "9" * 400 + ".5]": "beyond the range of numbers",
    "[123456789012345678901]": "a number of 21 digits", "[NaN]": "NaN is not a number JSON allows",
    '{"x": -Infinity}': "-Infinity is not a number JSON allows", "[1, 2": "malformed JSON",
    "[" * 2000 + "]" * 2000: "malformed JSON",
}


@pytest.mark.parametrize("text", sorted(REFUSED))
def test_numbers_beyond_the_checks_are_refused_with_one_line(text):
    """Only a wide integer keeps a text off orjson; what orjson refuses is worded by the checks."""
    assert _plain_numbers(text) == (text != "[123456789012345678901]")
    for given in (text, text.encode()):
        with pytest.raises(TerraInputError, match=REFUSED[text]):
            parse_json(given, "f.json")


def test_a_drive_like_record_takes_the_fast_path_and_decodes_as_the_checked_one(monkeypatch):
    rng = np.random.default_rng(0)
    record = {"fingerprint": "da9d01b881e360928dd4", "id": "synthetic-0-000__lane", "steps": 200,
              "poses": (rng.normal(0, 50, (200, 3)) * rng.choice([1e-6, 1.0, 1e12], (200, 3))).tolist(),
              "tiny": [1.5e-300, 5e-324, 1e-400, 0.00019999999494757503], "big": [1.7e308, 9223372036854775807]}
    text = json.dumps(record)
    assert "e-300" in text and "0.00019999999494757503" in text  # 20 digits after a point: a float's
    assert _plain_numbers(text)
    checked = json.loads(text)
    with monkeypatch.context() as patched:  # decoded by orjson alone
        patched.setattr(files.json, "loads", None)
        assert parse_json(text, "f.json") == checked
    for wide in (99999999999999999999, -12345678901234567890, 10 ** 19):  # 20 digits: past 64 bits, or at the edge
        text = json.dumps({**record, "big": [wide], "id": "x"})
        assert not _plain_numbers(text)
        decoded = parse_json(text, "f.json")["big"][0]
        assert type(decoded) is int and decoded == wide  # kept whole (orjson would read a float)
    assert not _plain_numbers('{"id": "123456789012345678901234"}')  # a string's digits: checked, to be safe
    assert _plain_numbers("[1.5e00000000000000000000001]") is False  # an exponent's run: checked


def test_a_caller_s_fewer_digits_keep_their_integers_off_the_fast_path():
    """A ``max_digits`` below orjson's 64 bits still refuses every longer integer, floats' digits still taken."""
    with pytest.raises(TerraInputError, match="a number of 7 digits; numbers must have at most 5"):
        parse_json("[1, 1234567]", "f.json", max_digits=5)
    assert not _plain_numbers("[1, 1234567]", 6) and _plain_numbers("[1, 12345, 1234567.5]", 6)
    assert parse_json("[12345, 1234567.5]", "f.json", max_digits=5) == [12345, 1234567.5]
