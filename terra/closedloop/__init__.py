"""Closed-loop driving: a policy in the loop with a world (the world model, the true world's frames, or a
world of the user's), step by step.

The loop's core, here: loop.py (many drives at once in one world), plans.py (what a policy sees and returns),
worlds.py and user_world.py (the worlds), scenarios.py (where a drive starts), guard.py (every call into user code).
Around it, one concern per sub-package: car/ (how a plan moves the car), policies/ (the built-in policies and the
adapters of AlpaSim's and NAVSIM's drivers), outcomes/ (what a drive is measured by), recording/ (``terra-drive``'s
run: settings, worlds opened, drives recorded, on Ray too), study/ (the fidelity study, a client of the run:
``world=both``), gym/ (the loop as a gymnasium env). Importing this package is light: submodules load what they need.
The modules' old paths (``terra.closedloop.run``, ``terra.closedloop.drivers.vision``, ...) still import until
0.2.0 (terra/core/lazy.py).
"""

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
