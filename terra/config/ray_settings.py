"""The ``ray`` block of an ``executor=ray`` run, checked without importing Ray."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields
from typing import Any, Mapping

from terra.config.checks import check_choice, check_number, check_whole_number
from terra.core.errors import TerraInputError, error_line
from terra.core.ray_cluster import INSTALL_RAY

EXECUTORS = ("local", "ray")
MAX_ACTORS = 100_000  # far beyond any cluster: a typo such as 10000000 is refused, not waited for
MAX_RESTARTS = 1000
MAX_RETRIES = 100
# The settings that replaced the per-GPU worker processes (num_gpus, gpus), for the message that says so.
REMOVED = ("executor=ray runs one engine per GPU (or per tensor_parallel_size GPUs) as Ray actors, on a local "
           "Ray cluster when ray.address is unset; ray.num_actors=N caps the engines and CUDA_VISIBLE_DEVICES "
           "picks this machine's GPUs")


@dataclass(frozen=True)
class RaySettings:

    address: str | None = None  # None: a local cluster for this run; "auto": the node's running cluster; host:port
    num_actors: int | None = None  # None: one per GPU group of the cluster (a cluster without GPUs: 1)
    cpus_per_actor: float = 1.0  # CPU cores Ray reserves for each actor
    max_restarts: int = 3  # times Ray restarts an actor that died
    max_retries: int = 2  # times a sample whose actor died is run again before it is recorded as failed
    runtime_env: dict | None = None  # Ray's runtime_env for the workers
    log_to_driver: bool = False  # the actors' own output on the driver's terminal (else in Ray's session logs)

    @classmethod
    def parse(cls, values: Mapping[str, Any] | None) -> "RaySettings":
        """Check the ``ray`` block and build the settings; a user error raises :class:`TerraInputError`."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TerraInputError(f"unknown ray setting(s) {unknown}; known: {sorted(known)}")
        address = values.get("address")
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise TerraInputError(f"ray.address must be auto or host:port (got {address!r}); leave it unset "
                                  "to start a local Ray cluster for the run")
        num_actors = values.get("num_actors")
        if num_actors is not None:
            check_whole_number(num_actors, "ray.num_actors", 1, "ray.num_actors=2", MAX_ACTORS)
        cpus = check_number(values.get("cpus_per_actor", 1.0), "ray.cpus_per_actor", 0, 1024,
                            "ray.cpus_per_actor=1", low_open=True)
        restarts = check_whole_number(values.get("max_restarts", 3), "ray.max_restarts", 0, "ray.max_restarts=3",
                                      MAX_RESTARTS)
        retries = check_whole_number(values.get("max_retries", 2), "ray.max_retries", 0, "ray.max_retries=2",
                                     MAX_RETRIES)
        log_to_driver = values.get("log_to_driver", False)
        if not isinstance(log_to_driver, bool):
            raise TerraInputError(f"ray.log_to_driver must be true or false (got {log_to_driver!r})")
        runtime_env = values.get("runtime_env")
        if runtime_env is not None and not isinstance(runtime_env, Mapping):
            raise TerraInputError(f"ray.runtime_env must be a mapping such as {{working_dir: .}} "
                                  f"(got {type(runtime_env).__name__})")
        return cls(address.strip() if address else None, None if num_actors is None else int(num_actors), cpus,
                   restarts, retries, dict(runtime_env) if runtime_env is not None else None, log_to_driver)


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


def removed_setting(name: str, value: Any) -> None:
    """Raise a :class:`TerraInputError` that explains the replacement when the removed ``num_gpus``/``gpus`` is set."""
    if value is not None:
        raise TerraInputError(f"{name} was removed: {REMOVED}")
