"""terra/config/files.py's strict JSON: numbers json would take but the toolkit refuses, on both of its paths (json's
own parsers when no number can break a check, each number checked as it decodes otherwise)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from terra.config.files import _plain_numbers, parse_json
from terra.core.errors import TerraInputError

REFUSED = {
    "[1e400]": "beyond the range of numbers", "[-1.5E+999]": "beyond the range of numbers",
    '{"a": [0, 2e308]}': "beyond the range of numbers", "[" + "9" * 400 + ".5]": "beyond the range of numbers",
    "[123456789012345678901]": "a number of 21 digits", "[NaN]": "NaN is not a number JSON allows",
    '{"x": -Infinity}': "-Infinity is not a number JSON allows",
}


@pytest.mark.parametrize("text", sorted(REFUSED))
def test_numbers_beyond_the_checks_are_refused_with_one_line(text):
    assert not _plain_numbers(text, 20) or text in ("[NaN]", '{"x": -Infinity}')  # constants are refused on both
    for given in (text, text.encode()):
        with pytest.raises(TerraInputError, match=REFUSED[text]):
            parse_json(given, "f.json")


def test_a_drive_like_record_takes_the_fast_path_and_decodes_as_the_checked_one():
    rng = np.random.default_rng(0)
    record = {"fingerprint": "da9d01b881e360928dd4", "id": "synthetic-0-000__lane", "steps": 200,
              "poses": (rng.normal(0, 50, (200, 3)) * rng.choice([1e-6, 1.0, 1e12], (200, 3))).tolist(),
              "tiny": [1.5e-300, 5e-324], "big": [1.7e308, 12345678901234567890]}
    text = json.dumps(record)
    assert "e360" in text and "e-300" in text  # a hash's letters, a number's exponent of three digits
    assert not _plain_numbers(text, 20)  # the three-digit exponent: each number checked
    del record["tiny"], record["big"]
    text = json.dumps(record)
    assert _plain_numbers(text, 20)  # the hash's e360 is no number
    assert parse_json(text, "f.json") == json.loads(text)
