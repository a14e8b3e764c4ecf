"""Closed-loop driving: a policy in the loop with the world model (or the synthetic world itself).

:func:`~terra.closedloop.loop.run_drives` drives many scenarios (terra/closedloop/scenarios.py) x policies
(terra/closedloop/policies.py, or any object with ``reset`` / ``plan`` / ``close``) at once in a world
(terra/closedloop/worlds.py: the world model's sessions, or the renderer's true frames);
:func:`~terra.closedloop.run.drive_and_record` records them as batch rollouts are recorded (terra/closedloop/record.py).
Metrics: terra/closedloop/metrics.py (no map), terra/closedloop/truth.py (the synthetic world's ground truth) and
terra/closedloop/plan_following.py (the ACT-Estimator's reading of the clip against the commanded path).
The standard contracts are thin adapters over the loop: terra/closedloop/egodriver.py (AlpaSim's gRPC driver
contract), terra/closedloop/gym_env.py (gymnasium), terra/closedloop/navsim.py (NAVSIM agents). Importing this
package is light: submodules load what they need.
"""
