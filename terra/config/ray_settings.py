"""The ``ray`` block of an ``executor=ray`` run, checked without importing Ray."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional

from terra.config.checks import Range, check_choice
from terra.config.schema import block_settings, flag, setting
from terra.core.errors import TerraInputError, error_line
from terra.core.ray_cluster import INSTALL_RAY

EXECUTORS = ("local", "ray")
MAX_ACTORS = 100_000  # far beyond any cluster: a typo such as 10000000 is refused, not waited for
MAX_RESTARTS = 1000
MAX_RETRIES = 100


def _address(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TerraInputError(f"ray.address must be auto or host:port (got {value!r}); leave it unset to start a "
                              "local Ray cluster for the run")
    return value.strip() if value else None


def _runtime_env(value: Any) -> dict | None:
    if value is not None and not isinstance(value, Mapping):
        raise TerraInputError(f"ray.runtime_env must be a mapping such as {{working_dir: .}} (got "
                              f"{type(value).__name__})")
    return None if value is None else dict(value)


@dataclass
class RayBlock:
    address: Optional[str] = setting(None, "null: a local Ray cluster started for the run; auto: the cluster `ray "
                                           "start` joined this node to; host:port (ray://host:10001 for Ray Client)",
                                     check=_address)
    num_actors: Optional[int] = setting(None, "null: one per GPU (group) of the cluster; on a cluster without GPUs "
                                              "(or device=cpu): 1", Range(1, MAX_ACTORS, 2, whole=True, nullable=True))
    cpus_per_actor: float = setting(1.0, "CPU cores Ray reserves per actor", Range(0, 1024, 1, low_open=True))
    max_restarts: int = setting(3, "times Ray restarts an actor that died", Range(0, MAX_RESTARTS, 3, whole=True))
    max_retries: int = setting(2, "times a sample whose actor died runs again before it is recorded as failed",
                               Range(0, MAX_RETRIES, 2, whole=True))
    # Any: +ray.runtime_env.working_dir=. adds to a null block
    runtime_env: Any = setting(None, "Ray runtime_env for the actors, e.g. {pip: [/shared/terra]} (installs the vLLM "
                                     "plugin's entry point; docs/rollout.md)", check=_runtime_env)
    log_to_driver: Any = flag(False, "true: the actors' own output (vLLM's logs, tracebacks) here too; false: only "
                                     "in Ray's session logs (/tmp/ray/session_latest/logs on each node)")


@dataclass(frozen=True)
class RaySettings:
    """The ``ray`` block, checked."""

    address: str | None = None
    num_actors: int | None = None
    cpus_per_actor: float = RayBlock.cpus_per_actor
    max_restarts: int = RayBlock.max_restarts
    max_retries: int = RayBlock.max_retries
    runtime_env: dict | None = None
    log_to_driver: bool = RayBlock.log_to_driver

    @classmethod
    def parse(cls, values: Mapping[str, Any] | None) -> "RaySettings":
        """Check the ``ray`` block and build the settings; a user error raises :class:`TerraInputError`."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TerraInputError(f"unknown ray setting(s) {unknown}; known: {sorted(known)}")
        return cls(**{name: item.check(values.get(name, item.default))
                      for name, item in block_settings(RayBlock, "ray").items()})


def check_executor(value: Any) -> str:
    """The ``executor`` setting checked: one of :data:`EXECUTORS`, ``ray`` only where Ray imports."""
    executor = check_choice(value, "executor", EXECUTORS)
    if executor == "ray":
        if importlib.util.find_spec("ray") is None:
            raise TerraInputError(f"executor=ray needs Ray, which is not installed here: {INSTALL_RAY}")
        try:
            importlib.import_module("ray")
        except Exception as err:  # noqa: BLE001  (whatever a broken install raises: one line)
            raise TerraInputError(f"executor=ray needs Ray, which does not import here ({error_line(err, 200)}): "
                                  f"{INSTALL_RAY}") from None
    return executor

