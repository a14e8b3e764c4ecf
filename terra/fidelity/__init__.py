"""Measurements of a world model as a driving simulator, each with its uncertainty and each shown to fail on worlds
known to be wrong.

Pure functions of frames, poses and per-drive records; no model is loaded. Their intervals are terra/stats.py's (the
cluster bootstrap over scenarios, on the floor below the closed loop, which reports with it too).
:mod:`~terra.fidelity.odometry` (the ego motion recovered from two consecutive frames on the road plane, weight-free),
:mod:`~terra.fidelity.following` (that motion against the commanded one), :mod:`~terra.fidelity.agreement` (a
world's frames against the true renders at the same poses: the lane detector's reading, PSNR / SSIM by horizon, the
temporal lag), :mod:`~terra.fidelity.lanes` (the ego lane read from a frame's markings, which the closed loop's
camera-only follower steers by too) and :mod:`~terra.fidelity.exploit` (a driver tuned inside one world, driven in the
other). Importing them loads numpy and scipy, no torch.
"""
