#!/usr/bin/env bash
# Fine-tune the demo world model (terra/assets/demo) on a domain it never saw, by default left-hand traffic (the
# synthetic world mirrored, driven in the left lane; terra/sim/scene.py), rendered as driving logs and run through
# the whole fine-tuning path. Results: MODEL_CARD.md, "Fine-tuning on a new domain".
#
#   bash scripts/recipes/finetune_demo.sh logs       # render new-domain clips (and day clips to replay) as driving logs
#   bash scripts/recipes/finetune_demo.sh shards     # driving logs -> tokenized shards with the demo tokenizer
#   bash scripts/recipes/finetune_demo.sh train NAME # NAME: full | lora (new domain only) or full_mix | lora_mix (+ day)
#   bash scripts/recipes/finetune_demo.sh evaluate   # PSNR and manoeuvre adherence, day and new domain, base and every run
#   bash scripts/recipes/finetune_demo.sh table      # one line per model and domain from the evaluation reports
#   bash scripts/recipes/finetune_demo.sh all        # every stage in order
#
# Environment: RUN (work folder, default runs/left_hand), PY (the Python to run: default .venv/bin/python, the
# environment `make` builds, else python3), DOMAIN (the new domain: left_hand | night;
# night needs a tokenizer trained on night frames, MODEL_CARD.md says why), NEW_CLIPS and DAY_CLIPS (800 and 400;
# half as many new-domain drives overfit and missed a target, MODEL_CARD.md), FRAMES (frames per clip: 60,
# six-second drives), STEPS (optimizer steps per run; validation loss every 100, no validation rollouts: four runs
# sharing an H100 spent about 3 minutes in each round of them; the evaluation reads each run's final model/), JOBS
# (evaluations at once), EXTRA / EVAL_EXTRA (more Hydra overrides for training / evaluation).
set -euo pipefail
cd "$(dirname "$0")/../.."
DOMAIN=${DOMAIN:-left_hand}
RUN=${RUN:-runs/$DOMAIN}
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
STEPS=${STEPS:-1000}
JOBS=${JOBS:-4}
EXTRA=${EXTRA:-}
EVAL_EXTRA=${EVAL_EXTRA:-}
BASE=terra/assets/demo/world_model
RUNS="full lora full_mix lora_mix"
source scripts/recipes/arguments.sh
check_at_most "$([ "${1:-}" = train ] && echo 2 || echo 1)" "$@"
check_count STEPS JOBS NEW_CLIPS DAY_CLIPS FRAMES

logs() {
  "$PY" -m terra.apps.make_dataset format=driving_logs out_dir="$RUN/logs_new" domain="$DOMAIN" seed=1 \
    num_clips="${NEW_CLIPS:-800}" num_frames="${FRAMES:-60}" height=144 width=256
  "$PY" -m terra.apps.make_dataset format=driving_logs out_dir="$RUN/logs_day" domain=day seed=2 \
    num_clips="${DAY_CLIPS:-400}" num_frames="${FRAMES:-60}" height=144 width=256
  mkdir -p "$RUN/logs_mix"  # new domain + day: links to the clip folders of both
  for clip in "$RUN"/logs_new/*/ "$RUN"/logs_day/*/; do
    ln -sfn "$(realpath "$clip")" "$RUN/logs_mix/$(basename "$clip")"
  done
}

shards() {
  for set in new mix; do
    "$PY" -m terra.apps.prepare_logs logs="$RUN/logs_$set" output_dir="$RUN/shards_$set" val_fraction=0.1
  done
}

train() {
  local name=$1 data=new args
  case "$name" in
    full) args=(finetune=full train.lr=3e-4) ;;
    lora) args=(finetune=lora train.lr=2e-3) ;;
    full_mix) args=(finetune=full train.lr=3e-4); data=mix ;;
    lora_mix) args=(finetune=lora train.lr=2e-3); data=mix ;;
    *) echo "train: NAME must be one of: $RUNS" >&2; exit 2 ;;
  esac
  "$PY" -m terra.apps.train init="$BASE" data.tokens="$RUN/shards_$data" output_dir="$RUN/$name" \
    "${args[@]}" train.batch_size=32 train.max_steps="$STEPS" train.warmup_steps=50 train.eval_every=100 \
    train.ckpt_every=500 train.log_every=50 sample.gif=false $EXTRA
}

evaluate() {
  local jobs=() model name domain
  mkdir -p "$RUN"
  for name in base $RUNS; do
    model=$BASE
    [ "$name" = base ] || model="$RUN/$name/model"  # the run's final weights
    [ -f "$model/config.json" ] || continue
    for domain in day "$DOMAIN"; do
      "$PY" -m terra.apps.evaluate model.world_model="$model" domain="$domain" out_dir="$RUN/eval/${name}_$domain" \
        progress=false $EVAL_EXTRA > "$RUN/eval_${name}_$domain.log" 2>&1 &
      jobs+=($!)
      if [ "${#jobs[@]}" -ge "$JOBS" ]; then wait "${jobs[0]}"; jobs=("${jobs[@]:1}"); fi
    done
  done
  wait
}

table() {
  "$PY" - "$RUN/eval" <<'EOF'
import json, sys
from pathlib import Path
print(f"{'model':<10} {'domain':<10} {'PSNR 1-10':>9} {'tok PSNR':>8} {'left/right':>10} {'accel/decel':>11}")
for report in sorted(Path(sys.argv[1]).glob("*/report.json")):
    r = json.loads(report.read_text())
    pairs = r["adherence"]["pairs"]
    print(f"{report.parent.name[:-len(r['domain']) - 1]:<10} {r['domain']:<10} {r['quality']['mean_psnr_target_frames']:>9.2f} "
          f"{r['quality']['tokenizer_psnr']['overall']:>8.2f} "
          + " ".join(f"{p['accuracy_pct']:>10.1f}" for p in pairs.values()))
EOF
}

case "${1:-}" in
  logs) logs ;;
  shards) shards ;;
  train) train "${2:-}" ;;
  evaluate) evaluate ;;
  table) table ;;
  all)
    logs
    shards
    for name in $RUNS; do train "$name"; done
    evaluate
    table
    ;;
  *)
    echo "usage: bash scripts/recipes/finetune_demo.sh logs|shards|train NAME|evaluate|table|all" >&2
    exit 2
    ;;
esac
