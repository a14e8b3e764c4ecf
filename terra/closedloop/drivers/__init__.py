"""The policies that drive in the loop: the built-in ones, and adapters that let other drivers in.

builtin.py: the built-in policies by name, good to bad (``policies=``), and the factories the run builds them with.
vision.py: camera-only drivers (a lane detector and a steering law). learned.py: a small CNN that reads the lane
from a frame, and imitation.py its behaviour cloning. egodriver.py: AlpaSim's gRPC driver contract. navsim.py:
NAVSIM's agent contract.
"""
