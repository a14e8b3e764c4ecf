"""What the Hydra apps and scripts share: configs, resolvers, error lines and how each ends."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

import terra.conf
from terra.apps.help import PAGES, register_help, register_schemas
from terra.config.assets import register_resolvers
from terra.config.checks import did_you_mean, one_line
from terra.config.extras import check_extras
from terra.config.schema import refusal
from terra.core.errors import TerraInputError
from terra.core.progress import shows_bars

CONFIG_PATH = "pkg://terra.conf"
CONF_DIR = str(Path(terra.conf.__file__).resolve().parent)  # the same configs as a folder (initialize_config_dir)

register_resolvers()
register_help()
HELP_FLAGS = ("--help", "-h")
_STARTED_AT = time.time()  # folders changed since are the run's own (remove_empty_run_dir); set again by run_app
# Hydra's flags that print and run nothing: an app's extras are not needed for them
PRINTING_FLAGS = (*HELP_FLAGS, "--cfg", "-c", "--info", "-i", "--hydra-help", "--shell-completion", "-sc")


def hydra_error_line(err: BaseException) -> str:
    """Hydra's / OmegaConf's multi-line message on one line, without the config search path and key details."""
    message, previous_item = "", False
    for line in str(err).splitlines():
        text = line.strip()
        if text.startswith("Config search path"):
            break
        if not text or text.startswith(("full_key:", "object_type=", "reference_type=")):
            continue
        item = line[:1].isspace()  # Hydra lists options as indented lines
        message = f"{message}{', ' if item and previous_item else ' '}{text}" if message else text
        previous_item = item
    return message or type(err).__name__


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's :class:`KeyboardInterrupt`, so the same clean-up runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


@contextmanager
def shielded() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait while the block runs (an app's clean-up after a failure or an interrupt)."""
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def unknown_setting(key: str, command: str, node: Any = None, prefix: str = "") -> str:
    """The line refusing the setting ``key`` no config has, with its near miss among the settings of ``node``."""
    parts = key[len(prefix):].split(".")
    while isinstance(node, (DictConfig, dict)) and len(parts) > 1 and parts[0] in node:
        node, prefix, parts = node[parts[0]], f"{prefix}{parts[0]}.", parts[1:]
    known = [f"{prefix}{k}" for k in node if k != "hydra"] if isinstance(node, (DictConfig, dict)) else []
    return f"unknown setting {key!r}{did_you_mean(prefix + parts[0], known)}; `{command} --cfg job` lists the settings"


def check_added_settings(command: str, allowed: Sequence[str] = (), cfg: DictConfig | None = None) -> None:
    """Refuse ``+key=value`` overrides that add a setting the config lacks, except under the prefixes ``allowed``."""
    overrides = OverridesParser.create().parse_overrides(list(HydraConfig.get().overrides.task))
    for override in overrides:
        key = override.key_or_group
        if (override.type == OverrideType.ADD and not override.is_hydra_override()
                and not key.startswith(tuple(allowed))):
            raise TerraInputError(unknown_setting(key, command, cfg))


def null_group_refusal(arguments: Sequence[str]) -> str:
    """The line refusing ``GROUP=null`` on the command line: a configuration group takes one of its options."""
    for argument in arguments:
        key, _, value = argument.partition("=")
        group = Path(CONF_DIR) / key
        if value in ("null", "~", "") and group.is_dir():
            options = ", ".join(sorted(path.stem for path in group.glob("*.yaml")))
            return f"{key}={value} picks no option of the configuration group {key!r}; choose one of: {options}"
    return "a configuration group was given null; choose one of its options (--help lists them)"


def _hydra_message(err: BaseException, command: str) -> str:
    message = hydra_error_line(err)
    unknown = re.match(r"Could not override '([^']+)'", message)
    if unknown and isinstance(err.__cause__, (ConfigKeyError, ConfigAttributeError)):
        key, cause = unknown.group(1), err.__cause__  # cause.parent_node: the mapping that lacks cause.key
        missing = str(cause.full_key)
        prefix = missing[: -len(str(cause.key))] if key.startswith(missing) else ""
        return unknown_setting(key, command, cause.parent_node, prefix)
    group = isinstance(err, MissingConfigException) and (err.missing_cfg_file or "").rpartition("/")
    if group and group[0] and err.options is not None:  # a config group's option misspelt: model=demoo
        (name, _, option), options = group, list(err.options)
        return f"unknown {name} {option!r}{did_you_mean(option, options)}; choose one of: {', '.join(options)}"
    if isinstance(err, OverrideParseException) and "=" in err.override and (
            "LexerNoViableAlt" in err.message or not err.override.isascii()):
        key, value = err.override.split("=", 1)
        example = f"{key}='{value}'"  # as the shell takes it; a newline in it escaped, so the line stays one
        example = f'"{example}"' if example.isprintable() else one_line(example)
        return (f"cannot parse the override {err.override!r}: quote a value with spaces, non-ASCII letters or "
                f"special characters for Hydra, e.g. {example}")
    return message


def typed_refusal(err: BaseException, prog: str) -> str | None:
    """The schema field's own line for an override its type refuses (``batch_size=abc``), or None."""
    cause = err.__cause__
    page = next((page for page in PAGES.values() if page.prog == prog), None)
    schema = page.schema_class() if page is not None else None
    if not isinstance(cause, ValidationError) or schema is None:
        return None
    return refusal(schema, str(cause.full_key), cause.value)


class _TaskFailed(BaseException):
    """A :func:`task`'s exception, carried past Hydra's job runner to :func:`run_app`."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def task(function: Callable[[Any], None]) -> Callable[[Any], None]:
    """Decorate an app's task so that :func:`run_app` alone reports its errors and a failed one leaves no run folder."""

    @functools.wraps(function)
    def wrapper(cfg: Any) -> None:
        try:
            function(cfg)
        except BaseException as err:
            with shielded():
                remove_empty_run_dir()
            if isinstance(err, Exception):
                raise _TaskFailed(err) from None
            raise

    return wrapper


def remove_empty_run_dir() -> None:
    """Remove the job's run folder when empty, with its empty parents made since the app started."""
    cwd, path = Path.cwd().resolve(), Path(HydraConfig.get().runtime.output_dir).resolve()
    while path != cwd and path.is_dir() and not any(path.iterdir()) and path.stat().st_ctime >= _STARTED_AT - 0.02:
        path.rmdir()
        if cwd not in path.parents:  # a run folder outside the working folder: its parents are not the run's
            return
        path = path.parent


def flags_error(arguments: Sequence[str], prog: str) -> str | None:
    """Why Hydra's command line would refuse ``arguments`` (unknown flag, bad value), in one line, or None."""
    parser = get_args_parser()
    parser.exit_on_error = False
    try:
        _, unknown = parser.parse_known_args(list(arguments))
    except argparse.ArgumentError as err:
        return f"{' '.join(str(err).split())}; see {prog} --help"
    flags = [arg for arg in unknown if arg.startswith("-")]
    if not flags:
        return None
    return f"unknown option {flags[0]!r}; settings are given as KEY=VALUE, options are listed by {prog} --help"


def config_error(app: Callable[[], None], arguments: Sequence[str], prog: str) -> str | None:
    """Why the user's config cannot run ``prog`` (the app's settings it lacks), in one line, or None."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.types import RunMode

    given = get_args_parser().parse_known_args(list(arguments))[0]
    own = next((name for name, page in PAGES.items() if page.prog == prog), None)
    if own is None or (given.config_dir is None and given.config_name is None and given.config_path is None):
        return None

    def composed(name: str, user_dir: str | None, overrides: list[str]) -> DictConfig:
        path = create_automatic_config_search_path(None, app.__module__, given.config_path or CONFIG_PATH)
        if user_dir is not None:
            path.prepend("command-line", f"file://{os.path.abspath(user_dir)}", SearchPathQuery(provider="schema"))
        return ConfigLoaderImpl(config_search_path=path).load_configuration(name, overrides, RunMode.RUN)

    theirs = composed(given.config_name or own, given.config_dir, list(given.overrides))
    missing = [key for key in composed(own, None, []) if key != "hydra" and key not in theirs]
    if not missing:
        return None
    more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
    return (f"the config {given.config_name or own!r} (--config-dir / --config-name) lacks {prog}'s "
            f"settings {', '.join(missing[:4])}{more}; start from a copy of its own config, conf/{own}.yaml")


def with_help_page(arguments: Sequence[str], prog: str) -> list[str]:
    """``arguments`` with the overrides that pick ``prog``'s help page placed before ``--help``."""
    page = ["hydra/help=terra", f"hydra.help.app_name={prog}"]
    given = get_args_parser().parse_known_args(list(arguments))[0].overrides
    at = arguments.index(given[0]) if given else len(arguments)
    return [*arguments[:at], *page, *arguments[at:]]


@contextmanager
def program_voice(prog: str) -> Iterator[None]:
    """The project's log records (``terra`` loggers, INFO and up) on stderr as ``<prog>: ...`` lines."""
    logger = logging.getLogger("terra")
    before = logger.handlers[:], logger.propagate, logger.level
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prog}: %(message)s"))
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.handlers, logger.propagate = before[0], before[1]
        logger.setLevel(before[2])


def console_script(app: Callable[[], None], prog: str, extras: tuple[str, ...] = ()) -> Callable[[], None]:
    """The console-script entry point ``prog`` of the ``@hydra.main`` function ``app``, which needs ``extras``."""

    def main() -> None:
        run_app(app, prog, extras)

    main.__doc__ = f"The ``{prog}`` command."
    return main


def run_app(app: Callable[[], None], prog: str, extras: tuple[str, ...] = ()) -> None:
    """Run ``app``; end with ``<prog>: error: ...`` (exit 2), ``<prog>: interrupted by SIGINT|SIGTERM`` (130 / 143)
    or ``<prog>: internal error: ...`` (1); ``--verbose`` or ``HYDRA_FULL_ERROR=1`` show tracebacks."""
    global _STARTED_AT
    _STARTED_AT = time.time()
    verbose = "--verbose" in sys.argv[1:]
    sys.argv[1:] = [arg for arg in sys.argv[1:] if arg != "--verbose"]
    if not verbose:  # vLLM's engine logs (some 90 lines a start) only when asked; warnings and errors still show
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read when vllm is imported, and by its processes
        if os.environ["VLLM_LOGGING_LEVEL"].upper() == "WARNING":  # also what it logs while importing, before that
            logging.getLogger("vllm").setLevel(logging.WARNING)
    user_wants_traces = verbose or os.environ.get("HYDRA_FULL_ERROR") == "1"
    refused = flags_error(sys.argv[1:], prog)
    if refused is not None:
        print(f"{prog}: error: {refused}", file=sys.stderr)
        sys.exit(2)
    given = get_args_parser().parse_known_args(sys.argv[1:])[0]
    # a config of the user's may name any app's schema; the app's own config, only its own
    register_schemas(None if given.config_name or given.config_dir or given.config_path else prog)
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises config errors instead of printing them and exiting 1
    if not shows_bars():  # no third-party progress bars in logs: an error's one line stands alone
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # Transformers' "Loading weights" too
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        if any(arg in HELP_FLAGS for arg in sys.argv[1:]):  # the app's own page
            sys.argv[1:] = with_help_page(sys.argv[1:], prog)
        if not any(arg.split("=")[0] in PRINTING_FLAGS for arg in sys.argv[1:]):
            check_extras(extras)  # make demo installs no extra: one line naming it, not a traceback
            refused = config_error(app, sys.argv[1:], prog)  # before Hydra writes into its run folder
            if refused is not None:
                raise TerraInputError(refused)
        with program_voice(prog):
            app()
        return
    except _TaskFailed as failed:
        error: BaseException = failed.error
    except (KeyboardInterrupt, Exception) as err:  # Hydra's own errors, and interrupts
        error = err
    finally:
        signal.signal(signal.SIGTERM, previous)
    refusal = typed_refusal(error, prog) if isinstance(error, HydraException) else None
    if refusal is not None:
        error = TerraInputError(refusal)
    if isinstance(error, ValueError) and str(error).startswith("Config group override must be"):
        error = TerraInputError(null_group_refusal(sys.argv[1:]))
    if isinstance(error, (HydraException, OmegaConfBaseException)) and not user_wants_traces:
        print(f"{prog}: error: {_hydra_message(error, prog)}; see {prog} --help", file=sys.stderr)
        sys.exit(2)
    if isinstance(error, TerraInputError):
        print(f"{prog}: error: {error}", file=sys.stderr)
        sys.exit(2)
    if isinstance(error, KeyboardInterrupt):
        signum = error.signum if isinstance(error, Interrupted) else signal.SIGINT
        print(f"{prog}: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        sys.exit(128 + signum)
    if isinstance(error, BrokenPipeError):  # stdout went to a pager or `head` that has quit: nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    if user_wants_traces:
        raise error
    detail = (str(error).strip().splitlines() or [""])[0][:300]
    print(f"{prog}: internal error: {type(error).__name__}{': ' * bool(detail)}{detail} (a bug; rerun with "
          "--verbose for the traceback)", file=sys.stderr)
    sys.exit(1)
