"""A procedural driving scene: a curving two-lane road, roadside objects, parked cars and distant hills.

World frame: x forward at yaw 0, y left, yaw counter-clockwise, metres and radians; ``s`` is arc length along the
centreline, ``d`` the lateral offset (left positive). One seed fully determines the scene."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from terra.config.checks import check_choice
from terra.contract.routes import ROUTE_POINT_VALUES, route_distances, routes_from_xy
from terra.core.errors import TerraInputError
from terra.inputs.ego_motion import to_ego
from terra.roads import Lane, Road


LANE_WIDTH_M = 3.5
ROAD_HALF_WIDTH_M = LANE_WIDTH_M  # two lanes
EGO_LANE_OFFSET_M = -LANE_WIDTH_M / 2
SHOULDER_M = 0.9  # gravel band outside each road edge
MAX_HEADING_RAD = 1.2  # the road never turns further than this from +x, so it cannot cross itself

DOMAINS = ("day", "night", "left_hand")  # day is the world the demo models were trained on
LIT_SHARE = 0.6  # at night, the share of street lamps switched on and of buildings with lit windows

# Object kinds (rows of Scene.objects).
TREE, POLE, SIGN, BUILDING, CAR = range(5)


@dataclass(frozen=True)
class Objects:
    """Roadside objects as parallel arrays; each is drawn as a camera-facing billboard."""

    kind: np.ndarray  # [M] int, one of TREE, POLE, SIGN, BUILDING, CAR
    xy: np.ndarray  # [M, 2] world position of the object's foot
    size: np.ndarray  # [M, 2] width, height in metres
    colour: np.ndarray  # [M, 3] main colour (canopy, plate, facade, body), RGB in [0, 1]
    colour2: np.ndarray  # [M, 3] second colour (trunk, pole, roof, cabin)


@dataclass(frozen=True)
class Palette:
    """Colours of one scene (RGB in [0, 1]); the ground's are what it reflects."""

    sky_top: np.ndarray
    haze: np.ndarray  # sky at the horizon and the colour far ground and objects fade to
    hills_far: np.ndarray
    hills_near: np.ndarray
    grass: np.ndarray
    grass_alt: np.ndarray  # second shade of the field checkerboard
    shoulder: np.ndarray
    asphalt: np.ndarray
    edge_line: np.ndarray
    centre_line: np.ndarray


@dataclass(frozen=True)
class Scene:
    """A road (centreline segments), objects along it, hills on the horizon and the colours to draw them."""

    seed: int
    length_m: float
    seg_s0: np.ndarray  # [K] arc length at each segment's start
    seg_len: np.ndarray  # [K] segment lengths
    seg_curv: np.ndarray  # [K] signed curvature (1/m, positive turns left; 0 = straight)
    seg_xyh: np.ndarray  # [K, 3] x, y, heading at each segment's start
    objects: Objects
    hills: np.ndarray  # [2, F, 3] per range: (frequency, amplitude rad, phase) of the skyline's sinusoids
    hills_base: np.ndarray  # [2] mean elevation (rad) of the far and near range
    palette: Palette
    lit: np.ndarray  # [M] bool: at night, the object's lamp is on or its windows are lit (poles, buildings)
    domain: str  # one of DOMAINS
    # margin -> road_outline, made when first asked for
    outlines: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def generate(cls, seed: int, length_m: float = 600.0, domain: str = "day") -> "Scene":
        """Draw a scene from ``seed``: the same seed always gives the same scene in a domain."""
        if not (np.isfinite(length_m) and length_m >= 50.0):
            raise TerraInputError(f"scene length_m must be at least 50 m (got {length_m})")
        check_choice(domain, "domain", DOMAINS)
        rng = np.random.default_rng([int(seed), 0x7E88A])
        s0, lens, curvs, xyh = _road_segments(rng, float(length_m))
        palette = _palette(rng)
        scene = cls(
            seed=int(seed), length_m=float(length_m), seg_s0=s0, seg_len=lens, seg_curv=curvs, seg_xyh=xyh,
            objects=Objects(np.zeros(0, int), np.zeros((0, 2)), np.zeros((0, 2)), np.zeros((0, 3)), np.zeros((0, 3))),
            hills=np.zeros((2, 0, 3)), hills_base=np.zeros(2), palette=palette, lit=np.zeros(0, bool), domain=domain,
        )
        objects = _objects(rng, scene)
        hills, base = _hills(rng)
        lit = rng.random(len(objects.kind)) < LIT_SHARE  # drawn last: the draws above are the same in every domain
        scene = replace(scene, objects=objects, hills=hills, hills_base=base, lit=lit,
                        palette=_night_palette(palette) if domain == "night" else palette)
        return _mirrored(scene) if domain == "left_hand" else scene

    @property
    def ego_lane_offset_m(self) -> float:
        """Lateral offset ``d`` of the ego lane's centre: the right lane, or the left one in ``left_hand`` scenes."""
        return -EGO_LANE_OFFSET_M if self.domain == "left_hand" else EGO_LANE_OFFSET_M

    # ------------------------------------------------------------------------------------------ road geometry

    def road_pose(self, s: np.ndarray | float) -> np.ndarray:
        """``[..., 3]`` centreline pose (x, y, heading) at arc length ``s`` (clamped to the road's ends)."""
        s = np.clip(np.asarray(s, dtype=np.float64), 0.0, self.length_m)
        i = np.clip(np.searchsorted(self.seg_s0, s, side="right") - 1, 0, len(self.seg_s0) - 1)
        return _arc_pose(self.seg_xyh[i], self.seg_curv[i], s - self.seg_s0[i])

    def lane_pose(self, s: np.ndarray | float, d: np.ndarray | float | None = None) -> np.ndarray:
        """``[..., 3]`` pose at arc length ``s`` and lateral offset ``d`` (left positive; None: the ego lane's
        centre), heading along the road."""
        pose = self.road_pose(s)
        d = np.asarray(self.ego_lane_offset_m if d is None else d, dtype=np.float64)
        return np.stack([pose[..., 0] - d * np.sin(pose[..., 2]), pose[..., 1] + d * np.cos(pose[..., 2]),
                         pose[..., 2]], axis=-1)

    def arc_length(self, pose: np.ndarray) -> float:
        """Arc length (m) of the centreline point nearest a world pose ``(x, y, heading)`` (:meth:`road_coords`)."""
        pose = np.asarray(pose, dtype=np.float64)
        return float(self.road_coords(pose[:1], pose[1:2])[0][0])

    def road_coords(self, x: np.ndarray, y: np.ndarray,
                    segments: list[tuple[int, slice]] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Road coordinates ``(s, d)`` of world points: arc length of the nearest centreline point, lateral offset;
        ``segments`` restricts the search to ``(segment index, slice)`` pairs; uncovered points and points past the ends
        get ``d = inf``."""
        dtype = np.result_type(x, y)
        best = np.full(x.shape, np.inf, dtype=dtype)
        s_out = np.zeros(x.shape, dtype=dtype)
        d_out = np.full(x.shape, np.inf, dtype=dtype)
        if segments is None:
            segments = [(i, slice(None)) for i in range(len(self.seg_len))]
        for i, rows in segments:
            x0, y0, h0 = (float(v) for v in self.seg_xyh[i])
            k, length, s0 = float(self.seg_curv[i]), float(self.seg_len[i]), float(self.seg_s0[i])
            dx, dy = x[rows] - x0, y[rows] - y0
            if k == 0.0:
                along = dx * np.cos(h0) + dy * np.sin(h0)
                lat = dy * np.cos(h0) - dx * np.sin(h0)
            else:
                # The arc's centre lies 1/k to the left of its start; phi is the angle swept from the start.
                cx, cy = -np.sin(h0) / k, np.cos(h0) / k
                wx, wy = dx - cx, dy - cy
                phi = np.arctan2(cy * wx - cx * wy, -cx * wx - cy * wy)
                along = phi / k
                lat = (1.0 - abs(k) * np.sqrt(wx * wx + wy * wy)) / k
            clipped = np.clip(along, 0.0, length)
            excess = along - clipped
            dist = excess * excess + lat * lat
            take = dist < best[rows]
            np.copyto(best[rows], dist, where=take)
            np.copyto(s_out[rows], clipped + s0, where=take)
            np.copyto(d_out[rows], np.where(np.abs(excess) > 0.5, np.inf, lat), where=take)
        return s_out, d_out

    def route(self, poses: np.ndarray, points: int) -> np.ndarray:
        """Routes ``[..., K, 3]`` of world ``poses`` ``[..., 3]``: the ego lane's centre ahead, in each pose's ego
        frame."""
        poses = np.asarray(poses, dtype=np.float64)
        flat = poses.reshape(-1, 3)
        s0, _ = self.road_coords(flat[:, 0], flat[:, 1])
        s = np.append(self.seg_s0, self.length_m)  # the segments' ends, and the ego lane's arc length there
        along = s - self.ego_lane_offset_m * (self.road_pose(s)[:, 2] - self.seg_xyh[0, 2])
        reached = np.interp(np.interp(s0, s, along)[:, None] + route_distances(points)[None], along, s)
        forward_left = to_ego(self.lane_pose(reached)[..., :2], flat[:, None])
        return routes_from_xy(forward_left).reshape(poses.shape[:-1] + (points, ROUTE_POINT_VALUES))

    def road_outline(self, margin: float) -> tuple[np.ndarray, np.ndarray]:
        """Segment starts ``[K + 1]`` in points ``[N, 2]`` every 2 m along both road borders widened by ``margin``."""
        if margin not in self.outlines:
            parts = []
            for i in range(len(self.seg_len)):
                s = np.linspace(self.seg_s0[i], self.seg_s0[i] + self.seg_len[i], int(self.seg_len[i] // 2.0) + 2)
                parts.append(self.lane_pose(np.concatenate([s, s]), np.repeat([-margin, margin], len(s)))[:, :2])
            self.outlines[margin] = (np.cumsum([0] + [len(part) for part in parts]),
                                     np.concatenate(parts) if parts else np.zeros((0, 2)))
        return self.outlines[margin]

    def segments_in_view(self, pose: np.ndarray, far: float, half_fov: float) -> list[tuple[int, float, float]]:
        """``(index, nearest, farthest)`` of the segments that may show road from ``pose`` (x, y, yaw) within ``far``
        and ``half_fov``: the forward distances each covers, widened by a margin past the shoulders."""
        margin = ROAD_HALF_WIDTH_M + SHOULDER_M + 2.0
        starts, points = self.road_outline(margin)
        fwd, left = to_ego(points, pose).T
        in_cone = np.abs(left) < np.abs(fwd) * np.tan(half_fov + 0.1) + margin
        seen = (fwd > -margin) & (fwd < far + margin) & in_cone
        found = []
        for i in range(len(self.seg_len)):
            part = slice(starts[i], starts[i + 1])
            if np.any(seen[part]):
                ahead = fwd[part][seen[part]]
                found.append((i, float(ahead.min()) - margin, float(ahead.max()) + margin))
        return found


# ---------------------------------------------------------------------------------------------- generation


def _mirrored(scene: Scene) -> Scene:
    """``scene`` mirrored across the road's starting axis (y -> -y): curves, positions and headings change side."""
    return replace(scene, seg_curv=-scene.seg_curv, seg_xyh=scene.seg_xyh * np.array([1.0, -1.0, -1.0]),
                   objects=replace(scene.objects, xy=scene.objects.xy * np.array([1.0, -1.0])))


def _road_segments(rng: np.random.Generator, length: float):
    """Alternating straights and arcs from the origin heading +x, covering ``length`` metres."""
    lens, curvs = [], []
    total, heading = 0.0, 0.0
    straight = True
    while total < length:
        if straight:
            seg_len, k = rng.uniform(30.0, 110.0), 0.0
        else:
            radius = rng.uniform(60.0, 300.0)
            seg_len = rng.uniform(30.0, 120.0)
            sign = rng.choice([-1.0, 1.0])
            if abs(heading + sign * seg_len / radius) > MAX_HEADING_RAD:
                sign = -sign  # turn back towards +x rather than curl up
            seg_len = min(seg_len, radius * MAX_HEADING_RAD)
            k = sign / radius
        seg_len = min(seg_len, length - total)
        lens.append(seg_len)
        curvs.append(k)
        total += seg_len
        heading += k * seg_len
        straight = not straight
    lens, curvs = np.array(lens), np.array(curvs)
    s0 = np.concatenate([[0.0], np.cumsum(lens)[:-1]])
    xyh = np.zeros((len(lens), 3))
    for i in range(1, len(lens)):
        xyh[i] = _arc_pose(xyh[i - 1], curvs[i - 1], lens[i - 1])
    return s0, lens, curvs, xyh


def _arc_pose(start: np.ndarray, k: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``[..., 3]`` pose ``u`` metres along the arc of curvature ``k`` (0: straight) from pose ``start [..., 3]``."""
    x0, y0, h0 = np.moveaxis(start, -1, 0)
    straight = np.abs(k) < 1e-12
    k_safe = np.where(straight, 1.0, k)
    h = h0 + k * u
    x = np.where(straight, x0 + u * np.cos(h0), x0 + (np.sin(h) - np.sin(h0)) / k_safe)
    y = np.where(straight, y0 + u * np.sin(h0), y0 - (np.cos(h) - np.cos(h0)) / k_safe)
    return np.stack([x, y, h], axis=-1)


def _jitter(rng: np.random.Generator, rgb: tuple[float, float, float], amount: float = 0.04) -> np.ndarray:
    return np.clip(np.array(rgb) + rng.uniform(-amount, amount, 3), 0.0, 1.0)


def _palette(rng: np.random.Generator) -> Palette:
    grass = _jitter(rng, (0.30, 0.55, 0.20), 0.06)
    return Palette(
        sky_top=_jitter(rng, (0.25, 0.45, 0.85)),
        haze=_jitter(rng, (0.78, 0.85, 0.92), 0.03),
        hills_far=_jitter(rng, (0.55, 0.62, 0.75)),
        hills_near=_jitter(rng, (0.28, 0.40, 0.30)),
        grass=grass,
        grass_alt=np.clip(grass * 0.78 + np.array([0.06, 0.02, 0.0]), 0, 1),
        shoulder=_jitter(rng, (0.70, 0.62, 0.45)),
        asphalt=_jitter(rng, (0.27, 0.27, 0.29), 0.03),
        edge_line=np.array([0.97, 0.97, 0.97]),
        centre_line=_jitter(rng, (0.98, 0.85, 0.25), 0.02),
    )


def _night_palette(day: Palette) -> Palette:
    """The night's colours of a scene, derived from the day's: deep blue sky, dark hills, ground unchanged."""
    return replace(day, sky_top=day.sky_top * np.array([0.04, 0.05, 0.10]), hills_far=day.hills_far * 0.06,
                   haze=day.haze * np.array([0.07, 0.08, 0.14]), hills_near=day.hills_near * 0.04)


def _objects(rng: np.random.Generator, scene: Scene) -> Objects:
    """Trees, poles, signs and buildings beside the road; cars parked on the far (left) shoulder."""
    rows: list[tuple[int, float, float, float, float, np.ndarray, np.ndarray]] = []
    sign_colours = [(0.85, 0.12, 0.12), (0.12, 0.30, 0.85), (0.95, 0.80, 0.10), (0.10, 0.60, 0.30)]
    car_colours = [(0.85, 0.15, 0.15), (0.15, 0.35, 0.80), (0.92, 0.92, 0.92), (0.95, 0.65, 0.10), (0.12, 0.12, 0.14)]
    for side in (-1.0, 1.0):
        s = rng.uniform(0.0, 10.0)
        while s < scene.length_m:
            r = rng.random()
            edge = ROAD_HALF_WIDTH_M + SHOULDER_M
            if r < 0.45:
                h = rng.uniform(5.0, 9.0)
                rows.append((TREE, s, side * (edge + rng.uniform(2.0, 9.0)), rng.uniform(2.5, 4.5), h,
                             _jitter(rng, (0.12, 0.38, 0.12), 0.06), _jitter(rng, (0.40, 0.26, 0.14))))
            elif r < 0.70:
                rows.append((POLE, s, side * (edge + rng.uniform(0.5, 1.5)), 0.3, rng.uniform(6.0, 8.0),
                             _jitter(rng, (0.55, 0.55, 0.58)), _jitter(rng, (0.55, 0.55, 0.58))))
            elif r < 0.85:
                rows.append((SIGN, s, side * (edge + rng.uniform(0.3, 1.0)), 1.0, 3.0,
                             np.array(sign_colours[rng.integers(len(sign_colours))]), np.array([0.6, 0.6, 0.62])))
            else:
                rows.append((BUILDING, s, side * (edge + rng.uniform(14.0, 30.0)), rng.uniform(8.0, 16.0),
                             rng.uniform(4.0, 9.0), _jitter(rng, (0.80, 0.70, 0.55), 0.12),
                             _jitter(rng, (0.55, 0.20, 0.15), 0.08)))
            s += rng.uniform(10.0, 28.0)
    s = rng.uniform(20.0, 80.0)
    while s < scene.length_m:
        rows.append((CAR, s, ROAD_HALF_WIDTH_M + 0.45, 1.8, 1.5, np.array(car_colours[rng.integers(len(car_colours))]),
                     np.array([0.15, 0.18, 0.22])))
        s += rng.uniform(60.0, 200.0)
    kind, s_arr, d_arr, w, h, c1, c2 = zip(*rows)
    return Objects(kind=np.array(kind), xy=scene.lane_pose(np.array(s_arr), np.array(d_arr))[:, :2],
                   size=np.stack([w, h], axis=1), colour=np.stack(c1), colour2=np.stack(c2))


def _hills(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Skylines of a far and a near range: sums of sinusoids of azimuth with integer frequencies (seamless)."""
    ranges = []
    for amp in (0.035, 0.025):
        freq = rng.choice(np.arange(2, 16), size=5, replace=False).astype(float)
        amps = amp * rng.uniform(0.3, 1.0, 5) / np.sqrt(freq / 2)  # higher frequencies, smaller bumps
        ranges.append(np.stack([freq, amps, rng.uniform(0, 2 * np.pi, 5)], 1))
    return np.stack(ranges), np.array([0.045, 0.02])


SCENE_ROAD_SPACING_M = 0.25  # a chord's sag on the tightest bend (60 m radius): 0.1 mm
SCENE_LANE_PIECE_M = 100.0  # a lane's pieces, as a map splits lanes at its junctions
EGO_LANE, ONCOMING_LANE = "ego", "oncoming"  # the pieces' ids: "ego-0", "ego-1", ... in driving order


def scene_road(scene: Scene) -> Road:
    """``scene``'s road: two lanes in driving-direction pieces chained by successors, edges as boundaries."""
    ends = np.linspace(0.0, scene.length_m, max(1, round(scene.length_m / SCENE_LANE_PIECE_M)) + 1)
    pieces = [np.linspace(a, b, int(np.ceil((b - a) / SCENE_ROAD_SPACING_M)) + 1) for a, b in zip(ends, ends[1:])]
    lanes = []
    for name, offset, order in ((EGO_LANE, scene.ego_lane_offset_m, pieces),
                                (ONCOMING_LANE, -scene.ego_lane_offset_m, [s[::-1] for s in pieces[::-1]])):
        for i, s in enumerate(order):
            successors = (f"{name}-{i + 1}",) if i + 1 < len(order) else ()
            lanes.append(Lane(scene.lane_pose(s, offset)[:, :2], id=f"{name}-{i}", successors=successors))
    s = np.linspace(0.0, scene.length_m, int(np.ceil(scene.length_m / SCENE_ROAD_SPACING_M)) + 1)
    edges = [scene.lane_pose(s, side * ROAD_HALF_WIDTH_M)[:, :2] for side in (1.0, -1.0)]
    return Road(lanes, edges, source=f"scene {scene.seed} ({scene.domain})", spacing_m=SCENE_ROAD_SPACING_M)
