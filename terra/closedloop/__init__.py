"""Closed-loop driving: a policy in the loop with a world, step by step."""

from terra.core.lazy import moved_modules

MOVED_MODULES = moved_modules(__name__, {
    "vehicle": "car.vehicle", "tracking": "car.tracking", "motion": "car.motion", "reference": "car.path",
    "vision": "policies.vision", "learned": "policies.learned", "imitation": "policies.imitation",
    "egodriver": "policies.egodriver", "navsim": "policies.navsim", "drivers": "policies",
    **{f"drivers.{name}": f"policies.{name}" for name in ("builtin", "vision", "learned", "imitation", "egodriver",
                                                          "navsim")},
    "truth": "outcomes.truth", "alpasim_metrics": "outcomes.alpasim", "metrics": "outcomes.mapless",
    "plan_following": "outcomes.plan_following", "drive_fidelity": "outcomes.frames",
    "record": "recording.files", "run": "recording.run", "settings": "recording.settings",
    "prepare": "recording.open_run", "drives": "recording.drives", "ray_executor": "recording.ray_executor",
    "fidelity": "study.report", "control_worlds": "study.control_worlds", "verdict": "study.verdict",
    "exploit_drives": "study.exploit", "gym_env": "gym.env", "gym_spaces": "gym.spaces",
})
