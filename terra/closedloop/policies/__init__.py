"""The policies that drive in the loop: the built-in ones, and adapters that let other drivers in."""

from terra.core.lazy import renamed

__getattr__ = renamed(__name__, {name: name for name in (
    "CRUISE_SPEED_MPS", "CAUTIOUS_SPEED_MPS", "BRAKE_HARD_MPS2", "Degradation", "Latency", "Noise", "Bias",
    "CONTRACT_POLICIES", "REFERENCE_POLICIES", "RANDOM_POLICIES", "PROBE_POLICIES", "NO_PIXELS", "PIXEL_POLICIES",
    "ALL_REFERENCE", "ALL_PIXEL", "EXPANSIONS", "reference_policy", "policy_names", "policy_args", "policy_factories",
)}, home=f"{__name__}.builtin")  # until 0.2.0
