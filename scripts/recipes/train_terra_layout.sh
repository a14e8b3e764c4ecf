#!/usr/bin/env bash
# Train and measure a model of Terra's token layout on the synthetic world, in one run on one GPU machine:
# 288x512 frames -> 18x32 = 576 codes of 2^18 (LFQ, z_channels 18), 6 action slots, 25-frame
# windows (582 positions a frame, 14,550 a window). MODEL_CARD.md, "A model of Terra's token layout", has the
# recipe's sizes and results; benchmarks/terra-layout-model.md, how to reproduce it on a GPU.
#
#   bash scripts/recipes/train_terra_layout.sh start     # copy the tree to $WORK/tree, run `all` there in the background
#   bash scripts/recipes/train_terra_layout.sh poll      # status and log tail, within WAIT_S seconds (default 0)
#   bash scripts/recipes/train_terra_layout.sh stop      # SIGTERM to the background run (the trainers checkpoint)
#   bash scripts/recipes/train_terra_layout.sh all       # the stages below in order (data alongside tokenizer)
#   bash scripts/recipes/train_terra_layout.sh data|tokenizer|tokens|world_model|measure|collect
#
# Every stage skips what is already done and resumes what was interrupted. The two training stages run within
# TOK_MINUTES / WM_MINUTES of wall time: with *_STEPS=auto a first slice of *_CALIBRATE_MINUTES measures the
# step rate, the schedule is set to the steps that fit the rest, and the run resumes with it; out of time, the
# schedule ends at the last step and the weights are exported. SMOKE=1: tiny sizes on the CPU, end to end.
# Environment: RUN (work folder; results in $RUN/results), WORK (start/poll/stop: RUN=$WORK/run), PY, DEVICE;
# sizes below.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SELF=$ROOT/scripts/recipes/train_terra_layout.sh
WORK=${WORK:-/tmp/terra_layout}
case "${1:-}" in start|poll|stop) RUN=${RUN:-$WORK/run} ;; esac
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

if [ "${SMOKE:-0}" = 1 ]; then  # the CPU proof: every stage, Terra's layout, toy sizes
  RUN=${RUN:-runs/terra_layout_smoke}; DEVICE=${DEVICE:-cpu}; export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  : "${CLIPS:=6}" "${FRAMES:=4}" "${DATA_WORKERS:=1}" "${TOK_FRAMES:=8}" "${TOK_RENDER_WORKERS:=1}" "${TOK_BATCH:=2}"
  : "${TOK_STEPS:=2}" "${TOK_WARMUP:=0}" "${TOK_EVAL_FRAMES:=2}" "${TOK_LOG_EVERY:=1}" "${TOK_MINUTES:=5}"
  : "${WM_HIDDEN:=64}" "${WM_INTERMEDIATE:=128}" "${WM_LAYERS:=2}" "${WM_HEADS:=1}" "${WM_KV_HEADS:=1}"
  : "${WM_WINDOW:=2}" "${WM_BATCH:=1}" "${WM_WARMUP:=1}" "${WM_MINUTES:=3.5}" "${WM_CALIBRATE_MINUTES:=2}"
  : "${WM_LOG_EVERY:=1}" "${WM_EVAL_EVERY:=2}" "${WM_VAL_CLIPS:=2}" "${WM_LOSS_CHUNK:=512}" "${WM_COMPILE:=false}"
  : "${EVAL_CLIPS:=2}" "${ADHERENCE_CASES:=0}" "${EVAL_CONTEXT:=2}" "${EVAL_HORIZON:=2}" "${ROLLOUTS:=2}"
  : "${DECODE_FRAMES:=2}"
fi
RUN=${RUN:-runs/terra_layout}; DEVICE=${DEVICE:-cuda}
CLIPS=${CLIPS:-2000}; FRAMES=${FRAMES:-25}; DATA_WORKERS=${DATA_WORKERS:-12}; COMPRESS=${COMPRESS:-auto}
TOK_FRAMES=${TOK_FRAMES:-6000}; TOK_RENDER_WORKERS=${TOK_RENDER_WORKERS:-4}; TOK_BATCH=${TOK_BATCH:-16}
TOK_CH=${TOK_CH:-32}; TOK_STEPS=${TOK_STEPS:-auto}; TOK_WARMUP=${TOK_WARMUP:-300}
TOK_EVAL_FRAMES=${TOK_EVAL_FRAMES:-16}
TOK_LOG_EVERY=${TOK_LOG_EVERY:-50}; TOK_MINUTES=${TOK_MINUTES:-4.5}; TOK_CALIBRATE_MINUTES=${TOK_CALIBRATE_MINUTES:-1.5}
TOK_EMA_DECAY=${TOK_EMA_DECAY:-0.99}  # the exported weights average ~100 steps: the budget's ~1,000 steps would
# leave 0.999's average (conf/train_tokenizer.yaml) at a third its first steps' weights (MODEL_CARD.md's 12.4 dB)
WM_HIDDEN=${WM_HIDDEN:-512}; WM_INTERMEDIATE=${WM_INTERMEDIATE:-1408}; WM_LAYERS=${WM_LAYERS:-12}
WM_HEADS=${WM_HEADS:-8}; WM_KV_HEADS=${WM_KV_HEADS:-4}; WM_WINDOW=${WM_WINDOW:-25}; WM_BATCH=${WM_BATCH:-4}
WM_LR=${WM_LR:-1e-3}; WM_WARMUP=${WM_WARMUP:-100}; WM_STEPS=${WM_STEPS:-auto}; WM_MINUTES=${WM_MINUTES:-9}
WM_CALIBRATE_MINUTES=${WM_CALIBRATE_MINUTES:-2.5}; WM_LOG_EVERY=${WM_LOG_EVERY:-10}; WM_EVAL_EVERY=${WM_EVAL_EVERY:-250}
WM_VAL_CLIPS=${WM_VAL_CLIPS:-32}; WM_LOSS_CHUNK=${WM_LOSS_CHUNK:-2048}; WM_COMPILE=${WM_COMPILE:-true}
EVAL_CLIPS=${EVAL_CLIPS:-32}; ADHERENCE_CASES=${ADHERENCE_CASES:-8}; EVAL_CONTEXT=${EVAL_CONTEXT:-3}
EVAL_HORIZON=${EVAL_HORIZON:-10}; EVAL_DTYPE=${EVAL_DTYPE:-float32}; ROLLOUTS=${ROLLOUTS:-32}
DECODE_FRAMES=${DECODE_FRAMES:-4}; TEMPERATURES=${TEMPERATURES:-0.9}  # Terra's; the codes equal sequential's at any
# speculative modes' settings (';' splits sets): the draft_tokens whose vLLM step times check_jacobi_vllm.py measures
DRAFTS="decoding=speculative,draft_tokens=8;decoding=speculative,draft_tokens=16;decoding=speculative,draft_tokens=32"
SPECULATIVE=${SPECULATIVE:-$DRAFTS}
DECODING_OUT=${DECODING_OUT:-decoding.json}  # in $RUN/results; another name measures again (other settings)
RUN=$(realpath -m "$RUN"); RESULTS=$RUN/results; export RUN
source "$ROOT/scripts/recipes/arguments.sh"
check_at_most 1 "$@"
check_count CLIPS FRAMES TOK_FRAMES TOK_BATCH TOK_CH WM_BATCH WM_WINDOW ROLLOUTS DECODE_FRAMES
check_whole DATA_WORKERS TOK_WARMUP WM_WARMUP WAIT_S
check_minutes TOK_MINUTES WM_MINUTES TOK_CALIBRATE_MINUTES WM_CALIBRATE_MINUTES
[ "$TOK_STEPS" = auto ] || check_count TOK_STEPS
[ "$WM_STEPS" = auto ] || check_count WM_STEPS

mark() {  # STAGE STATE [DETAIL]: one line of the status file that `poll` shows
  mkdir -p "$RUN"; echo "$(date -u +%FT%TZ) $*" >> "$RUN/status.log"
}
seconds() { awk -v m="$1" 'BEGIN { printf "%d", m * 60 }'; }
minutes() { awk -v s="$1" 'BEGIN { printf "%.3f", (s > 6 ? s : 6) / 60 }'; }
last_step() {  # largest "step" of a JSON-lines training log (0 without one)
  [ -f "$1" ] || { echo 0; return; }
  "$PY" -c "import json,sys; print(max([json.loads(l).get('step', 0) for l in open(sys.argv[1])] or [0]))" "$1"
}
fit_steps() {  # LOG KIND FIRST_STEP ELAPSED_S LEFT_S CAP: the schedule's length that fits LEFT_S more seconds
  "$PY" - "$@" <<'PY'
import json, math, sys
log, kind, first, elapsed, left, cap = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:])
rows = [json.loads(line) for line in open(log)]
if kind == "tokenizer":  # rows of event "train" carry the rate of their interval
    rows = [r for r in rows if r.get("event") == "train"]
    rate = rows[-1]["steps_per_s"] if rows else None
else:  # world model: rows with a training loss; the rate between the last two (the first holds the compile)
    rows = [r for r in rows if "loss" in r and r["step"] > first]
    rate = (rows[-1]["step"] - rows[-2]["step"]) / (rows[-1]["time_s"] - rows[-2]["time_s"]) if len(rows) > 1 else None
last = max([r["step"] for r in rows] or [first])
if not rate:
    print(f"fit_steps: no step rate in {log}; the time budget ends the run", file=sys.stderr)
    print(int(cap)); sys.exit()
overhead = max(0.0, elapsed - (last - first) / rate)  # start-up, compile, checkpoint: assumed again next time
fit = int(min(cap, max(last, last + math.floor(rate * (left - overhead - 20)))))
print(f"fit_steps: {rate:.3f} steps/s, {overhead:.0f} s start-up and saving, {left:.0f} s left: {fit} steps",
      file=sys.stderr)
print(fit)
PY
}

budgeted() {  # KIND OUT DONE STEPS CAP CALIBRATE_MIN BUDGET_MIN SCRIPT ARGS...: train within a wall-time budget
  local kind=$1 out=$2 done=$3 steps=$4 cap=$5 calibrate=$6 budget; budget=$(seconds "$7"); shift 7
  local start=$SECONDS log="$out/train_log.jsonl"
  [ -f "$done" ] && { echo "$kind: already exported ($done)"; return; }
  if [ "$steps" = auto ]; then
    steps=$(cat "$out/fitted_max_steps" 2>/dev/null || true)
    if [ -z "$steps" ]; then  # calibration slice on the longest schedule, then the schedule that fits
      local first; first=$(last_step "$log")
      "$PY" "$@" train.max_steps="$cap" train.max_minutes="$calibrate"
      [ -f "$done" ] && return
      steps=$(fit_steps "$log" "$kind" "$first" $((SECONDS - start)) $((budget - SECONDS + start)) "$cap")
      echo "$steps" > "$out/fitted_max_steps"
    fi
  fi
  if [ $((budget - SECONDS + start)) -gt 0 ]; then
    "$PY" "$@" train.max_steps="$steps" train.max_minutes="$(minutes $((budget - SECONDS + start - 20)))"
  fi
  if [ ! -f "$done" ]; then  # out of time: end the schedule at the last step and export
    "$PY" "$@" train.max_steps="$(last_step "$log")"
  fi
}

collect() {  # the run's results gathered in $RESULTS ($RUN/results): status, logs, summaries, the report
  mkdir -p "$RESULTS"
  local pair
  for pair in status.log:status.log tokenizer/train_log.jsonl:tokenizer_log.jsonl \
              tokenizer/summary.json:tokenizer_summary.json world_model/train_log.jsonl:world_model_log.jsonl \
              eval/report.json:eval_report.json; do
    [ -f "$RUN/${pair%%:*}" ] && cp "$RUN/${pair%%:*}" "$RESULTS/${pair##*:}"
  done
  [ -f "$RUN/run.log" ] && tail -n 300 "$RUN/run.log" | tr '\r' '\n' | tail -n 300 > "$RESULTS/run_tail.log"
  return 0
}

write_settings() {
  mkdir -p "$RESULTS"
  local names="CLIPS FRAMES COMPRESS TOK_FRAMES TOK_BATCH TOK_CH TOK_STEPS TOK_MINUTES TOK_EMA_DECAY WM_HIDDEN
    WM_INTERMEDIATE WM_LAYERS WM_HEADS WM_KV_HEADS WM_WINDOW WM_BATCH WM_LR WM_WARMUP WM_STEPS WM_MINUTES WM_COMPILE
    EVAL_CLIPS ADHERENCE_CASES EVAL_CONTEXT EVAL_HORIZON EVAL_DTYPE ROLLOUTS DECODE_FRAMES TEMPERATURES SPECULATIVE
    DEVICE SMOKE"
  local n; for n in $names; do export "$n=${!n:-}"; done
  "$PY" -c "import json,os,sys; print(json.dumps({n: os.environ[n] for n in sys.argv[1:]}, indent=1))" $names \
    > "$RESULTS/settings.json"
}

stage() {  # NAME: run one stage as its own process, marked in the status file
  local begin=$SECONDS
  mark "$1" start
  if bash "$SELF" "$1"; then mark "$1" done "$((SECONDS - begin))s"; return; fi
  mark "$1" failed "$((SECONDS - begin))s"; return 1
}

case "${1:-}" in
  data)
    if [ -f "$RUN/tokens.safetensors" ] || [ -f "$RUN/clips/meta.json" ]; then echo "data: done"; exit 0; fi
    mkdir -p "$RUN"
    compress=$COMPRESS
    if [ "$compress" = auto ]; then  # uncompressed (twice as fast to write and read) when the disk holds it easily
      need=$(( CLIPS * FRAMES * 288 * 512 * 3 + (16 << 30) ))
      compress=$([ "$(df --output=avail -B1 "$RUN" | tail -n 1)" -gt "$need" ] && echo false || echo true)
    fi
    "$PY" -m terra.apps.make_dataset out_dir="$RUN/clips" num_clips="$CLIPS" num_frames="$FRAMES" height=288 width=512 \
      seed=0 workers="$DATA_WORKERS" compress="$compress"
    ;;
  tokenizer)
    budgeted tokenizer "$RUN/tokenizer" "$RUN/tokenizer/final/config.json" "$TOK_STEPS" 20000 "$TOK_CALIBRATE_MINUTES" \
      "$TOK_MINUTES" -m terra.apps.train_tokenizer train_tokenizer/model=lfq_terra_small \
      train.output_dir="$RUN/tokenizer" model.config.encoder_decoder_config.ch="$TOK_CH" \
      data.num_frames="$TOK_FRAMES" data.workers="$TOK_RENDER_WORKERS" \
      train.batch_size="$TOK_BATCH" train.warmup_steps="$TOK_WARMUP" train.device="$DEVICE" \
      train.ema_decay="$TOK_EMA_DECAY" train.eval_frames="$TOK_EVAL_FRAMES" train.log_every="$TOK_LOG_EVERY" \
      train.checkpoint_every=100000
    trained=$(last_step "$RUN/tokenizer/train_log.jsonl")  # a budget eaten by rendering leaves a tokenizer of ~2 steps
    if [ "$TOK_STEPS" = auto ] && [ "$trained" -lt "$TOK_WARMUP" ]; then
      echo "tokenizer: trained $trained steps, fewer than its $TOK_WARMUP warm-up steps: TOK_MINUTES=$TOK_MINUTES" \
        "left no time after rendering $TOK_FRAMES frames; raise it (4.5 by default) and start again in a new RUN" >&2
      exit 1
    fi
    ;;
  tokens)
    if [ ! -f "$RUN/tokens.safetensors" ]; then
      "$PY" -m terra.apps.tokenize_dataset dataset="$RUN/clips" tokenizer_path="$RUN/tokenizer/final" \
        out="$RUN/tokens.safetensors" batch_size=128 device="$DEVICE"
    fi
    [ "${KEEP_CLIPS:-0}" = 1 ] || rm -rf "$RUN/clips"  # 25 GB of frames; evaluation renders its own
    ;;
  world_model)
    budgeted world_model "$RUN/world_model" "$RUN/world_model/model/config.json" "$WM_STEPS" 100000 \
      "$WM_CALIBRATE_MINUTES" "$WM_MINUTES" -m terra.apps.train data.tokens="$RUN/tokens.safetensors" \
      output_dir="$RUN/world_model" data.val_clips="$WM_VAL_CLIPS" net.hidden_size="$WM_HIDDEN" \
      net.intermediate_size="$WM_INTERMEDIATE" net.num_hidden_layers="$WM_LAYERS" \
      net.num_attention_heads="$WM_HEADS" net.num_key_value_heads="$WM_KV_HEADS" net.num_temporal_embeddings=25 \
      train.window="$WM_WINDOW" train.batch_size="$WM_BATCH" train.lr="$WM_LR" train.warmup_steps="$WM_WARMUP" \
      train.log_every="$WM_LOG_EVERY" train.eval_every="$WM_EVAL_EVERY" train.ckpt_every=100000 \
      train.loss_chunk="$WM_LOSS_CHUNK" train.compile="$WM_COMPILE" train.device="$DEVICE" train.tensorboard=false \
      sample.gif=false export.best=false
    ;;
  measure)
    pair=(model.world_model="$RUN/world_model/model" tokenizer=terra_lfq tokenizer.path="$RUN/tokenizer/final")
    mkdir -p "$RESULTS"
    if [ ! -f "$RUN/eval/report.json" ]; then  # frame quality as MODEL_CARD.md reports it (sequential, greedy)
      "$PY" -m terra.apps.evaluate "${pair[@]}" backend=hf backend.options.max_batch_size=32 device="$DEVICE" \
        dtype="$EVAL_DTYPE" num_context="$EVAL_CONTEXT" horizon="$EVAL_HORIZON" quality.num_clips="$EVAL_CLIPS" \
        adherence.num_cases="$ADHERENCE_CASES" exclude_training.num_clips="$CLIPS" progress=false \
        out_dir="$RUN/eval"
    fi
    if [ ! -f "$RESULTS/$DECODING_OUT" ]; then  # forward passes per frame, sequential vs speculative
      "$PY" scripts/experiments/measure_decoding.py --world-model "$RUN/world_model/model" \
        --tokenizer "$RUN/tokenizer/final" --out "$RESULTS/$DECODING_OUT" --temperatures "$TEMPERATURES" --speculative "$SPECULATIVE" \
        --rollouts "$ROLLOUTS" --context "$EVAL_CONTEXT" --frames "$DECODE_FRAMES" --exclude-clips "$CLIPS" \
        --device "$DEVICE" --dtype "$EVAL_DTYPE"
    fi
    ;;
  collect)
    collect
    ;;
  all)
    mkdir -p "$RUN"; echo $$ > "$RUN/pid"; write_settings; mark all start
    trap 'mark all failed; collect' ERR
    trap 'mark all stopped; collect; exit 143' TERM
    mark data start; data_begin=$SECONDS
    bash "$SELF" data > "$RUN/data.log" 2>&1 & data_pid=$!
    stage tokenizer; collect
    if wait "$data_pid"; then mark data done "$((SECONDS - data_begin))s"; else
      mark data failed; tail -n 20 "$RUN/data.log"; false; fi
    tail -n 2 "$RUN/data.log"
    for name in tokens world_model measure; do stage "$name"; collect; done
    mark all done; collect
    ;;
  start)
    if [ -f "$RUN/pid" ] && kill -0 "$(cat "$RUN/pid")" 2>/dev/null; then
      echo "already running: pid $(cat "$RUN/pid")"; exit 0
    fi
    rm -rf "$WORK/tree"; mkdir -p "$WORK/tree" "$RUN"; rm -f "$RUN/pid"
    tar -cf - --exclude=./.git --exclude=./.venv --exclude="./.vllm*" --exclude=./.whl --exclude=./runs \
      --exclude=./outputs . | tar -xf - -C "$WORK/tree"
    for pkg in conf tokenizer decoder; do  # installed as terra.conf, terra.tokenizer, terra.decoder (pyproject.toml)
      [ -e "$WORK/tree/terra/$pkg" ] || ln -s "../$pkg" "$WORK/tree/terra/$pkg"
    done
    RUN=$RUN setsid nohup bash "$WORK/tree/scripts/recipes/train_terra_layout.sh" all >> "$RUN/run.log" 2>&1 \
      < /dev/null &
    for _ in $(seq 50); do [ -f "$RUN/pid" ] && break; sleep 0.2; done
    echo "started: pid $(cat "$RUN/pid"), log $RUN/run.log, status $RUN/status.log"
    ;;
  poll)
    begin=$SECONDS
    while true; do
      collect
      alive=no; [ -f "$RUN/pid" ] && kill -0 "$(cat "$RUN/pid")" 2>/dev/null && alive=yes
      if [ "$alive" = no ] || [ $((SECONDS - begin)) -ge "${WAIT_S:-0}" ]; then break; fi
      sleep 15
    done
    echo "== running: $alive; status ($RUN/status.log):"; cat "$RUN/status.log" 2>/dev/null || echo "(none)"
    echo "== log tail:"; tail -c 20000 "$RUN/run.log" 2>/dev/null | tr '\r' '\n' | grep -v '^\s*$' | tail -n 25 || true
    ;;
  stop)
    pid=$(cat "$RUN/pid"); kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"; echo "sent SIGTERM to $pid"
    ;;
  *)
    echo "usage: bash scripts/recipes/train_terra_layout.sh COMMAND, one of: start poll stop all data tokenizer tokens" \
      "world_model measure collect" >&2
    exit 2
    ;;
esac
