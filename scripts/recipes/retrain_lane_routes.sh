#!/usr/bin/env bash
# Retrain the shipped demo world model (terra/assets/demo) on lane routes: a route is the centre of the lane the car
# drives in (terra/contract/routes.py), no longer the road's centre line. One GPU: render 20 s drives and recovery
# clips with lane routes, encode them with the demo tokenizer, fine-tune from the shipped model as stage 7 was
# (benchmarks/training.md, "Wobbles"), export into OUT laid out as terra/assets/demo (world_model/, tokenizer/).
# Sized by stage 6's and 7's measured rates on an H200 with 16 cores to finish within 6 minutes.
#
#   bash scripts/recipes/retrain_lane_routes.sh OUT            # one GPU
#   SMOKE=1 bash scripts/recipes/retrain_lane_routes.sh OUT    # tiny sizes: end to end on the CPU in minutes
#
# Environment: RUN (work folder, default runs/lane_routes; a rerun of the recipe starts it afresh), PY (default .venv/bin/python),
# WORKERS (render processes, 0 = one per core), CLIPS, RECOVERY_CLIPS, WM_STEPS, MINUTES (the training's budget; the
# model is exported where it ran out), EXTRA (more terra-train overrides).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
RUN=${RUN:-runs/lane_routes}
EXTRA=${EXTRA:-}
DEMO=terra/assets/demo
source scripts/recipes/arguments.sh
check_at_most 1 "$@"
[ "$#" -eq 1 ] || refuse "give the folder to export the retrained model into: $0 OUT"
OUT=$1
[ ! -e "$OUT" ] || refuse "$OUT already exists; give a new folder (the shipped model stays where it is)"
MARK=.retrain_lane_routes  # what this recipe's work folder holds: only such a folder is made afresh
[ ! -e "$RUN" ] || [ -f "$RUN/$MARK" ] || refuse "RUN=$RUN exists and is not this recipe's work folder; give a new one"
check_count CLIPS RECOVERY_CLIPS WM_STEPS
check_whole WORKERS
check_minutes MINUTES
if [ -n "${SMOKE:-}" ]; then  # the CPU: a few short clips, two steps of two windows
  CLIPS=${CLIPS:-3} FRAMES=17 RECOVERY_CLIPS=${RECOVERY_CLIPS:-3} WM_STEPS=${WM_STEPS:-2} MINUTES=${MINUTES:-5}
  SIZES=(train.batch_size=2 train.eval_every="$WM_STEPS" train.log_every=1 data.val_clips=1 train.device=cpu)
else  # stage 7's rates: 400 drives 45 s, 2,000 recovery clips 24 s + 12 s, tokens 20 s, 1,600 steps 210 s
  CLIPS=${CLIPS:-300} FRAMES=200 RECOVERY_CLIPS=${RECOVERY_CLIPS:-2000} WM_STEPS=${WM_STEPS:-1300}
  MINUTES=${MINUTES:-3.3}
  SIZES=(train.batch_size=64 train.eval_every="$WM_STEPS")
fi

START=$SECONDS
stage() { echo "[retrain_lane_routes +$((SECONDS - START)) s] $*"; }
rm -rf "$RUN"
mkdir -p "$RUN"
touch "$RUN/$MARK"
stage "rendering $CLIPS drives of $FRAMES frames with lane routes"
"$PY" -m terra.apps.make_dataset recipe=long_drives out_dir="$RUN/drives" num_clips="$CLIPS" num_frames="$FRAMES" \
  height=144 width=256 seed=0 workers="${WORKERS:-0}" compress=false clips_per_shard=8
stage "rendering $RECOVERY_CLIPS recovery clips"
"$PY" -m terra.apps.make_dataset recipe=recoveries out_dir="$RUN/recoveries" num_clips="$RECOVERY_CLIPS" \
  num_frames=16 height=144 width=256 seed=1 workers="${WORKERS:-0}" compress=false clips_per_shard=64
for data in drives recoveries; do
  stage "encoding the $data with the demo tokenizer"
  "$PY" -m terra.apps.tokenize_dataset dataset="$RUN/$data" tokenizer_path="$DEMO/tokenizer" \
    out="$RUN/$data.safetensors" batch_size=512
done
stage "fine-tuning $DEMO/world_model for $WM_STEPS steps (at most $MINUTES min)"
args=(init="$DEMO/world_model" data.tokens="$RUN/drives.safetensors" data.recoveries="$RUN/recoveries.safetensors"
      output_dir="$RUN/world_model" train.max_steps="$WM_STEPS" train.lr=2e-4 train.warmup_steps=100
      train.input_noise=0.5 train.recovery_share=0.25 net.num_temporal_embeddings=16 net.num_route_tokens=8
      sample.gif=false train.tensorboard=false "${SIZES[@]}")
"$PY" -m terra.apps.train "${args[@]}" train.max_minutes="$MINUTES" $EXTRA
if [ ! -f "$RUN/world_model/model/config.json" ]; then  # out of budget: end the schedule where it stopped, export
  last=$("$PY" -c "import json,sys; print(max(json.loads(l).get('step', 0) for l in open(sys.argv[1])))" \
    "$RUN/world_model/train_log.jsonl")
  stage "out of time at step $last: exporting there"
  "$PY" -m terra.apps.train "${args[@]}" train.max_steps="$last" $EXTRA
fi
rm -rf "$OUT.partial"
mkdir -p "$OUT.partial"
cp -r "$RUN/world_model/model" "$OUT.partial/world_model"
cp -r "$DEMO/tokenizer" "$OUT.partial/tokenizer"
mv "$OUT.partial" "$OUT"
"$PY" - "$RUN/world_model/train_log.jsonl" <<'EOF'
import json, sys
rows = [row for row in map(json.loads, open(sys.argv[1])) if "val_loss" in row]
if not rows:
    sys.exit("retrain_lane_routes: the training logged no validation loss")
first, last = rows[0], rows[-1]
print(f"val_loss at step {first['step']}: {first['val_loss']:.4f}; final val_loss at step {last['step']}: "
      f"{last['val_loss']:.4f} (told no route {last.get('val_loss_no_route', float('nan')):.4f})")
EOF
stage "exported into $OUT (world_model/, tokenizer/): copy them into $DEMO to ship"
