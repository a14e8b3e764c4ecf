"""The one boundary between the loop and user code: policies, NAVSIM agents, gRPC drivers' client objects.

Every call into user code (build, reset, plan, close: terra/closedloop/loop.py) is a :class:`UserCall`: it runs on
a daemon thread of its own, and its :meth:`~UserCall.result` turns what can go wrong into :class:`UserCodeError`,
one line naming the policy and the call, which ends that drive only:

* any ``Exception``, and ``SystemExit`` (an agent that calls ``sys.exit`` ends its drive, not the run);
  ``KeyboardInterrupt`` propagates (Ctrl-C stops the run, as everywhere);
* a call that has not returned by its deadline: it is abandoned on its thread (a daemon thread cannot keep the
  process from exiting) and the drive goes on without it.

What user code is handed is read-only (:func:`handed`): the numpy arrays of an observation or a scenario are views
that cannot be written, so a policy that changes its camera frames in place cannot change the recorded video or
another drive's context; such a write fails its drive with a line saying so. Views cost nothing per step, where
copies of every drive's frame history would cost a copy per plan; and a write is caught, not silently dropped.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future, TimeoutError as FuturesTimeout
from typing import Any, Callable

import numpy as np

from terra.core.errors import error_line


class UserCodeError(Exception):
    """A call into user code failed or overran its deadline; ``str()`` is one line naming who, the call and why."""


class UserCall:
    """``function(*args)``, user code of ``who`` (e.g. ``policy lane_follower``) doing ``call`` (e.g. ``plan at
    step 3``), started now on a daemon thread of its own."""

    def __init__(self, who: str, call: str, function: Callable[..., Any], *args: Any) -> None:
        self.who, self.call = who, call
        self.started = time.perf_counter()
        self._future: Future = Future()
        threading.Thread(target=self._run, args=(function, args), name="terra-user-code", daemon=True).start()

    def _run(self, function: Callable[..., Any], args: tuple) -> None:
        if self._future.set_running_or_notify_cancel():
            try:
                self._future.set_result(function(*args))
            except BaseException as err:  # noqa: BLE001  (handed to result(), which judges it)
                self._future.set_exception(err)

    def result(self, timeout_s: float) -> Any:
        """The call's value once it returns, at most ``timeout_s`` after it started; otherwise
        :class:`UserCodeError` (``KeyboardInterrupt`` raised by the call propagates)."""
        try:
            return self._future.result(timeout=max(0.0, self.started + timeout_s - time.perf_counter()))
        except FuturesTimeout:
            raise UserCodeError(f"{self.who} timed out after {timeout_s:g} s in {self.call}") from None
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # noqa: BLE001  (SystemExit included: user code does not end the run)
            raise UserCodeError(f"{self.who} failed in {self.call}: {reason(err)}") from None


def user_call(who: str, call: str, timeout_s: float, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` behind the boundary (:class:`UserCall`), waited for up to ``timeout_s``."""
    return UserCall(who, call, function, *args).result(timeout_s)


def reason(err: BaseException) -> str:
    """Why a call into user code failed, as one phrase."""
    if isinstance(err, SystemExit):
        return f"it called sys.exit({err.code!r})"
    line = error_line(err)
    if isinstance(err, ValueError) and "read-only" in str(err):
        line += " (what a policy is handed is read-only: copy an array before changing it)"
    return line


def read_only(array: np.ndarray) -> np.ndarray:
    """A view of ``array`` that cannot be written through."""
    view = np.asarray(array).view()
    view.flags.writeable = False
    return view


def handed(value: Any) -> Any:
    """The frozen dataclass ``value`` (an observation, a scenario) as user code gets it: each numpy array field,
    and each tuple of arrays, as read-only views; the rest as it is."""
    def frozen(item: Any) -> Any:
        if isinstance(item, np.ndarray):
            return read_only(item)
        if isinstance(item, tuple) and item and all(isinstance(x, np.ndarray) for x in item):
            return tuple(read_only(x) for x in item)
        return item

    return dataclasses.replace(value, **{f.name: frozen(getattr(value, f.name))
                                         for f in dataclasses.fields(value) if f.init})
