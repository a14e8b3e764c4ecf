"""The policies that drive in the loop: the built-in ones, and adapters that let other drivers in.

builtin.py: the built-in policies by name, good to bad (``policies=``), and the factories the run builds them with.
vision.py: camera-only policies (a lane detector and a steering law). learned.py: a small CNN that reads the lane
from a frame, and imitation.py its behaviour cloning. egodriver.py: AlpaSim's gRPC driver contract. navsim.py:
NAVSIM's agent contract.

This package was ``terra.closedloop.drivers`` (that path still imports until 0.2.0:
terra/closedloop/__init__.py), and ``terra.closedloop.policies`` was the module now ``builtin.py``: its names are still
found here until 0.2.0, with a warning.
"""

from terra.core.lazy import renamed

__getattr__ = renamed(__name__, {name: name for name in (
    "CRUISE_SPEED_MPS", "CAUTIOUS_SPEED_MPS", "BRAKE_HARD_MPS2", "Degradation", "Latency", "Noise", "Bias",
    "CONTRACT_POLICIES", "REFERENCE_POLICIES", "RANDOM_POLICIES", "PROBE_POLICIES", "NO_PIXELS", "PIXEL_POLICIES",
    "ALL_REFERENCE", "ALL_PIXEL", "EXPANSIONS", "reference_policy", "policy_names", "policy_args", "policy_factories",
)}, home=f"{__name__}.builtin")  # until 0.2.0
