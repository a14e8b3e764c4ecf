"""``terra-drive``'s settings: a run's and the fidelity study's (``world=both``), with their ranges and help."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from terra.closedloop.recording.config import DriveRunConfig
from terra.config.checks import Range
from terra.config.schema import flag, setting
from terra.core.errors import TerraInputError

UNTIL = ("once", "decided")  # until: the study's num_scenarios once | rounds of more until decided
SHARD_WORLDS = ("all", "engine", "scene")  # which of a study's worlds a process drives (claim_study_folders)
EVERY_WORLD = Range(0, 256, 2, whole=True)  # shard_processes.all, unless cores


def _every_world(value: Any) -> int | str:
    if isinstance(value, str) and value != "cores":
        raise TerraInputError(f"shard_processes.all must be cores (one per core this run may use) or a whole number "
                              f"from 0 to {EVERY_WORLD.high:g} (got {value}); e.g. shard_processes.all=2")
    return value if value == "cores" else EVERY_WORLD.check(value, "shard_processes.all")


@dataclass
class ShardProcessesBlock:
    engine: int = setting(0, "shards of the worlds the world model draws, each with an engine on one of this "
                             "machine's CUDA GPUs, dealt in turn", Range(0, 64, 4, whole=True))
    scene: int = setting(0, "shards of the other worlds (the truth, the scene controls), on the CPU",
                         Range(0, 256, 6, whole=True))
    kv_cache_gib: Optional[float] = setting(None, "vLLM: each engine shard's KV cache (null: vLLM sizes it; give it "
                                                  "with several engines)", Range(0.1, 1024, 2, nullable=True))
    all: Any = setting(0, "shards of every world alike, each a share of every world's drives: a count (0 or 1: the "
                          "study in this process) or cores (one per core this run may use); not with engine or scene",
                       check=_every_world)


@dataclass
class DriveConfig(DriveRunConfig):
    controls: Any = setting(["all"], "worlds known to be wrong, judged beside the model so the verdict is seen to "
                                     "fail: all (every built-in one) or a list; Choices below")
    num_control_scenarios: Optional[int] = setting(None, "the controls drive only the study's first this many "
                                                         "scenarios (null: all)",
                                                   Range(1, 100_000, 8, whole=True, nullable=True))
    num_control_seeds: Optional[int] = setting(None, "the controls drive only the first this many of each scenario "
                                                     "x policy's num_seeds drives (null: all)",
                                               Range(1, 1000, 1, whole=True, nullable=True))
    exploitability: Any = flag(False, "also tune the lane follower inside the model world on half the scenarios "
                                      "and drive its choice in truth on the other half (num_scenarios >= 2)")
    until: str = setting("once", "the study of num_scenarios once, or rounds of more scenarios until every statistic "
                                 "is decided or the budget is spent (docs/fidelity.md, \"Until decided\")",
                         choices=UNTIL)
    until_minutes: Optional[float] = setting(None, "until=decided: no round that would end past this many minutes "
                                                   "(null: no limit)", Range(0.1, 100_000, 30, nullable=True))
    until_scenarios: int = setting(128, "until=decided: at most this many scenarios", Range(2, 100_000, 128,
                                                                                             whole=True))
    within_horizon: Any = flag(False, "each world's statistics judged again within its fidelity horizon")
    shard_worlds: str = setting("all", "the study's worlds this process drives: every one, those the world model "
                                       "draws (engine) or the others (scene); a process of some worlds writes no "
                                       "report",
                                choices=SHARD_WORLDS)
    shard_processes: ShardProcessesBlock = setting(ShardProcessesBlock(), "")
