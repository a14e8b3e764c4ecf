"""Does a small world model trained on the CPU read its route? Train one, and a control that cannot, and measure.

The issue of route slots (docs/train.md, "Routes") asks for a small model trained on the CPU whose frames bend with a
bent route and not with a straight one. This script makes the data, trains two models with ``terra-train``'s own
run (terra/training/run.py) and measures both:

* **data**: long drives of the synthetic world (terra/sim/long_drives.py, every frame's route at 16 points) rendered
  at 72x128 and encoded by :class:`RoadBandTokenizer`, a fixed tokenizer written for this experiment: the band of
  rows from the horizon to about 4 m ahead, in cells of 4 x 8 pixels (8 x 16 codes a frame), each cell's mean colour
  at 4 levels a channel (64 codes). The demo tokenizer's 9 x 16 codes give the ground from 14 to 56 m one code row,
  so a bend 40 m ahead changes none of its codes; this band gives 10-30 m three rows (beyond, the haze hides the
  road at this size), so a bend can show in the codes at all, and it needs no training.
* **models**: a route model (``net.num_route_tokens=8``, ``train.no_route_share=0.15``) and a control trained the
  same way on the same clips with every clip's routes replaced by another clip's (a route that says nothing about
  the clip's road). Both tiny (hidden 128, 2 layers), from scratch, for the same number of steps.
* **teacher-forced**: the held-out clips' loss with their own routes, with another clip's and with none; a model
  that reads its route scores better with its own.
* **recoveries** (``--recoveries N``): N recovery clips of one window each (terra/sim/recoveries.py: their first 3
  to all but the last frames seen from a camera off the car's pose), other draws than the drives, in both models'
  training (``data.recoveries``, ``--recovery-share``; the control's with other clips' routes too). On the held-out
  ones: teacher-forced loss (from the first frame back on the pose) with the own route, another's and none, and
  greedy frames after the offset frames under each;
  their agreement with the true frames (the car's pose: where the road truly is) tells whether the model draws the
  road where its route says rather than where its context showed.
* **generation** (the issue's check): held-out scenes (the closed-loop study's reserved seeds, never in training)
  where a straight road bends 15-25 m ahead; the car drives straight at 8 m/s; from its 3 true frames and the same
  actions each model generates 16 frames (greedy) under the true (bent) route, a straight route and the bend
  mirrored. Measured on the last 8 frames' far rows (10-30 m): the share of codes equal to the true frames' (the bent
  road), and the road's centroid column (grey codes), its shift between the bent and the mirrored route towards the
  bend's side. A model that reads its route matches the truth better with the bent route than the straight one, and its
  road moves towards the bend; the control shows neither. Intervals: cluster bootstrap over scenarios
  (terra/stats.py).

    nice -n 10 python scripts/experiments/route_reading.py --out runs/route_reading  # data, both models, the report
    python scripts/experiments/route_reading.py --out runs/route_reading --drives 60 --steps 20  # a quick smoke run
    nice -n 10 python scripts/experiments/route_reading.py --out runs/route_recoveries \
        --recoveries 2000                                                          # with recovery clips

The report is ``OUT/report.json`` and a table on stdout. Stages resume: data and models already in ``OUT`` are
reused. It backs benchmarks/training.md, "Route reading on the CPU" (the defaults: 11-24 min a model on one shared
core) and "Recovery clips" (``--recoveries``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from terra.config.sampling import SamplingConfig
from terra.contract.routes import resample_routes, route_slot_values
from terra.generation.backends import model_backend
from terra.generation.rollout import RolloutRequest
from terra.models import LlamaActionForCausalLM
from terra.sim.clips import make_clip
from terra.sim.dataset import ClipDataset, write_dataset
from terra.sim.long_drives import reserved_scene_seeds
from terra.sim.scene import Scene
from terra.sim.tokens import TokenizedClips, load_tokens, save_tokens
from terra.stats import mean
from terra.training.objective import WindowLoss
from terra.sim.recoveries import CONTEXT_FRAMES
from terra.training.tokenize import tokenize_dataset

sys.path.append(str(Path(__file__).resolve().parents[1]))  # scripts/: the command-line helpers are bench.lib's
from bench.lib.cli import THREADS, Parser, check_output, exit_2_on_input_error, in_range  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HEIGHT, WIDTH = 72, 128
ROUTE_SLOTS = 8
CONTEXT, GENERATED = 3, 16
SPEED_KMH = 28.8  # 8 m/s
BEND_AHEAD_M = (15.0, 25.0)  # where the bend starts ahead of the first context frame
FAR_ROWS = slice(1, 4)  # the band's rows 1-3: the ground 10-30 m ahead (beyond, the haze hides the road)


class RoadBandTokenizer:
    """The band of rows [26, 58) of a 72 x 128 frame (just above the horizon to about 7 m ahead) in cells of 4 x 8
    pixels, each cell's mean colour at :data:`LEVELS` levels a channel: ``code = r * L^2 + g * L + b``."""

    LEVELS = 4
    ROWS = (30, 62)
    CELL = (4, 8)
    image_size = (HEIGHT, WIDTH)
    codebook_size = LEVELS ** 3
    grid_shape = ((ROWS[1] - ROWS[0]) // CELL[0], WIDTH // CELL[1])
    device = torch.device("cpu")

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, 8, 16]`` of images ``[B, 3, H, W]`` in [-1, 1]."""
        band = images[:, :, self.ROWS[0]:self.ROWS[1]]
        cells = torch.nn.functional.avg_pool2d(band, self.CELL)
        levels = ((cells + 1) / 2 * self.LEVELS).long().clamp(0, self.LEVELS - 1)
        return levels[:, 0] * self.LEVELS ** 2 + levels[:, 1] * self.LEVELS + levels[:, 2]

    @classmethod
    def colours(cls, codes: np.ndarray) -> np.ndarray:
        """The level centres ``[..., 3]`` in [0, 1] of codes."""
        levels = np.stack([codes // cls.LEVELS ** 2, codes // cls.LEVELS % cls.LEVELS, codes % cls.LEVELS], axis=-1)
        return (levels + 0.5) / cls.LEVELS


def roadness(codes: np.ndarray) -> np.ndarray:
    """1 where a code's colour is the asphalt's (a dark grey: every channel at one level, the lower half), else 0."""
    levels = RoadBandTokenizer.LEVELS
    r, g, b = codes // levels ** 2, codes // levels % levels, codes % levels
    return ((r == g) & (g == b) & (r < levels // 2)).astype(np.float64)


def road_centroid(codes: np.ndarray) -> float:
    """The mean column of the road's codes in the far rows of frames ``[..., rows, columns]`` (NaN without any)."""
    road = roadness(codes[..., FAR_ROWS, :])
    columns = np.arange(codes.shape[-1], dtype=np.float64)
    weight = road.sum()
    return float((road * columns).sum() / weight) if weight else float("nan")


# ------------------------------------------------------------------------------------------------------ data


def make_data(out: Path, drives: int, frames: int, workers: int, recipe: str = "long_drives", seed: int = 76,
              name: str = "tokens") -> tuple[Path, Path]:
    """The tokens file of the drives (their routes kept) and the control's copy (each clip given another clip's
    routes)."""
    tokens, shuffled = out / f"{name}.safetensors", out / f"{name}_shuffled.safetensors"
    if tokens.is_file() and shuffled.is_file():
        return tokens, shuffled
    folder = out / ("drives" if name == "tokens" else name)
    if not (folder / "meta.json").is_file():
        write_dataset(folder, drives, frames, HEIGHT, WIDTH, seed=seed, clips_per_shard=32, workers=workers,
                      recipe=recipe, progress=False)
    clips = tokenize_dataset(ClipDataset(folder), RoadBandTokenizer(), batch_size=512, progress=False)
    save_tokens(tokens, clips)
    # another clip's routes for every clip (a derangement by a shift of the clip index): routes that carry no
    # information about the clip's own road, with the same statistics
    save_tokens(shuffled, TokenizedClips(**{**clips.__dict__, "routes": np.roll(clips.routes, 1, axis=0)}))
    return tokens, shuffled


# ------------------------------------------------------------------------------------------------------ training


def train_model(tokens: Path, out: Path, steps: int, val_clips: int, window: int, input_noise: float,
                recoveries: Path | None = None, recovery_share: float = 0.3) -> Path:
    """Train (or resume) a tiny route model on ``tokens`` (and ``recoveries``) with terra-train's run; its export."""
    from hydra import compose, initialize_config_dir

    from terra.apps.help import register_schemas
    from terra.apps.runner import CONF_DIR
    from terra.training.run import train
    from terra.training.settings import train_spec

    register_schemas()

    if (out / "model" / "config.json").is_file():
        return out / "model"
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("train_world_model", overrides=[
            f"data.tokens={tokens}", f"output_dir={out}", f"data.val_clips={val_clips}",
            "net.hidden_size=128", "net.intermediate_size=384", "net.num_hidden_layers=2",
            "net.num_attention_heads=2", "net.num_key_value_heads=2", f"net.num_temporal_embeddings={window}",
            f"net.num_route_tokens={ROUTE_SLOTS}", "train.no_route_share=0.15", "train.batch_size=8",
            "train.lr=2e-3", "train.warmup_steps=50", f"train.max_steps={steps}", "train.log_every=50",
            f"train.input_noise={input_noise}",
            f"train.eval_every={min(steps, 500)}", f"train.ckpt_every={min(steps, 500)}", "train.device=cpu",
            "export.dtype=float32",
            "export.best=false", "train.tensorboard=false", "sample.gif=false", "progress=false",
            *([f"data.recoveries={recoveries}", f"train.recovery_share={recovery_share}"] if recoveries else []),
        ])
    train(train_spec(cfg))
    return out / "model"


# ------------------------------------------------------------------------------------------------------ measurements


@torch.no_grad()
def teacher_forced(model: LlamaActionForCausalLM, clips: TokenizedClips, val: range, window: int) -> dict:
    """Per held-out clip, the mean loss over its windows with its own routes, another clip's, and none (from the clip's
    first frame on the car's pose: a recovery clip's frames seen off it are context, as in training)."""
    loss = WindowLoss(model.eval(), window, False, 4096, None)
    rows: dict[str, list[float]] = {"own": [], "other": [], "none": []}
    routes = resample_routes(clips.routes, ROUTE_SLOTS)
    frames = clips.codes.shape[1]
    for clip in val:
        other = val[(val.index(clip) + 1) % len(val)]
        sums = {key: 0.0 for key in rows}
        starts = range(0, frames - window + 1, window)
        for start in starts:
            ids = torch.from_numpy(clips.codes[clip, start:start + window].reshape(1, -1))
            acts = torch.from_numpy(clips.actions[clip, start:start + window].reshape(1, -1, 3))
            first = torch.tensor([max(0, int(clips.off_pose_frames[clip]) - start)])
            for key, source in (("own", clip), ("other", other)):
                ahead = routes[source, start + 1:start + window + 1]  # no route past the clip's last frame
                ahead = np.concatenate([ahead, np.full((window - len(ahead), *ahead.shape[1:]), np.nan, np.float32)])
                slots = torch.from_numpy(route_slot_values(ahead).reshape(1, -1, 3))
                sums[key] += float(loss(ids, acts, slots, first)[0])
            sums["none"] += float(loss(ids, acts, None, first)[0])
        for key in rows:
            rows[key].append(sums[key] / len(starts))
    return rows


def bend_scenarios(count: int) -> list[tuple[int, float, int]]:
    """``(scene seed, start s, bend side +1 left / -1 right)``: held-out scenes (the study's reserved seeds) where a
    straight road of at least 45 m bends (radius <= 200 m) 30-40 m ahead of the start."""
    found = []
    rng = np.random.default_rng(0)
    for seed in sorted(reserved_scene_seeds()):
        scene = Scene.generate(seed)
        for i in range(len(scene.seg_len) - 1):
            bend = scene.seg_curv[i + 1]
            if scene.seg_curv[i] == 0 and scene.seg_len[i] >= 45 and abs(bend) >= 1 / 200 \
                    and scene.seg_len[i + 1] >= 30 and scene.seg_s0[i + 1] < scene.length_m - 250:
                found.append((seed, float(scene.seg_s0[i + 1] - rng.uniform(*BEND_AHEAD_M)), int(np.sign(bend))))
                break
        if len(found) == count:
            break
    return found


def straight_routes(routes: np.ndarray) -> np.ndarray:
    """The road continued straight from each frame's nearest route point (the car drives parallel to it)."""
    out = routes.copy()
    out[..., 1] = routes[..., :1, 1]
    return out


def mirrored_routes(routes: np.ndarray) -> np.ndarray:
    """The bend mirrored about the straight continuation: the same road turning the other way."""
    out = routes.copy()
    out[..., 1] = 2 * routes[..., :1, 1] - routes[..., 1]
    return out


def generation(model_dir: Path, scenarios: list[tuple[int, float, int]]) -> dict:
    """Per scenario: the far rows' agreement with the true frames under each route, and the road centroid."""
    backend = model_backend(model_dir)
    tokenizer = RoadBandTokenizer()
    greedy = SamplingConfig(temperature=0.0)
    rows: dict[str, list[float]] = {f"{m}_{r}": [] for m in ("agree", "centroid") for r in ("bent", "straight",
                                                                                             "mirrored")}
    rows["truth_centroid_shift"] = []
    for seed, start_s, side in scenarios:
        clip = make_clip(Scene.generate(seed), "straight", CONTEXT + GENERATED, HEIGHT, WIDTH, speed_kmh=SPEED_KMH,
                         start_s=start_s)
        images = torch.from_numpy(clip.frames).permute(0, 3, 1, 2).float() / 127.5 - 1
        truth = tokenizer.encode(images).numpy()
        bent = resample_routes(clip.routes, ROUTE_SLOTS)
        routes = {"bent": bent, "straight": straight_routes(bent), "mirrored": mirrored_routes(bent)}
        requests = [RolloutRequest(truth[:CONTEXT].reshape(CONTEXT, -1), clip.actions, GENERATED, seed=0,
                                   routes=routes[name]) for name in routes]
        codes = backend.generate(requests, greedy, progress=False)
        late = slice(GENERATED // 2, GENERATED)  # the second half: the bend is 18-34 m ahead
        for name, generated in zip(routes, codes):
            frames = generated.reshape(GENERATED, *tokenizer.grid_shape)[late]
            far = frames[:, FAR_ROWS] == truth[CONTEXT:][late][:, FAR_ROWS]
            rows[f"agree_{name}"].append(float(far.mean()))
            rows[f"centroid_{name}"].append(side * -road_centroid(frames))
        last = truth[CONTEXT:][late]
        rows["truth_centroid_shift"].append(side * -(road_centroid(last) - road_centroid(truth[CONTEXT - 1])))
    return rows


def recovery(model_dir: Path, clips: TokenizedClips, val: range) -> dict:
    """Per held-out recovery clip: the share of the generated frames' codes (greedy, from its offset frames) equal
    to the true frames' (on the car's pose), under its own route, another clip's and none."""
    backend = model_backend(model_dir)
    routes = resample_routes(clips.routes, ROUTE_SLOTS)
    frames = clips.codes.shape[1]
    rows: dict[str, list[float]] = {"agree_own": [], "agree_other": [], "agree_none": []}
    for clip in val:
        other = val[(val.index(clip) + 1) % len(val)]
        off = int(clips.off_pose_frames[clip])
        requests = [RolloutRequest(clips.codes[clip, :off].reshape(off, -1), clips.actions[clip], frames - off,
                                   seed=0, routes=r)
                    for r in (routes[clip], routes[other], None)]
        truth = clips.codes[clip, off:].reshape(frames - off, -1)
        for name, generated in zip(("own", "other", "none"), backend.generate(
                requests, SamplingConfig(temperature=0.0), progress=False)):
            rows[f"agree_{name}"].append(float((generated.reshape(truth.shape) == truth).mean()))
    return rows


def intervals(rows: dict, pairs: dict[str, tuple[str, str]], clusters: list) -> dict:
    """Mean differences of paired per-scenario values with their 95 % cluster-bootstrap intervals."""
    return {name: mean(clusters, np.asarray(rows[a]) - np.asarray(rows[b])).as_dict() for name, (a, b) in
            pairs.items()}


@exit_2_on_input_error("route_reading")
def main(argv: list[str] | None = None) -> None:
    count = in_range(int, 0, 100_000)
    parser = Parser("route_reading", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/route_reading"))
    parser.add_argument("--drives", type=count, default=400)
    parser.add_argument("--frames", type=in_range(int, 2, 1000), default=40)
    parser.add_argument("--steps", type=in_range(int, 1, 10**6), default=800)
    parser.add_argument("--window", type=in_range(int, CONTEXT_FRAMES + 1, 64), default=6)
    parser.add_argument("--val-clips", type=in_range(int, 1, 100_000), default=32)
    parser.add_argument("--scenarios", type=in_range(int, 1, 1000), default=32)
    parser.add_argument("--input-noise", type=in_range(float, 0, 0.5), default=0.0,
                        help="train.input_noise: the most share of a window's input codes replaced by random ones")
    parser.add_argument("--recoveries", type=count, default=0, help="recovery clips in training (0: none)")
    parser.add_argument("--recovery-share", type=in_range(float, 0, 1), default=0.3, help="train.recovery_share")
    parser.add_argument("--only", choices=("route", "control"), help="train and measure one model (run the two "
                        "in parallel processes, then once more without --only for the report)")
    parser.add_argument("--threads", type=THREADS, default=1)
    parser.add_argument("--workers", type=in_range(int, 1, 256), default=1, help="processes rendering the drives")
    args = parser.parse_args(argv)
    if args.frames < args.window:
        parser.error(f"--frames {args.frames} is shorter than --window {args.window}; a clip holds whole windows")
    for flag, clips in (("--drives", args.drives), ("--recoveries", args.recoveries or args.val_clips + 1)):
        if clips <= args.val_clips:
            parser.error(f"{flag} {clips} leaves no training clip beside --val-clips {args.val_clips}; raise it")
    check_output(args.out, "--out", folder=True)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    times = {}
    began = time.perf_counter()
    tokens, shuffled = make_data(args.out, args.drives, args.frames, args.workers)
    recoveries = {"route": None, "control": None}
    if args.recoveries:
        recoveries["route"], recoveries["control"] = make_data(args.out, args.recoveries, args.window, args.workers,
                                                               "recoveries", 77, "recoveries")
        held = load_tokens(recoveries["route"])
        held_val = range(len(held.codes) - args.val_clips, len(held.codes))
    times["data_s"] = time.perf_counter() - began
    clips = load_tokens(tokens)
    val = range(len(clips.codes) - args.val_clips, len(clips.codes))
    scenarios = bend_scenarios(args.scenarios)
    report = {"settings": vars(args) | {"out": str(args.out)}, "scenarios": scenarios, "models": {}}
    for name, data in (("route", tokens), ("control", shuffled)):
        if args.only not in (None, name):
            continue
        began = time.perf_counter()
        model_dir = train_model(data, args.out / name, args.steps, args.val_clips, args.window, args.input_noise,
                                recoveries[name], args.recovery_share)
        times[f"train_{name}_s"] = time.perf_counter() - began
        model = LlamaActionForCausalLM.from_pretrained(model_dir)
        began = time.perf_counter()
        forced = teacher_forced(model, clips, val, args.window)
        gen = generation(model_dir, scenarios)
        times[f"measure_{name}_s"] = time.perf_counter() - began
        ids = [f"clip{c}" for c in val]
        report["models"][name] = {
            "teacher_forced": {k: float(np.mean(v)) for k, v in forced.items()} | intervals(
                forced, {"other_minus_own": ("other", "own"), "none_minus_own": ("none", "own")}, ids),
            "generation": {k: float(np.nanmean(v)) for k, v in gen.items()} | intervals(
                gen, {"agree_bent_minus_straight": ("agree_bent", "agree_straight"),
                      "centroid_bent_minus_mirrored": ("centroid_bent", "centroid_mirrored")},
                [s[0] for s in scenarios]),
            "train_log_last": json.loads((args.out / name / "train_log.jsonl").read_text().splitlines()[-1]),
        }
        if args.recoveries:  # the held-out recovery clips, their own routes (the control's file holds others')
            forced = teacher_forced(model, held, held_val, args.window)
            rec = recovery(model_dir, held, held_val)
            ids = [f"recovery{c}" for c in held_val]
            report["models"][name]["recoveries"] = (
                {f"loss_{k}": float(np.mean(v)) for k, v in forced.items()} | intervals(
                    forced, {"loss_other_minus_own": ("other", "own"), "loss_none_minus_own": ("none", "own")}, ids)
                | {k: float(np.mean(v)) for k, v in rec.items()} | intervals(
                    rec, {"agree_own_minus_other": ("agree_own", "agree_other"),
                          "agree_own_minus_none": ("agree_own", "agree_none")}, ids))
    report["times_s"] = times
    if args.only:
        print(json.dumps(report["models"], indent=1))
        return
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'model':8} {'loss own':>9} {'other-own':>22} {'none-own':>22} {'agree bent-straight':>24} "
          f"{'toward bend (cols)':>24}")
    for name, result in report["models"].items():
        tf, gen = result["teacher_forced"], result["generation"]

        def fmt(v: dict) -> str:
            if v["estimate"] is None:  # no scenario had a value (e.g. no road drawn at all)
                return "n/a"
            return f"{v['estimate']:+.4f} [{v['low']:+.4f}, {v['high']:+.4f}]"

        print(f"{name:8} {tf['own']:9.4f} {fmt(tf['other_minus_own']):>22} {fmt(tf['none_minus_own']):>22} "
              f"{fmt(gen['agree_bent_minus_straight']):>24} {fmt(gen['centroid_bent_minus_mirrored']):>24}")
    print(f"the true frames' road moves {gen['truth_centroid_shift']:+.2f} columns towards the bend over the same "
          f"frames; report: {args.out / 'report.json'}")
    for name, result in report["models"].items():
        if "recoveries" in result:
            rec = result["recoveries"]
            print(f"{name:8} recoveries: loss own {rec['loss_own']:.4f}, other-own {fmt(rec['loss_other_minus_own'])}, "
                  f"none-own {fmt(rec['loss_none_minus_own'])}; agreement with the true frames own "
                  f"{rec['agree_own']:.3f}, own-other {fmt(rec['agree_own_minus_other'])}, own-none "
                  f"{fmt(rec['agree_own_minus_none'])}")


if __name__ == "__main__":
    sys.exit(main())
