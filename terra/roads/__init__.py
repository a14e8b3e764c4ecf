"""Roads: lane centrelines in a world frame, from wherever a user has them, and the routes they give the world model.

One road source, many readers: :class:`Road` (terra/roads/road.py) holds lanes checked once, whatever they came from:
AlpaSim's map (:func:`read_clipgt`, and :func:`write_clipgt` to export one; terra/roads/clipgt.py), a road file in
a trajectory's world frame (:func:`road_from_json`, :func:`road_from_csv`, :func:`read_road_file`, and
:func:`write_road_file` to write one; terra/roads/files.py) or the synthetic scene (``terra.sim.roads.scene_road``).
:func:`route_at` and :func:`routes_along` (terra/roads/follow.py) are the one place a road becomes each frame's route
in the contract's layout (terra/contract/routes.py). numpy only; pyarrow, for AlpaSim's parquet files, is imported
when one is read.
"""

from terra.roads.clipgt import read_clipgt, write_clipgt
from terra.roads.files import read_road_file, road_from_csv, road_from_json, write_road_file
from terra.roads.follow import route_at, routes_along, told_route_at, told_routes_along
from terra.roads.road import Lane, Road

__all__ = ["Lane", "Road", "read_clipgt", "read_road_file", "road_from_csv", "road_from_json", "route_at",
           "routes_along", "told_route_at", "told_routes_along", "write_clipgt", "write_road_file"]
