"""``terra-evaluate``'s phases, kept as they finish, so that an interrupted run loses only the phase it was in."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from terra.config.checks import one_line, shown
from terra.config.files import checkpoint_digest
from terra.core.atomic import json_text, write_text
from terra.evaluation.settings import PHASE_TITLES, EvaluateSpec

CHECKPOINTS = {"world_model": "the world model", "tokenizer": "the tokenizer"}  # inputs given as digests
RUN_SETTINGS = {"overlap": "model.overlap", "zero_embed_code_0": "model.zero_embed_code_0",
                "resize": "tokenizer.resize"}  # RunSpec.output_settings' keys → the settings' names (conf/)


@dataclass
class Phase:
    """A phase of a run: its inputs, and what an earlier run into the folder left of it."""

    key: str  # the report's key and the file's stem
    inputs: dict[str, Any]  # as JSON gives them back
    kept: dict | None = None  # an earlier run's record made with the same inputs: reused
    why: str | None = None  # why an earlier run's record is not reused (None: there was none, or it is)
    done: bool = False  # measured and kept by this run

    @property
    def title(self) -> str:
        return PHASE_TITLES[self.key]

    @property
    def file(self) -> str:
        return f"{self.key}.json"


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"sampling": {"top_k": 0}}`` → ``{"sampling.top_k": 0}``."""
    flat = {}
    for key, value in values.items():
        name = prefix + RUN_SETTINGS.get(key, key)
        flat.update(_flat(value, f"{name}.") if isinstance(value, dict) else {name: value})
    return flat


def phase_inputs(spec: EvaluateSpec, engine: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each measured phase's inputs, in run order; ``engine``: the resolved ``backend`` and ``device``."""
    run = spec.run
    shared = {"world_model": checkpoint_digest(run.world_model), "tokenizer": checkpoint_digest(run.tokenizer),
              **engine, "dtype": run.dtype, **_flat(run.output_settings()), "horizon": spec.horizon,
              "seed": spec.seed, "domain": spec.domain,
              **_flat({"exclude_training": asdict(spec.exclude_training)})}
    own = {"quality": (spec.quality.num_clips, asdict(spec.quality)),
           "adherence": (spec.adherence.num_cases, asdict(spec.adherence))}
    return {key: json.loads(json_text({**shared, **_flat({key: block})}))
            for key, (count, block) in own.items() if count > 0}


def plan_phases(spec: EvaluateSpec, engine: dict[str, str]) -> list[Phase]:
    """The phases ``spec`` measures, each with the earlier record in its folder that it reuses, or why not."""
    phases = [Phase(key, inputs) for key, inputs in phase_inputs(spec, engine).items()]
    for phase in phases:
        phase.kept, phase.why = _earlier(spec.output.path / phase.file, phase.inputs)
    return phases


def _earlier(path: Path, inputs: dict[str, Any]) -> tuple[dict | None, str | None]:
    """``(record, None)`` when ``path`` holds a phase's complete record made with ``inputs``."""
    if not path.is_file():
        return None, None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, f"{path.name} cannot be read"
    if not (isinstance(record, dict) and record.get("complete") is True and isinstance(record.get("inputs"), dict)
            and isinstance(record.get("result"), dict) and isinstance(record.get("pipeline"), dict)):
        return None, f"{path.name} is not a finished phase's record"
    if record["inputs"] != inputs:
        return None, f"{path.name} was measured with {difference(record['inputs'], inputs)}"
    return record, None


def difference(kept: dict[str, Any], now: dict[str, Any]) -> str:
    """The first input that differs between ``kept`` and ``now``, as a phrase (and how many more differ)."""
    missing = object()
    names = [k for k in dict.fromkeys([*now, *kept]) if kept.get(k, missing) != now.get(k, missing)]
    first = names[0]
    if first in CHECKPOINTS:
        text = f"other files of {CHECKPOINTS[first]} (config or weights)"
    else:
        text = f"{first}={_value(kept.get(first, missing), missing)}, now {_value(now.get(first, missing), missing)}"
    return text + (f" (and {len(names) - 1} more input{'s' * (len(names) > 2)})" if len(names) > 1 else "")


def _value(value: Any, missing: object) -> str:
    return "unset" if value is missing else one_line(shown(value, 60))


def keep(folder: Path, phase: Phase, pipeline: dict[str, Any], result: dict, seconds: float) -> dict:
    """Write ``phase``'s record to ``<folder>/<phase>.json`` atomically."""
    record = {"phase": phase.key, "complete": True, "inputs": phase.inputs, "pipeline": pipeline,
              "seconds": round(seconds, 2), "finished_at": round(time.time(), 3), "result": result}
    text = json_text(record, indent=1) + "\n"
    write_text(folder / phase.file, text)
    return json.loads(text)["result"]
