"""What a drive is measured by; each module reads a finished drive and returns numbers for its record.

truth.py: the drive's poses in the true scene (lane offset, off road, collisions). alpasim.py: AlpaSim's metrics and
scene score. mapless.py: progress, comfort and plan consistency (no map needed). plan_following.py: whether the clip
shows the commanded motion (the ACT-Estimator). frames.py: a drive's frames against the true renders at its poses
(the measurements the fidelity study judges).
"""
