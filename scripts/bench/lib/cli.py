"""What the command lines of scripts/ share: a parser whose bad input is one line and exit 2, number ranges, device
names, comma lists, input paths found from any folder, outputs checked before the work, N client threads timed
together."""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NoReturn, Sequence, TypeVar

from terra.config.checks import MAX_SEED
from terra.config.sampling import SAMPLING
from terra.core.device import check_device
from terra.core.errors import TerraInputError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from terra.contract.layout import TokenLayout

T = TypeVar("T")
CHECKOUT = Path(__file__).resolve().parents[3]  # the repository root: scripts/bench/lib/cli.py


class Parser(argparse.ArgumentParser):
    """An argument parser whose bad input is one line ``<prog>: error: ...`` on stderr and exit 2, without the usage
    block (``--help`` still prints it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")

    @contextlib.contextmanager
    def one_line_errors(self) -> Iterator[None]:
        """A block of checks after ``parse_args`` (an output path, ...) whose :class:`TerraInputError` is
        :meth:`error`'s one line and exit 2."""
        try:
            yield
        except TerraInputError as err:
            self.error(str(err))


def in_range(kind: Callable[[str], T], low: float | None = None, high: float | None = None, *,
             above: bool = False) -> Callable[[str], T]:
    """An argparse ``type``: a finite ``kind`` (``int`` or ``float``) of at least ``low`` (more than it, ``above``)
    and at most ``high``; NaN, infinities and values outside are one line naming the range."""
    noun = "a whole number" if kind is int else "a number"
    shown = {bound: str(bound) if isinstance(bound, int) else f"{bound:g}"  # whole bounds in full (a seed's)
             for bound in (low, high) if bound is not None}
    if low is not None and high is not None and not above:
        wanted = f"{noun} from {shown[low]} to {shown[high]}"
    else:
        bounds = [f"{'more than' if above else 'at least'} {shown[low]}" if low is not None else "",
                  f"at most {shown[high]}" if high is not None else ""]
        wanted = f"{noun} {' and '.join(b for b in bounds if b)}".strip()

    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or (high is not None and value > high) or (
                low is not None and (value <= low if above else value < low)):
            raise argparse.ArgumentTypeError(f"takes {wanted} (got {text!r})")
        return value

    parse.__name__ = wanted  # argparse names a type by it
    return parse


def one_of(*names: str) -> Callable[[str], str]:
    """An argparse ``type``: one of ``names`` (an item of :func:`listed`, where argparse's ``choices`` cannot go)."""

    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"takes one of {', '.join(names)} (got {text!r})")
        return text

    parse.__name__ = "name"
    return parse


def listed(item: Callable[[str], T], *, empty: bool = False) -> Callable[[str], list[T]]:
    """An argparse ``type``: a comma list of ``item``s (an :func:`in_range` or :func:`one_of` type), e.g. ``1,4,16``;
    no items only where ``empty``; a bad item is one line naming it."""

    def parse(text: str) -> list[T]:
        try:
            values = [item(part.strip()) for part in text.split(",") if part.strip()]
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"a comma list whose every item {err}") from None
        if not values and not empty:
            raise argparse.ArgumentTypeError(f"takes a comma list of at least one item (got {text!r})")
        return values

    parse.__name__ = "comma list"
    return parse


def word_or(word: str, item: Callable[[str], T]) -> Callable[[str], T | str]:
    """An argparse ``type``: ``word`` (``auto``, ``frame``: a value the script works out) or an ``item`` (an
    :func:`in_range` type)."""

    def parse(text: str) -> T | str:
        if text == word:
            return text
        try:
            return item(text)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"takes {word} or {str(err).removeprefix('takes ')}") from None

    parse.__name__ = f"{word} or {item.__name__}"
    return parse


def device_name(text: str) -> str:
    """An argparse ``type``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether that GPU is there is
    terra/core/device.py's ``resolve_device``, once torch is loaded)."""
    try:
        return check_device(text)
    except TerraInputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


SEED = in_range(int, 0, MAX_SEED)  # every seed flag (terra/config/checks.py's bound)
THREADS = in_range(int, 1, 1024)  # torch's CPU threads
TEMPERATURE = in_range(float, 0, SAMPLING["temperature"].high)  # sampling.temperature's range (0: greedy)
DRAFT_TOKENS = in_range(int, SAMPLING["draft_tokens"].low, SAMPLING["draft_tokens"].high)  # sampling.draft_tokens


def existing(what: str = "folder", holding: str | None = None) -> Callable[[str], Path]:
    """An argparse ``type``: a ``what`` ("folder" or "file") as given, else relative to the checkout, so the paths the
    docs give from the repository root work from any folder; ``holding``: a file the folder must contain (a
    checkpoint's ``config.json``)."""

    def parse(text: str) -> Path:
        for path in (Path(text).expanduser(), CHECKOUT / text):
            if (path.is_dir() if what == "folder" else path.is_file()) and (
                    holding is None or (path / holding).is_file()):
                return path
        extra = f" with a {holding}" if holding else ""
        raise argparse.ArgumentTypeError(f"{text} is no {what}{extra} (here or in the checkout {CHECKOUT})")

    parse.__name__ = what
    return parse


def compose_config(name: str, overrides: Sequence[str]) -> DictConfig:
    """conf/<name>.yaml with ``overrides``, composed as the apps compose it; a bad override is one line (the apps'
    words, terra/apps/runner.py)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from terra.apps.help import register_schemas
    from terra.apps.runner import CONF_DIR, hydra_error_line

    register_schemas()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            return compose(name, list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise TerraInputError(hydra_error_line(err)) from None


def model_layout(folder: Path) -> TokenLayout:
    """The token layout (terra/contract/layout.py) of the world model in ``folder``; one line naming the folder when
    its config.json is not a world model's."""
    from terra.contract.layout import TokenLayout
    from terra.models.configuration_llama_action import LlamaActionConfig

    try:
        return TokenLayout.from_config(LlamaActionConfig.from_pretrained(folder))
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as err:
        raise TerraInputError(f"{folder}: its config.json is not a world model's ({err})") from None


def model_or(*names: str) -> Callable[[str], str]:
    """An argparse ``type``: one of ``names`` (``demo``, ``tiny``: models a script makes or ships) or a checkpoint
    folder with a config.json, found as :func:`existing` finds it (its path as text)."""
    folder = existing("folder", "config.json")

    def parse(text: str) -> str:
        if text in names:
            return text
        try:
            return str(folder(text))
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"takes {', '.join(names)} or a model folder: {err}") from None

    parse.__name__ = "model"
    return parse


def check_output(path: Path, flag: str, inputs: Iterable[Path] = (), *, folder: bool = False) -> Path:
    """``path``, a file to write, checked before any work: its folder exists and is writable, it is not a folder, and
    it is none of ``inputs`` nor inside an input folder; otherwise one line naming ``flag``. ``folder``: ``path`` is a
    folder the script makes (parents too) or adds to, checked as the apps' output folders are
    (terra/config/output_dir.py)."""
    if folder:
        from terra.config.output_dir import check_output_dir

        check_output_dir(path, (), flag)
    else:
        _check_output_file(path, flag)
    target = path.resolve()
    for source in inputs:
        source = Path(source).resolve()
        if target == source or source in target.parents:
            raise TerraInputError(f"{flag} {path} would overwrite the input {source}; choose another file")
    return path


def _check_output_file(path: Path, flag: str) -> None:
    folder = path.resolve().parent
    if not folder.is_dir():
        raise TerraInputError(f"{flag} {path}: the folder {folder} does not exist; create it or choose another")
    if path.is_dir():
        raise TerraInputError(f"{flag} {path} is a folder; give a file name in it")
    if not os.access(folder, os.W_OK):
        raise TerraInputError(f"{flag} {path}: the folder {folder} is not writable; choose another")


def numbers(text: str, kind: Callable[[str], T], flag: str) -> list[T]:
    """``"1,2,4"`` as ``[1, 2, 4]`` (``kind`` per item; an empty text is no items); one line naming ``flag``
    for anything else."""
    try:
        return [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        noun = {int: "whole numbers", float: "numbers"}.get(kind, "values")
        raise TerraInputError(f"{flag} takes a comma list of {noun}, e.g. 1,4,16 (got {text!r})") from None


def exit_2_on_input_error(name: str) -> Callable[[Callable[..., object]], Callable[..., int]]:
    """A script's ``main(argv)`` whose bad input (:class:`TerraInputError`) is one line ``<name>: error: ...`` on
    stderr and exit code 2; any other result is its exit code when whole, else 0."""

    def wrap(main: Callable[..., object]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(argv: Sequence[str] | None = None) -> int:
            try:
                result = main(argv)
            except TerraInputError as err:
                print(f"{name}: error: {err}", file=sys.stderr)
                return 2
            return result if isinstance(result, int) else 0

        return run

    return wrap


def run_threads(count: int, work: Callable[[int], None]) -> float:
    """``work(i)`` for ``i`` in ``range(count)``, each on its own thread, all at once; the wall time in seconds.
    The first error a thread raised is raised here once all have ended."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            work(i)
        except BaseException as err:  # noqa: BLE001  (raised in the caller's thread)
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    begin = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - begin
    if errors:
        raise errors[0]
    return wall
