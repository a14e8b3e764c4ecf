"""Reference policies, good to bad, so that a ranking of policies means something."""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from terra.closedloop.plans import Observation, Plan, Policy, as_plan, policy_seed
from terra.closedloop.policies.vision import (
    BangBang, LaneFollower, PurePursuit, Stanley, find_centre_line, find_road_edge,
)
from terra.config.checks import did_you_mean
from terra.core.errors import TerraInputError
from terra.inputs.ego_motion import compose

CRUISE_SPEED_MPS = 8.0
CAUTIOUS_SPEED_MPS = 4.5
BRAKE_HARD_MPS2 = 6.0  # brake_hard's deceleration (a hard stop, short of an emergency one)


class Degradation:
    """What a degraded ``policy`` shares with it: its reset and close, and whether it holds the GIL as it plans."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    @property
    def gil_bound(self) -> bool:
        return getattr(self.policy, "gil_bound", False)

    def reset(self, scenario) -> None:
        self.policy.reset(scenario)

    def close(self) -> None:
        self.policy.close()


class Latency(Degradation):
    """``policy`` seeing the world ``frames`` steps late (the plan of an old observation is used now)."""

    def __init__(self, policy: Policy, frames: int = 3, name: str | None = None) -> None:
        super().__init__(policy)
        self.frames = frames
        self.name = name or f"{policy.name}_latency{frames}"
        self.seen: deque[Observation] = deque(maxlen=frames + 1)

    def reset(self, scenario) -> None:
        self.seen.clear()
        super().reset(scenario)

    def plan(self, observation: Observation):
        self.seen.append(observation)
        return self.policy.plan(self.seen[0])


def _poses(plan: Plan) -> np.ndarray:
    if plan.poses is None:
        raise TerraInputError("this degradation needs a trajectory plan, not actions")
    return plan.poses if plan.poses.shape[1] == 3 else np.c_[plan.poses, np.zeros(len(plan.poses))]


class Noise(Degradation):
    """``policy`` with each plan turned about the car by a random angle (``std_rad``)."""

    def __init__(self, policy: Policy, std_rad: float = 0.06, name: str | None = None, seed: int = 0) -> None:
        super().__init__(policy)
        self.std_rad, self.seed = std_rad, seed
        self.name = name or f"{policy.name}_noisy"
        self.rng = np.random.default_rng(0)

    def reset(self, scenario) -> None:
        self.rng = np.random.default_rng(policy_seed(self.seed, scenario.id, self.name))
        super().reset(scenario)

    def plan(self, observation: Observation) -> Plan:
        plan = as_plan(self.policy.plan(observation))
        angle = float(self.rng.normal(0.0, self.std_rad))
        return Plan(poses=compose((0.0, 0.0, angle), _poses(plan)), times=plan.times)


class Bias(Degradation):
    """``policy`` with each plan shifted ``metres`` to the left (negative: right), reached within ``ramp_s``."""

    def __init__(self, policy: Policy, metres: float = 1.0, ramp_s: float = 1.0, name: str | None = None) -> None:
        super().__init__(policy)
        self.metres, self.ramp_s = metres, ramp_s
        self.name = name or f"{policy.name}_bias_{'left' if metres > 0 else 'right'}"

    def plan(self, observation: Observation) -> Plan:
        plan = as_plan(self.policy.plan(observation))
        poses = _poses(plan).copy()
        poses[:, 1] += self.metres * np.minimum(plan.times / self.ramp_s, 1.0)
        return Plan(poses=poses, times=plan.times)


CONTRACT_POLICIES = ("route_follower", "constant_speed")  # the egodriver contract's, driven over it in process


def _contract(name: str, timeout_s: float = 30.0) -> Callable[[], Policy]:
    """The contract's reference policy ``name`` over the contract in process, each call within ``timeout_s``."""
    def make() -> Policy:
        from terra.closedloop.policies.egodriver import in_process, reference_driver

        return in_process(reference_driver(name, CRUISE_SPEED_MPS), name, timeout_s)

    return make


def _learned_driver() -> Policy:
    from terra.closedloop.policies.learned import LearnedLane

    return LaneFollower(CRUISE_SPEED_MPS, detect=LearnedLane(), name="learned_driver")


REFERENCE_POLICIES: dict[str, Callable[[], Policy]] = {
    **{name: _contract(name) for name in CONTRACT_POLICIES},
    "lane_follower": lambda: LaneFollower(CRUISE_SPEED_MPS),
    "lane_follower_cautious": lambda: LaneFollower(CAUTIOUS_SPEED_MPS, name="lane_follower_cautious"),
    "lane_follower_far": lambda: LaneFollower(CRUISE_SPEED_MPS, steer=PurePursuit(3.0, 25.0), name="lane_follower_far"),
    "lane_follower_near": lambda: LaneFollower(CRUISE_SPEED_MPS, steer=PurePursuit(0.3, 3.0),
                                               name="lane_follower_near"),
    "lane_follower_stanley": lambda: LaneFollower(CRUISE_SPEED_MPS, steer=Stanley(), name="lane_follower_stanley"),
    "lane_follower_bang_bang": lambda: LaneFollower(CRUISE_SPEED_MPS, steer=BangBang(),
                                                    name="lane_follower_bang_bang"),
    "centre_line_follower": lambda: LaneFollower(CRUISE_SPEED_MPS, detect=find_centre_line,
                                                 name="centre_line_follower"),
    "road_edge_follower": lambda: LaneFollower(CRUISE_SPEED_MPS, detect=find_road_edge, name="road_edge_follower"),
    "learned_driver": _learned_driver,
    "lane_follower_latency": lambda: Latency(LaneFollower(CRUISE_SPEED_MPS), 5, "lane_follower_latency"),
    "lane_follower_noisy": lambda seed=0: Noise(LaneFollower(CRUISE_SPEED_MPS), 0.12, "lane_follower_noisy", seed),
    "lane_follower_bias_left": lambda: Bias(LaneFollower(CRUISE_SPEED_MPS), 1.0, name="lane_follower_bias_left"),
}
RANDOM_POLICIES = frozenset({"lane_follower_noisy"})  # their factories take the run's seed (policy_factories)
PROBE_POLICIES: dict[str, Callable[[], Policy]] = {
    "brake_hard": lambda: LaneFollower(0.0, accel_mps2=BRAKE_HARD_MPS2, name="brake_hard"),
}
# The reference policies that read no pixels: left out of the fidelity verdict's ranking and of all_pixel
NO_PIXELS = frozenset(CONTRACT_POLICIES)
PIXEL_POLICIES = tuple(name for name in REFERENCE_POLICIES if name not in NO_PIXELS)

ALL_REFERENCE = "all_reference"  # a policies entry: every reference policy
ALL_PIXEL = "all_pixel"  # a policies entry: every pixel policy
EXPANSIONS = {ALL_REFERENCE: tuple(REFERENCE_POLICIES), ALL_PIXEL: PIXEL_POLICIES}


def reference_policy(name: str, seed: int = 0) -> Callable[[], Policy]:
    """The factory of a reference policy by name (one line naming the choices otherwise)."""
    known = {**REFERENCE_POLICIES, **PROBE_POLICIES}
    if name not in known:
        raise TerraInputError(f"unknown policy {name!r}{did_you_mean(name, known)}; choose one of: {', '.join(known)}")
    return partial(known[name], seed=seed) if name in RANDOM_POLICIES else known[name]


def policy_names(entries: Sequence[str]) -> list[str]:
    """The policies of ``terra-drive``'s ``policies`` setting by name."""
    names = [name for entry in entries for name in EXPANSIONS.get(entry, [entry])]
    if len(set(names)) != len(names):
        raise TerraInputError(f"policies names one twice ({names}); list each once")
    return names


def policy_args(names: Sequence[str], navsim_args: Any = None) -> dict[str, dict]:
    """The keyword arguments the NAVSIM agents among ``names`` are built with, by policy name."""
    navsim_args = {} if navsim_args is None else navsim_args
    if not isinstance(navsim_args, Mapping):
        raise TerraInputError(f"navsim_args must map NAVSIM agent class names to their keyword arguments (got "
                              f"{navsim_args!r}); e.g. navsim_args={{MyAgent: {{checkpoint_path: /ckpt/agent.pth}}}}")
    agents = {name.rpartition(":")[2]: name for name in names if name.startswith("navsim:")}
    for key, value in navsim_args.items():
        if key not in agents:
            raise TerraInputError(f"navsim_args.{key} names no NAVSIM agent class in policies (its agents: "
                                  f"{', '.join(agents) or 'none'}); key each agent's arguments by its class name")
        if not isinstance(value, Mapping):
            raise TerraInputError(f"navsim_args.{key} must be the keyword arguments of {key}() (got {value!r}); e.g. "
                                  f"navsim_args={{{key}: {{checkpoint_path: /ckpt/agent.pth}}}}")
    return {name: dict(navsim_args[key]) for key, name in agents.items() if key in navsim_args}


def policy_factories(names: Sequence[str], timeout_s: float = 30.0, seed: int = 0,
                     args: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Callable[[], Policy]]:
    """The factories of the policies ``names`` (:func:`policy_names`), each built and checked now."""
    args = args or {}
    return {name: _factory(name, timeout_s, seed, args.get(name)) for name in names}


def _factory(entry: str, timeout_s: float, seed: int, args: Mapping[str, Any] | None) -> Callable[[], Policy]:
    if entry.startswith(("grpc:", "unix:")):
        from terra.closedloop.policies.egodriver import EgodriverPolicy, driver_target

        return partial(EgodriverPolicy, driver_target(entry), entry, timeout_s, seed=seed)  # the target checked now
    if entry.startswith("navsim:"):
        from terra.closedloop.policies.navsim import agent_factory

        name = entry.rpartition(":")[2]
        build = agent_factory(entry, args, timeout_s)  # imported, built and checked now, before any drive

        def agent() -> Policy:
            from terra.closedloop.policies.navsim import NavsimPolicy

            return NavsimPolicy(build(), name)

        return agent
    if entry not in REFERENCE_POLICIES and entry not in PROBE_POLICIES:
        close = did_you_mean(entry, [*REFERENCE_POLICIES, *PROBE_POLICIES, *EXPANSIONS])
        raise TerraInputError(f"policies: unknown policy {entry!r}{close}; use one of {', '.join(REFERENCE_POLICIES)}, "
                              f"{', '.join(PROBE_POLICIES)}, "
                              f"{ALL_REFERENCE}, {ALL_PIXEL}, grpc:HOST:PORT, unix:///PATH or navsim:MODULE:CLASS")
    if entry == "learned_driver":  # its weights read and checked now, before any drive (one line when bad)
        from terra.closedloop.policies.learned import load_path_net

        load_path_net()
    return _contract(entry, timeout_s) if entry in CONTRACT_POLICIES else reference_policy(entry, seed)
