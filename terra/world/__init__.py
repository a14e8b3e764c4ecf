"""A procedural driving world with exact ground truth, for training and evaluating Terra's demo models.

``Scene.generate(seed)`` builds a road with roadside objects, :func:`render` draws it from any ego pose at any
resolution, :func:`make_clip` / :func:`random_clip` produce 10 Hz clips with their instruction trajectories
and actions, :func:`sample_frames` draws single frames for tokenizer training, and
:mod:`terra.world.dataset` stores clips on disk.
"""

from terra.world.clips import Clip, make_clip, random_clip, sample_frames
from terra.world.renderer import render
from terra.world.scene import Scene

__all__ = ["Clip", "Scene", "make_clip", "random_clip", "render", "sample_frames"]
