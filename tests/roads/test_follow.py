"""Following a road: the car's lane, forks (the branch the known poses take, else the straightest), the road's end,
no lane near, and the time a route takes on a map of thousands of lanes."""

from __future__ import annotations

import time

import numpy as np
import pytest

from terra.roads import Lane, Road, route_at, routes_along

R = 100.0  # the left branch's radius
FORK_X = 50.0


def arc(theta: np.ndarray) -> np.ndarray:
    """Points of the left branch, leaving the fork at (50, 0) heading +x and turning left."""
    return np.stack([FORK_X + R * np.sin(theta), R * (1.0 - np.cos(theta))], axis=-1)


def y_fork(successors: dict[str, tuple[str, ...]] | None = None) -> Road:
    """A trunk of 50 m along +x that forks into a straight branch and one bending left (radius 100 m)."""
    successors = successors or {}
    lanes = {"trunk": np.stack([np.linspace(0.0, FORK_X, 11), np.zeros(11)], -1),
             "straight": np.stack([np.linspace(FORK_X, 200.0, 31), np.zeros(31)], -1),
             "left": arc(np.linspace(0.0, 1.2, 61))}
    return Road([Lane(points, name, successors.get(name)) for name, points in lanes.items()], source="y fork")


def to_world(route: np.ndarray, pose: np.ndarray) -> np.ndarray:
    forward, left = route[:, 0].astype(np.float64), route[:, 1].astype(np.float64)
    c, s = np.cos(pose[2]), np.sin(pose[2])
    return np.stack([pose[0] + c * forward - s * left, pose[1] + s * forward + c * left], axis=-1)


def distance_to(points: np.ndarray, polyline: np.ndarray) -> np.ndarray:
    fine = np.concatenate([np.linspace(a, b, 51) for a, b in zip(polyline[:-1], polyline[1:])])
    return np.hypot(*(points[:, None] - fine[None]).transpose(2, 0, 1)).min(axis=1)


def test_geometry_chains_the_trunk_into_both_branches():
    road = y_fork()
    ids = [lane.id for lane in road.lanes]
    assert {ids[j] for j in road.next_lanes[ids.index("trunk")]} == {"straight", "left"}
    assert road.next_lanes[ids.index("straight")] == () and road.next_lanes[ids.index("left")] == ()


def test_without_known_poses_a_fork_takes_the_straightest_branch():
    pose = np.array([20.0, -1.0, 0.0])  # in the trunk's lane, 1 m right of its centreline
    route = route_at(y_fork(), pose, 8)
    np.testing.assert_allclose(route[:, 1], 1.0, atol=1e-4)  # the centreline 1 m to the left, straight on
    np.testing.assert_allclose(route[:, 0], np.arange(10.0, 81.0, 10.0), atol=1e-4)
    np.testing.assert_allclose(route[:, 2], np.arange(10.0, 81.0, 10.0))


def test_the_fork_follows_the_branch_the_known_poses_take():
    road, pose = y_fork(), np.array([20.0, -1.0, 0.0])
    ahead = arc(np.linspace(0.05, 0.6, 12))  # the rig trajectory's later poses, on the left branch
    world = to_world(route_at(road, pose, 8, ahead), pose)
    s = 20.0 + np.arange(10.0, 81.0, 10.0)  # along the trunk, then along the arc
    expected = np.where(s[:, None] <= FORK_X, np.stack([s, np.zeros_like(s)], -1), arc((s - FORK_X) / R))
    np.testing.assert_allclose(world, expected, atol=0.02)
    straight_ahead = np.stack([np.linspace(55.0, 120.0, 12), np.zeros(12)], -1)
    np.testing.assert_allclose(to_world(route_at(road, pose, 8, straight_ahead), pose)[:, 1], 0.0, atol=1e-6)


def test_a_trajectory_through_the_fork_is_followed_at_every_frame():
    road = y_fork()
    theta = np.linspace(0.0, 0.5, 26)
    path = np.concatenate([np.stack([np.linspace(0.0, 49.0, 50), np.zeros(50)], -1), arc(theta)])
    heading = np.concatenate([np.zeros(50), theta])
    poses = np.concatenate([path, heading[:, None]], axis=-1)
    routes = routes_along(road, poses, 8)
    assert np.isfinite(routes).all()
    ends = np.stack([to_world(route, pose)[-1] for route, pose in zip(routes, poses)])
    assert distance_to(ends, arc(np.linspace(0.0, 1.2, 121))).max() < 0.02  # every frame's 80 m point: left branch
    known_beyond = arc(np.array([0.3, 0.4]))  # the poses past the last frame, given to the first frames only
    first = routes_along(road, poses[:5], 8, ahead_poses=known_beyond)
    np.testing.assert_allclose(first, routes[:5], atol=1e-5)


def test_just_past_the_fork_the_known_poses_tell_which_branch_the_car_is_on():
    road = y_fork()
    on_left = arc(np.array([0.1]))[0]  # 10 m down the left branch, half a metre right of its centreline: on the
    pose = np.array([on_left[0] + 0.5 * np.sin(0.1), on_left[1] - 0.5 * np.cos(0.1), 0.1])  # straight lane's
    assert np.abs(to_world(route_at(road, pose, 8), pose)[:, 1]).max() < 1e-6  # nearest: straight on
    world = to_world(route_at(road, pose, 8, arc(np.linspace(0.15, 0.6, 10))), pose)
    assert distance_to(world, arc(np.linspace(0.0, 1.2, 121))).max() < 0.02


def test_known_poses_short_of_the_fork_leave_the_straightest_branch():
    road, pose = y_fork(), np.array([5.0, 0.0, 0.0])
    trunk_only = np.stack([np.linspace(10.0, 30.0, 5), np.zeros(5)], -1)
    np.testing.assert_array_equal(route_at(road, pose, 8, trunk_only), route_at(road, pose, 8))


def test_stated_successors_replace_the_geometry():
    road = y_fork({"trunk": ("left", "beyond-the-map"), "left": (), "straight": ()})
    ids = [lane.id for lane in road.lanes]
    assert [ids[j] for j in road.next_lanes[ids.index("trunk")]] == ["left"]  # an id not on the road is dropped
    pose = np.array([20.0, 0.0, 0.0])
    world = to_world(route_at(road, pose, 8), pose)
    assert distance_to(world[-3:], arc(np.linspace(0.0, 1.2, 121))).max() < 0.02


def test_past_the_road_end_the_points_stay_at_the_end():
    road = Road([Lane([[0.0, 0.0], [100.0, 0.0]])])
    route = route_at(road, np.array([60.0, 0.0, 0.0]), 8)
    np.testing.assert_allclose(route[:, 0], [10.0, 20.0, 30.0, 40.0, 40.0, 40.0, 40.0, 40.0], atol=1e-5)


@pytest.mark.parametrize("pose", [[20.0, 4.5, 0.0], [20.0, -1.0, np.pi], [20.0, -1.0, 1.2], [1e5, 0.0, 0.0],
                                  [-30.0, 0.0, 0.0]])
def test_no_lane_near_the_car_is_no_route(pose):
    route = route_at(y_fork(), np.array(pose), 8)
    assert route.shape == (8, 3) and np.isnan(route).all()


def test_a_road_without_lanes_gives_no_route():
    road = Road([])
    assert len(road) == 0 and np.isnan(routes_along(road, np.zeros((3, 3)), 8)).all()


def test_routes_are_fast_on_a_map_of_thousands_of_lanes():
    rng = np.random.default_rng(0)
    lanes = [Lane(np.stack([np.linspace(40.0 * c, 40.0 * c + 40.0, 9), np.full(9, 3.5 * r)], -1))
             for r in range(100) for c in range(50)]  # 100 parallel roads of 2 km in lanes of 40 m
    start = time.perf_counter()
    road = Road(lanes)
    built = time.perf_counter() - start
    poses = np.stack([rng.uniform(0.0, 1900.0, 500), 3.5 * rng.integers(0, 100, 500), np.zeros(500)], -1)
    start = time.perf_counter()
    routes = np.stack([route_at(road, pose, 8) for pose in poses])  # cars all over the map, one frame each
    per_route = (time.perf_counter() - start) / len(poses)
    np.testing.assert_allclose(routes[:, :, 1], 0.0, atol=1e-6)  # each car's own lane, chained lane after lane
    np.testing.assert_allclose(routes[:, :, 0], np.broadcast_to(np.arange(10.0, 81.0, 10.0), (500, 8)), atol=1e-4)
    assert built < 5.0 and per_route < 0.02, (built, per_route)
