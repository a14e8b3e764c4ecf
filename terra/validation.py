"""What every entry point checks before any model loads: input files, output paths and settings.

``terra-generate`` (:mod:`terra.cli`), ``scripts/evaluate.py``, batch rollouts and the Python API readers
(:mod:`terra.actions`) go through these checks, so hostile input ends with one :class:`TerraInputError` line
instead of a traceback, a hang or minutes of wasted generation. This module is light (no torch, no
Transformers): settings are checked in well under a second. Number checks are in :mod:`terra.errors`.

Limits, in one place:

* :data:`MAX_FRAMES` frames in any rollout or trajectory (1000 s at 10 Hz);
* input files must be regular files (a FIFO or a device would block the reader forever), JSON/CSV/NPY
  trajectories at most :data:`MAX_TRAJECTORY_BYTES`, JSON integers at most :data:`MAX_JSON_DIGITS` digits and
  no NaN or infinity (image limits are in :mod:`tokenizer.images`);
* output names must fit the file system with the temporary suffix of an atomic write (:data:`ATOMIC_EXTRA`),
  and the output disk must have :data:`MIN_FREE_BYTES` free (a disk that fills up later fails at the write);
* paths a batch sample names stay inside the folder the user gave for them (:func:`check_inside`);
* ``device``, ``dtype``, ``backend`` and ``backend.options``: the values in :data:`DEVICE_PATTERN`,
  :data:`DTYPES` and :data:`BACKEND_OPTIONS`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Mapping, Sequence

from omegaconf import OmegaConf

from terra.errors import TerraInputError, check_number, check_whole_number, shown

MAX_FRAMES = 10_000  # frames of a rollout or trajectory: 1000 s at 10 Hz
MAX_TRAJECTORY_BYTES = 64 << 20  # a [1000, 60, 3] trajectory is about 3 MB of JSON
MAX_JSON_DIGITS = 20  # longer integers are no coordinates, counts or seeds
MIN_FREE_BYTES = 1 << 20  # an output folder's disk needs at least this much room before any work starts
ATOMIC_EXTRA = len(".") + len(".XXXXXXXX.tmp")  # tokenizer/atomic.py writes ".<stem>.<8 chars>.tmp<suffix>" first
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]{1,2})?")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Range:
    """The sane values of a numeric setting: ``[low, high]`` (``(low, high]`` with ``low_open``), whole numbers
    only with ``whole``, None allowed with ``nullable``; ``example`` goes into the error line."""

    low: float
    high: float
    example: Any
    whole: bool = False
    low_open: bool = False
    nullable: bool = False

    def check(self, value: Any, name: str, where: str = "") -> Any:
        """``value`` checked against the range (an ``int`` for whole numbers, else a ``float``); ``where``
        (e.g. ``"traj.json: "``) starts the error line."""
        if value is None and self.nullable:
            return None
        example = f"{name}={self.example}"
        if self.whole:
            return check_whole_number(value, name, int(self.low), example, int(self.high), where)
        return check_number(value, name, self.low, self.high, example, self.low_open, where)


# Options each backend's constructor takes (terra/generation/hf_backend.py, vllm_backend.py): a Range, or
# bool / str for flags and names. vLLM passes further options to its engine, which checks them itself.
BACKEND_OPTIONS: dict[str, dict[str, Range | type]] = {
    "hf": {"max_batch_size": Range(1, 4096, 16, whole=True)},
    "vllm": {
        "max_num_seqs": Range(1, 4096, 64, whole=True),
        "gpu_memory_utilization": Range(0, 1, 0.9, low_open=True, nullable=True),  # null: 0.9 on a GPU
        "enforce_eager": bool,
        "enable_prefix_caching": bool,
        "kv_cache_dtype": str,
        "tensor_parallel_size": Range(1, 64, 1, whole=True),
        "seed": Range(0, 2**31 - 1, 0, whole=True),
        "kv_cache_memory_bytes": Range(1 << 20, 1 << 44, 1 << 30, whole=True),
        "block_size": Range(1, 1024, 16, whole=True),
        "max_model_len": Range(1, 1 << 24, 16384, whole=True),
    },
}
BACKENDS = ("auto", *BACKEND_OPTIONS)
SAMPLING = {  # terra/generation/sampling.py: SamplingConfig checks these too
    "temperature": Range(0, 10, 1.0),
    "top_k": Range(0, 1 << 20, 0, whole=True),
    "top_p": Range(0, 1, 1.0, low_open=True),
}


# ---------------------------------------------------------------------------------------------- settings


def select(cfg: Any, key: str) -> Any:
    """``cfg``'s value at the dotted ``key`` (an OmegaConf config or nested mappings), plain Python values."""
    if OmegaConf.is_config(cfg):
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def check_settings(cfg: Any, ranges: Mapping[str, Range]) -> dict[str, Any]:
    """Check each dotted key of ``ranges`` in ``cfg``; return the checked values by key."""
    return {key: limits.check(select(cfg, key), key) for key, limits in ranges.items()}


def check_choice(value: Any, name: str, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices`` (strings)."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise TerraInputError(f"unknown {name} {shown(value)}; choose one of: {', '.join(choices)}")
    return value


def check_device(value: Any) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether that GPU exists is checked when torch is loaded)."""
    if not isinstance(value, str) or not DEVICE_PATTERN.fullmatch(value):
        raise TerraInputError(f"device={shown(value)} is not a device; use auto, cpu, cuda or cuda:N (e.g. cuda:0)")
    return value


def check_backend(name: Any, options: Any) -> tuple[str, dict]:
    """The backend name and its options, checked: known names, and for the options the backend takes, their
    types and ranges. ``auto`` checks every option that either backend knows."""
    name = check_choice(name, "backend", BACKENDS)
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TerraInputError(f"backend.options must be a mapping of option names to values (got {shown(options)})")
    options = dict(options)
    known = ({k: v for table in BACKEND_OPTIONS.values() for k, v in table.items()} if name == "auto"
             else BACKEND_OPTIONS[name])
    for key, value in options.items():
        rule = known.get(key)
        setting = f"backend.options.{key}"
        if rule is None:
            if name == "hf":
                raise TerraInputError(f"{setting} is not an option of backend=hf; it takes {', '.join(known)}")
        elif isinstance(rule, Range):
            rule.check(value, setting)
        elif not isinstance(value, rule) or (rule is not bool and isinstance(value, bool)):
            kind = "true or false" if rule is bool else "a name"
            raise TerraInputError(f"{setting} must be {kind} (got {shown(value)})")
    return name, options


def check_sampling(options: Any) -> dict[str, Any]:
    """The ``sampling`` settings (names and ranges of :data:`SAMPLING`), checked without importing torch."""
    unknown = sorted(set(options) - set(SAMPLING)) if isinstance(options, Mapping) else options
    if unknown or not isinstance(options, Mapping):
        raise TerraInputError(f"sampling settings {unknown} are unknown; use temperature, top_k, top_p")
    return {key: SAMPLING[key].check(value, f"sampling.{key}") for key, value in options.items()}


def check_flag(value: Any, name: str) -> bool:
    """``value`` if it is true or false (a YAML ``yes`` or ``1`` is no flag)."""
    if not isinstance(value, bool):
        raise TerraInputError(f"{name} must be true or false (got {shown(value)})")
    return value


# ---------------------------------------------------------------------------------------------- input files


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"


def open_input_file(path: str | os.PathLike, what: str, max_bytes: int) -> IO[bytes]:
    """Open ``path`` for reading if it is a regular file of at most ``max_bytes``; ``what`` names it in errors.

    The file is opened without blocking and checked on its descriptor, so a FIFO, a device or a socket is
    refused at once instead of blocking the reader forever.
    """
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
        raise TerraInputError(f"{what} {path} is {info.st_size / 2**20:.0f} MiB, more than the "
                              f"{max_bytes / 2**20:.0f} MiB a {what} may have; trim it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_input_text(path: str | os.PathLike, what: str, max_bytes: int = MAX_TRAJECTORY_BYTES) -> str:
    """A regular text file (UTF-8, with or without a byte-order mark) as a string."""
    with open_input_file(path, what, max_bytes) as fh:
        data = fh.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TerraInputError(f"{what} {path} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None


def parse_json(text: str, source: str) -> Any:
    """Decode JSON, refusing what no trajectory or sample holds: NaN / Infinity, numbers beyond float range
    (``1e400``), integers of more than :data:`MAX_JSON_DIGITS` digits and nesting deeper than Python's stack."""

    def whole(token: str) -> int:
        if len(token.lstrip("-")) > MAX_JSON_DIGITS:
            raise TerraInputError(f"{source}: holds an integer of {len(token.lstrip('-'))} digits; numbers must "
                                  f"have at most {MAX_JSON_DIGITS}")
        return int(token)

    def real(token: str) -> float:
        value = float(token)
        if value in (float("inf"), float("-inf")):
            raise TerraInputError(f"{source}: holds {shown(token)}, beyond the range of numbers; fix that value")
        return value

    def constant(token: str) -> float:
        raise TerraInputError(f"{source}: holds {token}; replace it with a finite number")

    try:
        return json.loads(text, parse_int=whole, parse_float=real, parse_constant=constant)
    except RecursionError:
        raise TerraInputError(f"{source}: nests lists or objects too deeply to be a trajectory; check the file") from None
    except TerraInputError:
        raise
    except ValueError as err:  # json.JSONDecodeError
        raise TerraInputError(f"{source} cannot be read (JSONDecodeError: {err}); check that it is valid JSON") from None


def load_json(path: str | os.PathLike, what: str, max_bytes: int = MAX_TRAJECTORY_BYTES) -> Any:
    """A regular JSON file of at most ``max_bytes``, decoded by :func:`parse_json`."""
    return parse_json(read_input_text(path, what, max_bytes), str(path))


def check_context_paths(sources: str | os.PathLike | Sequence[str], base: Path | None = None) -> list[str]:
    """Context sources checked without decoding anything: each must be a folder, a regular file or a glob that
    matches (a FIFO or a device would block the reader). Returns them resolved (relative ones from ``base``);
    batch runs can check every sample of a chunk this way before any image is read."""
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


# ---------------------------------------------------------------------------------------------- output paths


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def check_output_dir(path: str | os.PathLike, file_names: Iterable[str] = (), setting: str = "output.dir") -> Path:
    """Check, without creating anything, that folder ``path`` can be created or written and that ``file_names``
    fit the file system there (with the temporary suffix of an atomic write); return it as an absolute path."""
    folder = Path(os.path.abspath(Path(path).expanduser()))
    existing = folder
    while not os.path.lexists(existing):
        existing = existing.parent
    if not existing.is_dir():
        raise TerraInputError(f"output folder {path} is not writable ({existing} is not a folder); "
                              f"choose another {setting}")
    name_max, path_max = _limit(existing, "PC_NAME_MAX", 255), _limit(existing, "PC_PATH_MAX", 4096)
    parts = [(p, 0) for p in folder.relative_to(existing).parts] + [(n, ATOMIC_EXTRA) for n in file_names]
    for name, extra in parts:
        size = len(os.fsencode(name)) + extra
        if size > name_max:
            what = "the output file name" if extra else "the folder name"
            fix = "a shorter output.name" if extra else f"a shorter {setting}"
            raise TerraInputError(f"{what} {shown(name)} is too long: {size} bytes"
                                  f"{' with its temporary suffix' * bool(extra)}, more than the file system allows "
                                  f"({name_max}); choose {fix}")
    longest = max([len(os.fsencode(n)) + ATOMIC_EXTRA for n in file_names] or [0])
    if len(os.fsencode(str(folder))) + 1 + longest > path_max:
        raise TerraInputError(f"output folder {shown(str(path))} makes paths longer than the file system allows "
                              f"({path_max} bytes); choose a shorter {setting}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TerraInputError(f"output folder {path} is not writable ({existing} cannot be written); "
                              f"choose another {setting}")
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise TerraInputError(f"output folder {path} is on a full disk ({free >> 10} KiB free); free some space "
                              f"or choose another {setting}")
    return folder


def check_output_names(folder: str | os.PathLike, names: Iterable[str], what: str = "output file") -> None:
    """Raise unless each of ``names`` (paths relative to ``folder``, e.g. from a naming pattern) is text the file
    system takes there: no NUL or lone surrogate, each part at most ``NAME_MAX`` bytes (the last with the
    temporary suffix of an atomic write) and the whole path at most ``PATH_MAX``. Nothing is created."""
    base = Path(os.path.abspath(Path(folder).expanduser()))
    existing = base
    while not os.path.lexists(existing):
        existing = existing.parent
    name_max, path_max = _limit(existing, "PC_NAME_MAX", 255), _limit(existing, "PC_PATH_MAX", 4096)
    for name in names:
        try:
            encoded = os.fsencode(name)
        except UnicodeEncodeError:
            raise TerraInputError(f"{what} name {shown(name)} is not valid text (a lone surrogate escape)") from None
        if b"\0" in encoded:
            raise TerraInputError(f"{what} name {shown(name)} holds a NUL character")
        parts = Path(name).parts
        for i, part in enumerate(parts):
            size = len(os.fsencode(part)) + (ATOMIC_EXTRA if i == len(parts) - 1 else 0)
            if size > name_max:
                raise TerraInputError(f"{what} name {shown(part)} is too long: {size} bytes with its temporary "
                                      f"suffix, more than the file system allows ({name_max})")
        if len(os.fsencode(str(base))) + 1 + len(encoded) + ATOMIC_EXTRA > path_max:
            raise TerraInputError(f"{what} {shown(name)} makes a path longer than the file system allows "
                                  f"({path_max} bytes) in {shown(str(base))}")


def check_inside(path: str | os.PathLike, root: str | os.PathLike, what: str, allow: str) -> str:
    """``path`` as an absolute path (``~`` expanded, a relative one taken from ``root``, ``.`` and ``..``
    resolved without following links) if it lies inside ``root``; otherwise one line naming ``what`` and the
    setting ``allow`` that lets such paths through."""
    base = os.path.abspath(Path(root).expanduser())
    resolved = os.path.abspath(os.path.join(base, Path(path).expanduser()))
    if os.path.commonpath([base, resolved]) != base:
        raise TerraInputError(f"{what} {shown(str(path), 120)} lies outside {base}; keep it under that folder or "
                              f"set {allow}=true")
    return resolved
