"""A procedural driving world with exact ground truth, for training and evaluating Terra's demo models."""

from terra.sim.clips import Clip, builtin_context, builtin_road, make_clip, random_clip, render_frames, sample_frames
from terra.sim.renderer import render
from terra.sim.scene import Scene

__all__ = ["Clip", "Scene", "builtin_context", "builtin_road", "make_clip", "random_clip", "render", "render_frames",
           "sample_frames"]
