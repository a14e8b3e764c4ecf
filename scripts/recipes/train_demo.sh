#!/usr/bin/env bash
# Train the demo models shipped in terra/assets/demo (see MODEL_CARD.md), stage by stage.
# Every stage resumes where an earlier invocation stopped, so a stage can span several time-limited runs.
#
#   bash scripts/recipes/train_demo.sh data          # render the world model's 20 s drives with their routes (CPU, all cores)
#   bash scripts/recipes/train_demo.sh tokenizer     # train the LFQ tokenizer (GPU), export it when done or out of budget
#   bash scripts/recipes/train_demo.sh tokens        # encode the drives with the tokenizer (TOKENIZER), routes kept
#   bash scripts/recipes/train_demo.sh recoveries    # render and encode recovery clips (terra/sim/recoveries.py)
#   bash scripts/recipes/train_demo.sh world_model   # train the world model, export it when done or out of budget
#   bash scripts/recipes/train_demo.sh install       # copy both exports into terra/assets/demo
#
# Environment: RUN (work folder, default runs/demo), PY (the Python to run: default .venv/bin/python, the
# environment `make` builds, else python3), MINUTES (budget of a training stage), CLIPS, FRAMES (dataset size:
# drives and frames a drive), TOKENIZER (the tokenizer that encodes the drives: default the one the tokenizer stage
# exports), WM_DIR (the world model's run folder), TOK_STEPS, WM_STEPS (schedule lengths), ROUTES (the world model's
# route slots a frame, net.num_route_tokens: default 8; 0 = Terra's layout, no routes), RECOVERY_CLIPS and WORKERS
# (the recoveries stage's clips and render processes; once it has run, the world model trains on them too), EXTRA
# (more Hydra overrides). A warm start from the shipped demo model, its route slots grown (docs/train.md, "Routes"):
#   EXTRA="init=terra/assets/demo/world_model train.lr=3e-4" bash scripts/recipes/train_demo.sh world_model
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${RUN:-runs/demo}
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
MINUTES=${MINUTES:-15}
EXTRA=${EXTRA:-}
source scripts/recipes/arguments.sh
check_at_most 1 "$@"
check_minutes MINUTES
check_count CLIPS FRAMES TOK_STEPS WM_STEPS RECOVERY_CLIPS
check_whole ROUTES WORKERS

last_step() {  # last "step" of a JSON-lines training log
  "$PY" -c "import json,sys; print(max(json.loads(l).get('step', 0) for l in open(sys.argv[1])))" "$1"
}

case "${1:-}" in
  data)
    "$PY" -m terra.apps.make_dataset recipe=long_drives out_dir="$RUN/drives" num_clips="${CLIPS:-1400}" \
      num_frames="${FRAMES:-200}" height=144 width=256 seed=0 workers=0 compress=false clips_per_shard=8 $EXTRA
    ;;
  tokenizer)
    args=(train.output_dir="$RUN/tokenizer" train.max_steps="${TOK_STEPS:-8000}" model.config.encoder_decoder_config.ch=32)
    "$PY" -m terra.apps.train_tokenizer "${args[@]}" train.max_minutes="$MINUTES" $EXTRA
    if [ ! -f "$RUN/tokenizer/final/config.json" ]; then  # out of budget: end the schedule here and export
      "$PY" -m terra.apps.train_tokenizer "${args[@]}" \
        train.max_steps="$(last_step "$RUN/tokenizer/train_log.jsonl")" $EXTRA
    fi
    ;;
  tokens)
    "$PY" -m terra.apps.tokenize_dataset dataset="$RUN/drives" tokenizer_path="${TOKENIZER:-$RUN/tokenizer/final}" \
      out="$RUN/tokens.safetensors" batch_size=512 $EXTRA
    ;;
  recoveries)  # 16-frame clips (the world model's window), other draws than the drives' (seed 1)
    "$PY" -m terra.apps.make_dataset recipe=recoveries out_dir="$RUN/recoveries" num_clips="${RECOVERY_CLIPS:-6000}" \
      num_frames=16 height=144 width=256 seed=1 workers="${WORKERS:-0}" compress=false clips_per_shard=64
    "$PY" -m terra.apps.tokenize_dataset dataset="$RUN/recoveries" \
      tokenizer_path="${TOKENIZER:-$RUN/tokenizer/final}" out="$RUN/recoveries.safetensors" batch_size=512
    ;;
  world_model)
    wm=${WM_DIR:-$RUN/world_model}
    args=(data.tokens="$RUN/tokens.safetensors" output_dir="$wm" train.max_steps="${WM_STEPS:-6000}"
          train.batch_size=64 train.input_noise=0.1 net.num_temporal_embeddings=16 net.num_route_tokens="${ROUTES:-8}"
          sample.gif=false train.tensorboard=false)
    if [ -f "$RUN/recoveries.safetensors" ]; then args+=(data.recoveries="$RUN/recoveries.safetensors"); fi
    "$PY" -m terra.apps.train "${args[@]}" train.max_minutes="$MINUTES" $EXTRA
    if [ ! -f "$wm/model/config.json" ]; then  # out of budget: end the schedule here and export
      "$PY" -m terra.apps.train "${args[@]}" train.max_steps="$(last_step "$wm/train_log.jsonl")" $EXTRA
    fi
    ;;
  install)
    rm -rf terra/assets/demo/tokenizer terra/assets/demo/world_model
    mkdir -p terra/assets/demo
    cp -r "$RUN/tokenizer/final" terra/assets/demo/tokenizer
    cp -r "${WM_DIR:-$RUN/world_model}/model" terra/assets/demo/world_model
    du -sh terra/assets/demo/*
    ;;
  *)
    echo "usage: bash scripts/recipes/train_demo.sh data|tokenizer|tokens|recoveries|world_model|install" >&2
    exit 2
    ;;
esac
