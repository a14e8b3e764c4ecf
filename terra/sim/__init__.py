"""A procedural driving world with exact ground truth, for training and evaluating Terra's demo models.

``Scene.generate(seed)`` builds a road with roadside objects, by day, at night (:mod:`terra.sim.lighting`) or
mirrored for left-hand traffic (``domain``), :func:`render` draws it from any ego pose at any resolution through the
front camera (:mod:`terra.sim.camera`), :func:`make_clip` / :func:`random_clip` produce 10 Hz clips with their
instruction trajectories and actions, :func:`sample_frames` / :func:`render_frames` draw single frames for tokenizer
training, :func:`builtin_context` gives a run without frames of its own a rendered context, :mod:`terra.sim.dataset`
stores clips on disk as shards and :mod:`terra.sim.logs` as driving logs for terra-prepare-logs.
"""

from terra.sim.clips import Clip, builtin_context, builtin_road, make_clip, random_clip, render_frames, sample_frames
from terra.sim.renderer import render
from terra.sim.scene import Scene

__all__ = ["Clip", "Scene", "builtin_context", "builtin_road", "make_clip", "random_clip", "render", "render_frames",
           "sample_frames"]
