"""The inset draws each frame's told route beside its commanded path (decoder/overlay.py): in ROUTE_COLOR where the
route lies, and nowhere on a frame told no route; the colour survives the GIF palette and the MP4 encoder."""

from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest

from terra.contract.routes import route_distances
from terra.decoder.overlay import ROUTE_COLOR, ROUTE_FIT_M, Inset, draw_trajectory
from terra.decoder.writers import write_video
from terra.inputs.actions import actions_for_manoeuvre

FRAMES, HEIGHT, WIDTH = 4, 144, 256  # the demo model's frames


def magenta(pixels: np.ndarray) -> np.ndarray:
    """Where ``pixels`` ``[..., 3]`` have the route's colour (as written, or through a lossy encoder)."""
    r, g, b = (pixels[..., i].astype(int) for i in range(3))
    return (r > 170) & (b > 150) & (g < 130)


def left_route() -> np.ndarray:
    """A route ``[8, 3]`` ``[x, y, s]`` running ahead and to the left at a slope of 0.4."""
    s = route_distances(8).astype(np.float64)
    x = s / np.hypot(1.0, 0.4)
    return np.stack([x, 0.4 * x, s], axis=1)


@pytest.mark.parametrize("suffix", ["gif", "mp4"])
def test_the_route_is_drawn_where_it_lies_on_frames_told_one(tmp_path, suffix):
    frames = np.repeat(np.arange(100, 100 + 4 * FRAMES, 4, dtype=np.uint8), HEIGHT * WIDTH * 3).reshape(
        FRAMES, HEIGHT, WIDTH, 3)  # grey, a shade apart: a GIF merges equal frames
    actions = actions_for_manoeuvre("straight", FRAMES)
    route = left_route()
    routes = np.stack([np.full_like(route, np.nan), route, route, route])  # frame 0 told no route
    drawn = draw_trajectory(frames, actions, routes=routes)
    video = iio.imread(write_video(tmp_path / f"inset.{suffix}", drawn, fps=10), index=None)
    assert video.shape == (FRAMES, HEIGHT, WIDTH, 3)

    near = np.hypot(route[:, 0], route[:, 1]) <= ROUTE_FIT_M  # the documented scale: paths, and routes to 40 m
    reach = 1.1 * max(np.abs(actions[..., :2]).max(), np.abs(route[near, :2]).max())
    inset = Inset.fit(HEIGHT, WIDTH, reach)
    (ax, ay), (bx, by) = inset.pixels(route[:2, [1, 0]], clamp=False)  # its 10 m and 20 m points, (y, x)
    mid = round((ay + by) / 2), round((ax + bx) / 2)
    mirrored = mid[0], round(2 * inset.ego[0] - mid[1])  # the same place on the right: no route there
    for frame in (1, 2):
        assert magenta(video[frame, mid[0] - 1 : mid[0] + 2, mid[1] - 1 : mid[1] + 2]).any(), (suffix, frame)
        assert not magenta(video[frame, mirrored[0] - 2 : mirrored[0] + 3, mirrored[1] - 2 : mirrored[1] + 3]).any()
    assert not magenta(video[0]).any()  # a frame told no route: the colour nowhere
    assert not magenta(drawn[0]).any() and magenta(drawn[1]).sum() > 40
    assert tuple(drawn[1, mid[0], mid[1]]) == ROUTE_COLOR


def test_without_routes_the_inset_is_the_path_alone():
    frames = np.full((2, 60, 90, 3), 110, np.uint8)
    actions = actions_for_manoeuvre("curve_left", 2)
    np.testing.assert_array_equal(draw_trajectory(frames, actions), draw_trajectory(
        frames, actions, routes=np.full((2, 8, 3), np.nan)))
    assert not magenta(draw_trajectory(frames, actions)).any()
