"""The fields of AlpaSim's requests, read and checked before the server uses any of them."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from terra.config.checks import shown
from terra.core.errors import TerraInputError

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,127}")  # a camera's logical id or a session id
MAX_TIMESTAMP_US = 2**62  # a pose's time (µs); AlpaSim's clocks start near 0 or at the Unix epoch (~2**51 µs now)
QUOTE_CHARS = 40  # what a refusal or a log line quotes of a client's string


class RequestError(TerraInputError):
    """A request this server refuses; ``status`` is the gRPC status code's name (INVALID_ARGUMENT unless named)."""

    status = "INVALID_ARGUMENT"

    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status or self.status


def quoted(value: Any) -> str:
    """A client's value as a refusal or the log quotes it: ``repr`` (control characters escaped), cut short."""
    return shown(value, QUOTE_CHARS)


def client_id(value: Any, field: str) -> str:
    """``value`` if it is an id (:data:`ID_PATTERN`: 1 to 128 letters, digits and ``. _ : / @ + = -``)."""
    if isinstance(value, str) and ID_PATTERN.fullmatch(value):
        return value
    size = f" ({len(value)} characters)" if isinstance(value, str) and len(value) > QUOTE_CHARS else ""
    raise RequestError(f"{field} {quoted(value)}{size} is not an id: give 1 to 128 letters, digits or . _ : / @ + = - "
                       "(starting with a letter or digit)")


def enum_name(enum: Any, value: int, field: str) -> str:
    """The name of ``value`` in the proto enum ``enum``."""
    try:
        return enum.Name(value)
    except ValueError:
        raise RequestError(f"{field} is {quoted(value)}, not a value of {enum.DESCRIPTOR.name} "
                           f"({', '.join(enum.keys())})") from None


def timestamps(poses: Any, field: str = "rig_trajectory") -> np.ndarray:
    """The poses' ``timestamp_us`` as int64 ``[m]``."""
    values = [p.timestamp_us for p in poses]
    for i, value in enumerate(values):
        if not 0 <= value <= MAX_TIMESTAMP_US:
            raise RequestError(f"{field} pose {i} has timestamp_us={quoted(value)}, beyond {MAX_TIMESTAMP_US}; send "
                               "the rollout's time in microseconds")
    return np.array(values, dtype=np.int64).reshape(-1)


def pose_arrays(poses: Any) -> tuple[np.ndarray, np.ndarray]:
    """The poses' translations ``[m, 3]`` and quaternions ``[m, 4]`` (w first) as float64."""
    vec = np.array([[p.pose.vec.x, p.pose.vec.y, p.pose.vec.z] for p in poses], dtype=np.float64).reshape(-1, 3)
    quat = np.array([[p.pose.quat.w, p.pose.quat.x, p.pose.quat.y, p.pose.quat.z] for p in poses],
                    dtype=np.float64).reshape(-1, 4)
    return vec, quat
