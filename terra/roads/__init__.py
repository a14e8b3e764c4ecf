"""Roads: lane centrelines in a world frame, from wherever a user has them, and the routes they give the world model."""

from terra.roads.clipgt import read_clipgt, write_clipgt
from terra.roads.files import read_road_file, road_from_csv, road_from_json, write_road_file
from terra.roads.follow import route_at, routes_along, told_route_at, told_routes_along
from terra.roads.road import Lane, Road

__all__ = ["Lane", "Road", "read_clipgt", "read_road_file", "road_from_csv", "road_from_json", "route_at",
           "routes_along", "told_route_at", "told_routes_along", "write_clipgt", "write_road_file"]
