"""The one boundary between the loop and user code: policies, NAVSIM agents, gRPC drivers' clients."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future, TimeoutError as FuturesTimeout
from enum import Enum
from pathlib import PurePath
from types import ModuleType
from typing import Any, Callable

import numpy as np

from terra.core.errors import TerraInputError, error_line


class UserCodeError(Exception):
    """A call into user code failed or overran its deadline; ``str()`` is one line naming who, the call and why."""


class UserCall:
    """``function(*args)``, user code of ``who`` doing ``call``, on a daemon thread of its own or queued on ``line``."""

    def __init__(self, who: str, call: str, function: Callable[..., Any], *args: Any,
                 line: "CallLine | None" = None) -> None:
        self.who, self.call, self.line = who, call, line
        self.started = time.perf_counter()
        self._began = threading.Event()
        self._future: Future = Future()
        if line is None:
            threading.Thread(target=self._run, args=(function, args), name="terra-user-code", daemon=True).start()
        else:
            line.queue(self, function, args)

    def _run(self, function: Callable[..., Any], args: tuple) -> None:
        self._began.set()  # (a call of a line: its start is when the line took it)
        if self._future.set_running_or_notify_cancel():
            try:
                self._future.set_result(function(*args))
            except BaseException as err:  # noqa: BLE001  (handed to result(), which judges it)
                self._future.set_exception(err)

    def returned(self, timeout_s: float) -> Any:
        """The call's value or exception, or :class:`UserCodeError` when not returned ``timeout_s`` after it started."""
        try:
            if not self._began.wait(timeout_s):
                raise FuturesTimeout
            return self._future.result(timeout=max(0.0, self.started + timeout_s - time.perf_counter()))
        except FuturesTimeout:
            if self.line is not None:
                self.line.leave(self)
            raise UserCodeError(f"{self.who} timed out after {timeout_s:g} s in {self.call}") from None

    def result(self, timeout_s: float) -> Any:
        """The call's value once it returns, at most ``timeout_s`` after it started."""
        try:
            return self.returned(timeout_s)
        except (UserCodeError, KeyboardInterrupt):
            raise
        except BaseException as err:  # noqa: BLE001  (SystemExit included: user code does not end the run)
            raise UserCodeError(f"{self.who} failed in {self.call}: {reason(err)}") from None


class CallLine:
    """User calls run one after another on one daemon thread, each under a deadline from its own start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._emptied = threading.Condition(self._lock)  # notified when no thread serves the line any more
        self._waiting: deque[tuple[UserCall, Callable[..., Any], tuple]] = deque()
        self._current: UserCall | None = None
        self._serving: int | None = None  # the ticket of the thread serving the line (None: none)
        self._tickets = 0

    def queue(self, call: UserCall, function: Callable[..., Any], args: tuple) -> None:
        with self._lock:
            self._waiting.append((call, function, args))
            if self._serving is None:
                self._serve_anew()

    def leave(self, call: UserCall) -> None:
        """``call`` overran its deadline: one still waiting never runs."""
        with self._lock:
            self._waiting = deque(entry for entry in self._waiting if entry[0] is not call)
            if self._current is call and not call._future.done():
                self._leave_current()

    def drain(self, timeout_s: float) -> None:
        """Wait until every queued call has returned or been left behind ``timeout_s`` after it started."""
        with self._lock:
            while self._serving is not None:
                current = self._current
                if current is None:  # a new serving thread has not taken its first call yet
                    self._emptied.wait(1e-3)
                    continue
                left = current.started + timeout_s - time.perf_counter()
                if left <= 0 and not current._future.done():
                    self._leave_current()
                else:
                    self._emptied.wait(max(left, 1e-3))

    def _leave_current(self) -> None:
        """(Lock held.) Leave the running call on its thread; a new thread serves the rest, if any."""
        self._current = self._serving = None
        if self._waiting:
            self._serve_anew()
        else:
            self._emptied.notify_all()

    def _serve_anew(self) -> None:
        self._tickets += 1
        self._serving = self._tickets
        threading.Thread(target=self._serve, args=(self._tickets,), name="terra-user-code", daemon=True).start()

    def _serve(self, ticket: int) -> None:
        while True:
            with self._lock:
                if self._serving != ticket:
                    return  # left behind: another thread serves the line
                if not self._waiting:
                    self._serving = self._current = None
                    self._emptied.notify_all()
                    return
                call, function, args = self._waiting.popleft()
                call.started, self._current = time.perf_counter(), call
            call._run(function, args)


def user_call(who: str, call: str, timeout_s: float, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` behind the boundary (:class:`UserCall`), waited for up to ``timeout_s``."""
    return UserCall(who, call, function, *args).result(timeout_s)


def reason(err: BaseException) -> str:
    """Why a call into user code failed, as one phrase."""
    if isinstance(err, SystemExit):
        return f"it called sys.exit({err.code!r})"
    line = error_line(err)
    if isinstance(err, ValueError) and "read-only" in str(err):
        line += " (what user code is handed is read-only: copy an array before changing it)"
    return line


IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), np.generic, PurePath, Enum, range, type)


def handed(value: Any) -> Any:
    """``value`` as user code gets it: arrays as read-only copies."""
    if isinstance(value, np.ndarray):
        array = np.array(value, copy=True, subok=False)
        array.flags.writeable = False
        return array
    if isinstance(value, IMMUTABLE):
        return value
    if type(value) in (tuple, list):
        return type(value)(handed(item) for item in value)
    if type(value) is dict:
        return {key: handed(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        views = {name: handed(item) for name, item in fields.items()}
        if value.__dataclass_params__.frozen and all(views[name] is item for name, item in fields.items()):
            return value  # nothing in it to make read-only, and nothing of it can be changed: shared as it is
        return dataclasses.replace(value, **views)
    return copy.deepcopy(value)


def user_module(module: str) -> ModuleType:
    """The user's module ``module`` (``name`` or ``package.sub``)."""
    top = module.partition(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
    if spec is not None:
        known = importlib.util.find_spec(top)  # the module of that name imported already, or on sys.path
        if known is None:
            found = importlib.util.module_from_spec(spec)
            sys.modules[top] = found
            try:
                if spec.loader is not None:
                    spec.loader.exec_module(found)
            except BaseException:
                sys.modules.pop(top, None)
                raise
        elif _place(known) != _place(spec):
            raise ImportError(f"the working folder's {top} has the name of another module ({_place(known)}); "
                              "rename yours")
    return importlib.import_module(module)


def _place(spec: importlib.machinery.ModuleSpec) -> str:
    """Where a module's code is: its file, or a namespace package's folders."""
    return spec.origin if spec.origin not in (None, "namespace") else ", ".join(spec.submodule_search_locations or [])


def user_class(module: str, name: str, where: str, fix: str, timeout_s: float) -> type:
    """The class ``module.name`` of user code, imported behind the boundary within ``timeout_s``."""
    try:
        found = UserCall(f"{where}: importing {module}", "its import", _attribute, module, name).returned(timeout_s)
    except UserCodeError as err:
        raise TerraInputError(f"{err}; fix the module, or raise policy_timeout_s if its import is slow") from None
    except ImportError as err:
        raise TerraInputError(f"{where} ({type(err).__name__}: {err}); {fix}, importable from the working folder "
                              "or PYTHONPATH") from None
    except (Exception, SystemExit) as err:  # noqa: BLE001  (the user's module failed to run: its line, no trace)
        raise TerraInputError(f"{where}: importing {module} failed: {reason(err)}; fix the module") from None
    if not inspect.isclass(found):
        what = "nothing" if found is None else f"a {type(found).__name__}"
        raise TerraInputError(f"{where}: {module}.{name} is {what}, not a class; {fix}")
    return found


def _attribute(module: str, name: str) -> Any:
    """``module.name`` (None when there is none): the import and the lookup, both user code, behind the boundary."""
    return getattr(user_module(module), name, None)
