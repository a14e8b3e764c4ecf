"""The Ray cluster of a run with ``executor=ray``: joined or started locally, its actors sized, Ray's errors as one
line."""

from __future__ import annotations

import logging
import re
import socket
from typing import Any, Protocol

from terra.core.errors import TerraInputError, error_line

INSTALL_RAY = "pip install 'terra-world-model[ray]' on this machine and every node, or use executor=local"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CAUSE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_HELP = "docs/rollout.md, \"Running across nodes\""


class ClusterSettings(Protocol):
    """What :class:`RayCluster` reads of a run's checked ``ray`` block."""

    address: str | None
    num_actors: int | None
    cpus_per_actor: float
    max_restarts: int
    runtime_env: dict | None
    log_to_driver: bool


class RayCluster:
    """A run's Ray cluster: :meth:`connect` before any output is written, :meth:`close` at the end."""

    def __init__(self, settings: ClusterSettings, device: str, tensor_parallel_size: int = 1) -> None:
        self.settings = settings
        self.device = device
        self.tensor_parallel_size = tensor_parallel_size
        self.ray: Any = None
        self.joined = False  # this run called ray.init (and so calls ray.shutdown)
        self.count, self.options = 0, {}  # the actors: how many, their ray.remote options (set by connect)

    def connect(self) -> None:
        """Import Ray, join the cluster (or start a local one) and check that it has room for the actors."""
        self._join()
        try:
            self.count, self.options = self.actor_options()
        except BaseException:
            self.close()
            raise

    def _join(self) -> None:
        try:
            import ray
        except ImportError as err:
            raise TerraInputError(f"executor=ray needs Ray ({error_line(err)}): {INSTALL_RAY}") from None
        self.ray = ray
        if ray.is_initialized():
            return
        address = self.settings.address
        if address not in (None, "auto", "local"):
            check_reachable(address)
        options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": self.settings.log_to_driver}
        if address in (None, "local"):  # a cluster of this machine, for this run
            options["include_dashboard"] = False
        try:
            ray.init(address=address, **options)
        except (ConnectionError, TimeoutError) as err:
            raise TerraInputError(f"ray.address={address}: no Ray cluster to join ({error_line(err)}); start one with "
                                  "`ray start --head`, or leave ray.address unset for a local one") from None
        self.joined = True

    def close(self) -> None:
        """Leave the cluster if this run joined it (a local cluster it started stops)."""
        if self.joined and self.ray is not None and self.ray.is_initialized():
            self.ray.shutdown()
        self.joined = False

    def actor_options(self) -> tuple[int, dict[str, Any]]:
        """How many actors, and their ``ray.remote`` options, for the cluster's resources and this run's settings."""
        ray, settings, device, tp = self.ray, self.settings, self.device, self.tensor_parallel_size
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), float(resources.get("CPU", 0))
        on_gpus = device != "cpu" and gpus > 0
        if device.startswith("cuda") and gpus == 0:
            raise TerraInputError(f"device={device} but the Ray cluster has no GPUs; use device=auto or cpu")
        if on_gpus:
            groups = gpus // tp
            count = settings.num_actors or groups
            if groups == 0 or count > groups:
                raise TerraInputError(f"{count or 1} actor(s) of tensor_parallel_size={tp} need {(count or 1) * tp} "
                                      f"GPU(s) but the Ray cluster has {gpus}; lower ray.num_actors")
        else:
            count = settings.num_actors or 1
            if count * settings.cpus_per_actor > cpus:
                raise TerraInputError(f"ray.num_actors={count} x ray.cpus_per_actor={settings.cpus_per_actor:g} "
                                      f"needs more CPUs than the Ray cluster has ({cpus:g})")
        options = {"num_cpus": settings.cpus_per_actor, "num_gpus": tp if on_gpus else 0,
                   "max_restarts": settings.max_restarts, "max_task_retries": 0,  # the driver retries (bounded)
                   "max_concurrency": 10_000}  # calls are coroutines waiting for their records: cheap
        if settings.runtime_env:
            options["runtime_env"] = settings.runtime_env
        return count, options


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Raise :class:`TerraInputError` unless something accepts TCP connections at ``address``."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise TerraInputError(f"ray.address={address} is not auto or host:port (e.g. 10.0.0.1:6379)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise TerraInputError(f"ray.address={address}: no Ray cluster answers there ({err.strerror or err}); start "
                              "the head node with `ray start --head`, or fix the address") from None


def cause(err: BaseException) -> str:
    """The last ``SomeError: message`` line of a Ray error's text (it carries the remote traceback)."""
    lines = _ANSI.sub("", str(err)).splitlines()
    for line in reversed(lines):
        match = _CAUSE.match(line)
        if match:
            return f"{match.group(1)}: {match.group(2).strip()}"
    return " ".join((lines or [type(err).__name__])[0].split())[:300]


def start_failure(err: BaseException) -> TerraInputError:
    """The one line for an actor that died while starting: most often a node without the project."""
    text = _ANSI.sub("", str(err))
    node = re.search(r"\bip=([\w.:-]+)", text)
    where = f" on {node.group(1)}" if node else ""
    why = cause(err)
    if "failed to import" in text or re.match(r"(ModuleNotFound|Import)Error", why):
        return TerraInputError(f"Ray workers{where} cannot import the project ({why}); install it on every node "
                               f"(pip install 'terra-world-model[ray]') or ship it with ray.runtime_env ({_HELP})")
    return TerraInputError(f"a Ray actor{where} died while starting: {why}")
