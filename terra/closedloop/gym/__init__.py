"""The loop as a ``gymnasium`` environment (``terra/Drive-v0``).

env.py: one drive (``DriveEnv``) and many drives stepped together (``DriveVectorEnv``), registered with gymnasium.
drives.py: what both envs share (``EnvDrives``): their settings, world and scenarios checked, drives opened and
stepped.
spaces.py: what the agent sees, does (the action modes) and earns (the rewards).
"""
