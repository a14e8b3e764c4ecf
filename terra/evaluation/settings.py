"""The settings of ``terra-evaluate``, checked once, before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from terra.config.checks import SEED, Range, check_choice, check_flag, check_settings, required_path, select, shown
from terra.config.output_dir import OutputDir, claim_output_dir
from terra.config.spec import RunSpec, run_spec
from terra.core.errors import TerraInputError
from terra.inputs.trajectory import MANOEUVRE_RANGES, MANOEUVRES
from terra.sim.scene import DOMAINS

REPORT = "report.json"  # in out_dir, beside each phase's results as it finished
APP = "terra-evaluate"  # the app whose run folders these are
SETTINGS = {  # documented in the evaluate config; num_context and num_threads are run_spec's
    "horizon": Range(1, 1000, 10, whole=True),
    "seed": SEED,
    "quality.num_clips": Range(0, 100_000, 32, whole=True),
    "quality.scene_seed": SEED,
    "adherence.num_cases": Range(0, 100_000, 20, whole=True),
    "adherence.scene_seed": SEED,
    "exclude_training.seed": SEED,
    "exclude_training.num_clips": Range(0, 1_000_000, 5000, whole=True),
    "targets.direction_accuracy_pct": Range(0, 100, 90),
    "targets.mean_psnr_db": Range(0, 100, 20),
}
HORIZON = Range(1, 1000, "[4,7,10]", whole=True)  # each of adherence.horizons
PARAM_RANGES = ("radius_m", "accel_mps2", "change_s")  # adherence's ranges of the pairs' manoeuvre parameters
PAIRS_EXAMPLE = "adherence.pairs=[[curve_left,curve_right]]"


PHASE_TITLES = {"quality": "frame quality", "adherence": "manoeuvre adherence"}  # in run order: key → name
PHASE_FILES = tuple(f"{key}.json" for key in PHASE_TITLES)  # in out_dir, beside report.json (evaluation/phases.py)


@dataclass(frozen=True)
class QualitySpec:
    """Frame quality: one held-out clip per scene seed from ``scene_seed`` up, manoeuvres cycled."""

    num_clips: int  # 0: not measured
    scene_seed: int
    manoeuvres: tuple[str, ...]  # names of terra.inputs.trajectory.MANOEUVRES
    speed_kmh: tuple[float, float]  # the initial speed's range


@dataclass(frozen=True)
class AdherenceSpec:
    """Manoeuvre adherence: ``num_cases`` cases per pair of opposite manoeuvres, scene seeds from ``scene_seed`` up."""

    num_cases: int  # 0: not measured
    scene_seed: int
    pairs: tuple[tuple[str, str], ...]  # two different manoeuvres each
    horizons: tuple[int, ...]  # generated frames (1-based) matched against each candidate's render
    speed_kmh: tuple[float, float]
    params: dict[str, tuple[float, float]]  # PARAM_RANGES' names -> the range their values are drawn from


@dataclass(frozen=True)
class ExcludedTraining:
    """The world model's training clips (``terra-make-dataset``'s seed and clip count), whose scenes are skipped."""

    seed: int
    num_clips: int


@dataclass(frozen=True)
class Targets:
    """The report's pass/fail lines."""

    direction_accuracy_pct: float  # curve_left/curve_right cases correct
    mean_psnr_db: float  # over the first generated frames


@dataclass(frozen=True)
class EvaluateSpec:
    """A ``terra-evaluate`` run, checked: the shared :class:`RunSpec` and this app's own settings."""

    run: RunSpec  # its num_context is the clips' context
    output: OutputDir  # report.json and the phases' results go here
    horizon: int  # frames generated after the context
    seed: int  # rollout k of a measurement samples with seed + k
    progress: bool
    domain: str  # one of the scene DOMAINS: the scenes of both measurements
    quality: QualitySpec
    adherence: AdherenceSpec
    exclude_training: ExcludedTraining
    targets: Targets

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
    values = check_settings(cfg, SETTINGS)
    if values["quality.num_clips"] == 0 and values["adherence.num_cases"] == 0:
        raise TerraInputError("nothing to evaluate: set quality.num_clips or adherence.num_cases above 0")
    manoeuvres = _manoeuvres(select(cfg, "quality.manoeuvres"))
    pairs = _pairs(select(cfg, "adherence.pairs"))
    for name in manoeuvres + tuple(n for pair in pairs for n in pair):
        if name not in MANOEUVRES:
            raise TerraInputError(f"unknown manoeuvre {name!r}; choose from: {', '.join(MANOEUVRES)}")
    if values["adherence.num_cases"] > 0 and not pairs:
        raise TerraInputError(f"adherence.pairs is empty; e.g. {PAIRS_EXAMPLE}")
    given = select(cfg, "adherence.horizons") or []
    if not isinstance(given, list):
        raise TerraInputError(f"adherence.horizons must be a list (got {given!r}); e.g. [4,7,10]")
    horizons = tuple(HORIZON.check(h, "adherence.horizons") for h in given)
    speed = _range(select(cfg, "adherence.speed_kmh"), "adherence.speed_kmh", "speed_kmh")
    params = {key: _range(select(cfg, f"adherence.{key}"), f"adherence.{key}", key) for key in PARAM_RANGES}
    quality = QualitySpec(values["quality.num_clips"], values["quality.scene_seed"], manoeuvres,
                          _range(select(cfg, "quality.speed_kmh"), "quality.speed_kmh", "speed_kmh"))
    adherence = AdherenceSpec(values["adherence.num_cases"], values["adherence.scene_seed"], pairs, horizons, speed,
                              params)
    domain = check_choice(select(cfg, "domain"), "domain", DOMAINS)
    progress = check_flag(select(cfg, "progress"), "progress")
    run = run_spec(cfg)
    output = claim_output_dir(required_path(cfg, "out_dir", f"{REPORT} goes there"), "out_dir",
                              files=[REPORT, *PHASE_FILES],
                              inputs=[("world model", run.world_model), ("tokenizer", run.tokenizer)], app=APP)
    return EvaluateSpec(
        run, output, values["horizon"], values["seed"], progress, domain, quality, adherence,
        ExcludedTraining(values["exclude_training.seed"], values["exclude_training.num_clips"]),
        Targets(values["targets.direction_accuracy_pct"], values["targets.mean_psnr_db"]),
    )


def _range(value: Any, name: str, key: str) -> tuple[float, float]:
    """A ``[low, high]`` setting of numbers inside manoeuvre parameter ``key``'s range, ``0 < low <= high``."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError, OverflowError):
        raise TerraInputError(
            f"{name} must be a [low, high] pair of numbers (got {value}); e.g. {name}=[20,40]") from None
    for bound in (low, high):
        MANOEUVRE_RANGES[key].check(bound, name)
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
    checked = []
    for pair in pairs or []:
        if not isinstance(pair, list) or len(pair) != 2 or pair[0] == pair[1]:
            raise TerraInputError(f"adherence.pairs holds two different manoeuvres per entry (got {pair}); "
                                  f"e.g. {PAIRS_EXAMPLE}")
        checked.append((str(pair[0]), str(pair[1])))
    return tuple(checked)
