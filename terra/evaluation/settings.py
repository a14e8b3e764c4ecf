"""The settings of ``terra-evaluate``, checked once, before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Optional

from omegaconf import DictConfig

from terra.config.checks import SEED, Range, required_path, shown
from terra.config.output_dir import OutputDir, claim_output_dir
from terra.config.schema import check_schema, flag, setting
from terra.config.spec import RunConfig, RunSpec, run_spec
from terra.core.errors import TerraInputError
from terra.inputs.trajectory import MANOEUVRE_RANGES, MANOEUVRES
from terra.sim.scene import DOMAINS

REPORT = "report.json"  # in out_dir, beside each phase's results as it finished
APP = "terra-evaluate"  # the app whose run folders these are
HORIZON = Range(1, 1000, "[4,7,10]", whole=True)  # each of adherence.horizons
PARAM_RANGES = ("radius_m", "accel_mps2", "change_s")  # adherence's ranges of the pairs' manoeuvre parameters
PAIRS_EXAMPLE = "adherence.pairs=[[curve_left,curve_right]]"
PHASE_TITLES = {"quality": "frame quality", "adherence": "manoeuvre adherence"}  # in run order: key → name
PHASE_FILES = tuple(f"{key}.json" for key in PHASE_TITLES)  # in out_dir, beside report.json (evaluation/phases.py)


def _range(value: Any, name: str) -> tuple[float, float]:
    """A ``[low, high]`` setting ``name`` of numbers inside its manoeuvre parameter's range, ``0 < low <= high``."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError, OverflowError):
        raise TerraInputError(
            f"{name} must be a [low, high] pair of numbers (got {value}); e.g. {name}=[20,40]") from None
    for bound in (low, high):
        MANOEUVRE_RANGES[name.rpartition(".")[2]].check(bound, name)
    if not 0 < low <= high:
        raise TerraInputError(f"{name} must satisfy 0 < low <= high (got [{low}, {high}])")
    return low, high


def _manoeuvres(names: Any) -> tuple[str, ...]:
    """``quality.manoeuvres``: one name, a list of names, or None for every manoeuvre."""
    if names is None:
        return MANOEUVRES
    if not isinstance(names, (str, list)):
        raise TerraInputError(f"quality.manoeuvres must be a manoeuvre, a list of them or null (got {shown(names)})")
    names = (names,) if isinstance(names, str) else tuple(str(n) for n in names)
    if not names:
        raise TerraInputError("quality.manoeuvres is empty; use null for every manoeuvre")
    return names


def _pairs(pairs: Any) -> tuple[tuple[str, str], ...]:
    """``adherence.pairs``: a list of two different manoeuvres each (None: no pairs)."""
    if pairs is not None and not isinstance(pairs, list):
        raise TerraInputError(f"adherence.pairs must be a list of pairs (got {shown(pairs)}); e.g. {PAIRS_EXAMPLE}")
    for pair in pairs or []:
        if not isinstance(pair, list) or len(pair) != 2 or pair[0] == pair[1]:
            raise TerraInputError(f"adherence.pairs holds two different manoeuvres per entry (got {pair}); "
                                  f"e.g. {PAIRS_EXAMPLE}")
    return tuple((str(first), str(second)) for first, second in pairs or [])


def _horizons(given: Any) -> tuple[int, ...]:
    if not isinstance(given or [], list):
        raise TerraInputError(f"adherence.horizons must be a list (got {given!r}); e.g. [4,7,10]")
    return tuple(HORIZON.check(h, "adherence.horizons") for h in given or [])


@dataclass
class QualityBlock:
    num_clips: int = setting(32, "held-out clips whose generated frames are compared with the true ones",
                             Range(0, 100_000, 32, whole=True))
    scene_seed: int = setting(10_000_000, "clip i: Scene.generate(scene_seed + i) (training scenes are skipped)",
                              SEED)
    manoeuvres: Any = setting(None, "cycled over the clips; null = every manoeuvre", check=_manoeuvres)
    speed_kmh: Any = setting([15, 60], "initial speed drawn uniformly from this range (the training range); within "
                                       "0 .. 250", check=partial(_range, name="quality.speed_kmh"))


@dataclass
class AdherenceBlock:
    num_cases: int = setting(20, "cases per pair; a case is correct when both of its rollouts match their command",
                             Range(0, 100_000, 20, whole=True))
    scene_seed: int = setting(11_000_000, "case j: Scene.generate(scene_seed + j), starting on the road's first "
                                          "straight", SEED)
    pairs: Any = setting([["curve_left", "curve_right"], ["accelerate", "decelerate"]],
                         "opposite manoeuvres: the same context, opposite commands", check=_pairs)
    horizons: Any = setting([4, 7, 10], "generated frames (1-based) matched against each candidate's ground-truth "
                                        "render", check=_horizons)
    speed_kmh: Any = setting([20, 40], "within 0 .. 250", check=partial(_range, name="adherence.speed_kmh"))
    radius_m: Any = setting([20, 40], "curves; within 2 .. 10000", check=partial(_range, name="adherence.radius_m"))
    accel_mps2: Any = setting([2, 4], "accelerate / decelerate / stop; within 0 .. 15",
                              check=partial(_range, name="adherence.accel_mps2"))
    change_s: Any = setting([1.5, 3.0], "lane changes; within 0.5 .. 30",
                            check=partial(_range, name="adherence.change_s"))

    @property
    def params(self) -> dict[str, tuple[float, float]]:
        """The ranges the pairs' manoeuvre parameters are drawn from, by name."""
        return {key: getattr(self, key) for key in PARAM_RANGES}


@dataclass
class ExcludeBlock:
    seed: int = setting(0, "terra-make-dataset's seed of the world model's training clips, whose scenes are never "
                           "used", SEED)
    num_clips: int = setting(5000, "its clip count", Range(0, 1_000_000, 5000, whole=True))


@dataclass
class TargetsBlock:
    direction_accuracy_pct: float = setting(90.0, "curve_left/curve_right cases correct", Range(0, 100, 90))
    mean_psnr_db: float = setting(20.0, "mean PSNR over the first 10 generated frames", Range(0, 100, 20))


@dataclass
class EvaluateConfig(RunConfig):
    """terra-evaluate's settings."""

    out_dir: Optional[str] = setting("outputs/eval/${now:%Y-%m-%d}/${now:%H-%M-%S}",
                                     "report.json goes here (checked writable first), and each phase's results as "
                                     "it ends: a run into it reuses those of equal inputs (docs/score.md)")
    horizon: int = setting(10, "frames generated after the context (metrics per step 1..horizon)",
                           Range(1, 1000, 10, whole=True))
    seed: int = setting(0, "rollout k of a metric's batch samples with seed + k (irrelevant when greedy)", SEED)
    progress: Any = flag(True, "a bar while generating on a terminal; in a log a line a minute with the time left")
    domain: str = setting("day", "the scenes of both measurements: day is the demo models' world", choices=DOMAINS)
    quality: QualityBlock = setting(QualityBlock(), "")
    adherence: AdherenceBlock = setting(AdherenceBlock(), "")
    exclude_training: ExcludeBlock = setting(ExcludeBlock(), "")
    targets: TargetsBlock = setting(TargetsBlock(), "")


@dataclass(frozen=True)
class EvaluateSpec:
    """A ``terra-evaluate`` run, checked: the shared :class:`RunSpec` and this app's own settings."""

    run: RunSpec  # its num_context is the clips' context
    output: OutputDir  # report.json and the phases' results go here
    horizon: int  # frames generated after the context
    seed: int  # rollout k of a measurement samples with seed + k
    progress: bool
    domain: str  # one of the scene DOMAINS: the scenes of both measurements
    quality: QualityBlock  # num_clips 0: not measured
    adherence: AdherenceBlock  # num_cases 0: not measured
    exclude_training: ExcludeBlock
    targets: TargetsBlock

    @property
    def num_frames(self) -> int:
        """Frames of each clip: the context, then the generated ones."""
        return self.run.num_context + self.horizon

    @property
    def rollouts_in_flight(self) -> int:
        """The most rollouts one ``generate`` call carries."""
        return max(self.quality.num_clips, 2 * self.adherence.num_cases * len(self.adherence.pairs))


def evaluate_spec(cfg: DictConfig) -> EvaluateSpec:
    """Every setting of `evaluate` checked once, without importing torch, and ``out_dir`` claimed."""
    values = check_schema(cfg, EvaluateConfig)

    def block(name: str, schema: type) -> Any:
        return schema(**{field.name: values[f"{name}.{field.name}"] for field in fields(schema)})

    if values["quality.num_clips"] == 0 and values["adherence.num_cases"] == 0:
        raise TerraInputError("nothing to evaluate: set quality.num_clips or adherence.num_cases above 0")
    manoeuvres, pairs = values["quality.manoeuvres"], values["adherence.pairs"]
    for name in manoeuvres + tuple(n for pair in pairs for n in pair):
        if name not in MANOEUVRES:
            raise TerraInputError(f"unknown manoeuvre {name!r}; choose from: {', '.join(MANOEUVRES)}")
    if values["adherence.num_cases"] > 0 and not pairs:
        raise TerraInputError(f"adherence.pairs is empty; e.g. {PAIRS_EXAMPLE}")
    run = run_spec(cfg)
    output = claim_output_dir(required_path(cfg, "out_dir", f"{REPORT} goes there"), "out_dir",
                              files=[REPORT, *PHASE_FILES],
                              inputs=[("world model", run.world_model), ("tokenizer", run.tokenizer)], app=APP)
    return EvaluateSpec(
        run, output, values["horizon"], values["seed"], values["progress"], values["domain"],
        block("quality", QualityBlock), block("adherence", AdherenceBlock),
        block("exclude_training", ExcludeBlock), block("targets", TargetsBlock),
    )
