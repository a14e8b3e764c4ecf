"""Input files as every entry point reads them: regular files of bounded size, strict JSON, context paths.

Hostile input ends with one :class:`TerraInputError` line. Light (no torch).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import IO, Any, Sequence

import orjson

from terra.config.checks import shown
from terra.core.errors import TerraInputError, past

MAX_TRAJECTORY_BYTES = 64 << 20  # a [1000, 60, 3] trajectory is about 3 MB of JSON
MAX_JSON_DIGITS = 20  # longer integers in a file are no coordinates, counts or seeds
MAX_WEIGHTS_BYTES = 1 << 40  # one weight file of a checkpoint
_WIDE_DIGITS = 20  # an integer this long may be past 64 bits, which orjson reads as a float
_DIGIT_MAP = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))  # a digit to "1", any other byte to "0"


# ---------------------------------------------------------------------------------------------- input files


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"


def open_input_file(path: str | os.PathLike, what: str, max_bytes: int) -> IO[bytes]:
    """Open ``path`` if it is a regular file of at most ``max_bytes`` (FIFOs and devices refused without blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise TerraInputError(f"{what} {path} does not exist; check the path") from None
    except OSError as err:
        raise TerraInputError(f"{what} {path} cannot be opened ({err.strerror}); check the path and its "
                              "permissions") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise TerraInputError(f"{what} {path} is {_kind(info.st_mode)}, not a regular file; pass a file")
    if info.st_size > max_bytes:
        os.close(fd)
        raise TerraInputError(f"{what} {path} is {past(info.st_size / 2**20, max_bytes / 2**20)} MiB, more "
                              f"than the {max_bytes / 2**20:g} MiB a {what} may have; trim it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


_DIGESTS: dict[tuple[str, int, int, int, int], str] = {}  # (path, device, inode, size, mtime_ns) -> SHA-256


def file_digest(path: str | os.PathLike, what: str, max_bytes: int) -> str:
    """The SHA-256 (hex) of a regular file's content, cached per process while its size and mtime stay the same."""
    with open_input_file(path, what, max_bytes) as fh:
        info = os.fstat(fh.fileno())
        key = (os.path.realpath(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if key not in _DIGESTS:
            _DIGESTS[key] = hashlib.file_digest(fh, "sha256").hexdigest()
        return _DIGESTS[key]


def content_digest(paths: Sequence[str | os.PathLike], what: str, max_bytes: int = MAX_WEIGHTS_BYTES) -> str:
    """sha256 (32 hex digits) of the names and contents of ``paths`` (folders recursively; a Hub id by its name)."""
    digest = hashlib.sha256()
    for path in map(Path, paths):
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file()
                           and not any(part.startswith(".") for part in p.relative_to(path).parts))
            for file in files:
                name = file.relative_to(path).as_posix()
                digest.update(f"{name}\0{file_digest(file, what, max_bytes)}\n".encode())
        elif path.is_file():
            digest.update(f"{path.name}\0{file_digest(path, what, max_bytes)}\n".encode())
        else:
            digest.update(f"{path}\0\n".encode())
    return digest.hexdigest()[:32]


def checkpoint_digest(folder: str | os.PathLike) -> str:
    """:func:`content_digest` of a checkpoint's top-level visible files (or of the file)."""
    root = Path(folder)
    files = sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith(".")) if root.is_dir() else [root]
    return content_digest(files, "checkpoint file")


def declared_route_tokens(world_model: str | os.PathLike) -> int:
    """The route slots the world model's ``config.json`` declares (0 where it cannot be read: the load says why)."""
    try:
        value = json.loads((Path(world_model) / "config.json").read_text()).get("num_route_tokens", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and value > 0 else 0


def read_input_text(path: str | os.PathLike, what: str, max_bytes: int = MAX_TRAJECTORY_BYTES) -> str:
    """A regular text file (UTF-8, with or without a byte-order mark) as a string."""
    with open_input_file(path, what, max_bytes) as fh:
        data = fh.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TerraInputError(f"{what} {path} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None


def parse_json(text: str | bytes, source: str, max_digits: int = MAX_JSON_DIGITS, finite: bool = True) -> Any:
    """Decode strict JSON: no NaN / Infinity, integers of at most ``max_digits`` digits, bounded nesting.

    Args:
        source: starts every error line (a file, ``line 3``, ``request body``).
        finite: refuse numbers beyond float range (else they decode as infinities).
    """

    def whole(token: str) -> int:
        digits = len(token.lstrip("-"))
        if digits > max_digits:
            raise TerraInputError(f"{source}: holds a number of {digits} digits; numbers must have at most "
                                  f"{max_digits}")
        return int(token)

    def real(token: str) -> float:
        value = float(token)
        if finite and value in (float("inf"), float("-inf")):
            raise TerraInputError(f"{source}: holds {shown(token)}, beyond the range of numbers; fix that value")
        return value

    def constant(token: str) -> float:
        raise TerraInputError(f"{source}: {token} is not a number JSON allows; replace it with a finite number")

    try:
        if _plain_numbers(text, min(max_digits + 1, _WIDE_DIGITS)):  # orjson decodes as the checks would: in C
            try:
                return orjson.loads(text)
            except orjson.JSONDecodeError:
                pass  # the checks below find what is wrong and word it
        return json.loads(text, parse_int=whole, parse_float=real, parse_constant=constant)
    except TerraInputError:
        raise
    except RecursionError:
        raise TerraInputError(f"{source}: cannot be read, malformed JSON (RecursionError: lists or objects nested "
                              "too deeply); check that it is valid JSON") from None
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise TerraInputError(f"{source}: cannot be read, malformed JSON ({type(err).__name__}: {str(err)[:120]}); "
                              "check that it is valid JSON") from None


def _plain_numbers(text: str | bytes, wide: int = _WIDE_DIGITS) -> bool:
    """Whether orjson decodes ``text`` as :func:`parse_json`'s checks would (no integer of ``wide`` digits or more)."""
    if isinstance(text, bytes):
        return False
    raw = text.encode("utf-8", "surrogatepass")
    digits, at = raw.translate(_DIGIT_MAP), 0
    run = b"1" * wide
    while (at := digits.find(run, at)) != -1:
        end = at + wide
        while end < len(digits) and digits[end] == 0x31:
            end += 1
        if (at == 0 or raw[at - 1] != 0x2E) and (end == len(raw) or raw[end] not in b".eE"):
            return False
        at = end
    return True


def load_json(path: str | os.PathLike, what: str, max_bytes: int = MAX_TRAJECTORY_BYTES) -> Any:
    return parse_json(read_input_text(path, what, max_bytes), str(path))


def check_context_paths(sources: str | os.PathLike | Sequence[str], base: Path | None = None) -> list[str]:
    """Context sources checked without decoding: folders, regular files or matching globs; resolved from ``base``."""
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not items:
        raise TerraInputError("no context frames given; pass image files, a folder, a glob or a video file")
    resolved = [str(Path(base) / Path(s).expanduser() if base is not None else Path(s).expanduser()) for s in items]
    for path in resolved:
        if os.path.isdir(path):
            continue
        if os.path.lexists(path):
            mode = os.stat(path).st_mode if os.path.exists(path) else 0
            if not stat.S_ISREG(mode):
                raise TerraInputError(f"{path} is not a regular file (a FIFO, device, socket or broken link); "
                                      "pass an image or video file")
        elif not (glob.has_magic(path) and glob.glob(path)):
            raise TerraInputError(f"image path {path} does not exist; check the path")
    return resolved


def check_inside(path: str | os.PathLike, root: str | os.PathLike, what: str, allow: str) -> str:
    """``path`` made absolute (relative to ``root``) if inside ``root``; else one line naming ``what`` and ``allow``."""
    base = os.path.abspath(Path(root).expanduser())
    resolved = os.path.abspath(os.path.join(base, Path(path).expanduser()))
    if os.path.commonpath([base, resolved]) != base:
        raise TerraInputError(f"{what} {shown(str(path), 120)} lies outside {base}; keep it under that folder or "
                              f"set {allow}=true")
    return resolved
