#!/usr/bin/env bash
# make device-check: the prepared check of issue 39, for a GPU machine with
# torch 2.x, transformers, lightning (no network, no Go: bin/spotagent is
# built beforehand by `make build` and travels with the tree). One command,
# under 8 minutes; the report goes to $OUT/device-check.txt, each case's
# logs and JSON beside it.
#
#   1. a CUDA model whose training state is several GiB under `spotagent run`
#      with the client: time blocked per checkpoint (staging), notice ->
#      stop, resume equal to an uninterrupted run bit for bit;
#   2. torchrun, 2 nodes x 2 ranks through `spotagent run --node-rank K`
#      (gloo ranks; "cpu:gloo,cuda:nccl" on a GPU: the non-gloo agreement
#      path): notice -> one job checkpoint -> bit-identical resume; a
#      vanished node -> 75; the launcher's exit codes and timings;
#   3. Hugging Face Trainer (save_steps, save_total_limit=2) under --watch;
#   4. Lightning ModelCheckpoint(every_n_train_steps) under --watch; 4b:
#      the --signal fallback as a Lightning callback;
#   5. DCP async_save into the request directory, `saved` once complete;
#   6. spotagent.hf.SpotagentCallback in the real Trainer on the GPU
#      (python/examples/hf_trainer.py --cuda): SIGTERM -> 75 -> resume equal;
#   7. spotagent.lightning.SpotagentCallback in a real Lightning Trainer
#      (python/devicecheck/lightning_callback.py): the same;
#   8. spotagent.dcp on CUDA: python/examples/train_dcp.py under torchrun
#      (1 node, one rank per GPU, TRAIN_DCP_DEVICE=cuda): SIGTERM -> 75 ->
#      each rank restores its own shard -> final weights equal.
#
# Each case prints PASS, FAIL or SKIP (with why) and its figures. On a CPU
# machine with Debian's torch 1.13 it runs what 1.13 can (1 on the CPU with
# a small state, 2 with gloo through python/examples/torchrun.py) and skips
# the rest, saying why. CI does not run it. Exit: 0 when nothing failed.
#
# On the device machine: `make build` here first; then run `make
# device-check` there with carry ["bin"] (the binary is ignored by git, 33 MB)
# and timeout_s 540; the report comes back under $OUT. Measured on the CPU
# machine (torch 1.13, 2 shared cores): cases 1-2 pass, 3-5 skip, 275 s.
#
# Environment: OUT (report folder; default a new /tmp folder), BIN,
# DEVICE_CHECK_PYTHON (default python3 if it imports torch, else
# /usr/bin/python3), DEVICE_CHECK_CASES (e.g. "1 3"), DEVICE_CHECK_GIB
# (case 1's state on a GPU, default 4).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export AWS_EC2_METADATA_DISABLED=true
export CUBLAS_WORKSPACE_CONFIG=:4096:8
export PYTHONUNBUFFERED=1
ROOT=$PWD
BIN=${BIN:-$ROOT/bin/spotagent}
OUT=${OUT:-$(mktemp -d /tmp/device-check-out.XXXXXX)}
CASES=${DEVICE_CHECK_CASES:-1 2 3 4 5 6 7 8}
mkdir -p "$OUT"
report=$OUT/device-check.txt
: >"$report"
# Checkpoints and stores go here, not under $OUT (they are GiB).
work=$(mktemp -d /tmp/device-check.XXXXXX)
started=$(date +%s)
failed=0

cleanup() {
  local p
  for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

PY=${DEVICE_CHECK_PYTHON:-python3}
if ! "$PY" -c 'import torch' 2>/dev/null; then PY=/usr/bin/python3; fi

say() { printf '%s\n' "$*" | tee -a "$report"; }
# result CASE STATUS FIGURES...
result() {
  local c=$1 s=$2
  shift 2
  [ "$s" = FAIL ] && failed=$((failed + 1))
  say "case $c: $s $*"
}
pyv() { "$PY" -c "$1" 2>/dev/null; }
# json FILE KEY: one value of a JSON object ("" when absent).
json() { "$PY" -c 'import json,sys
try: v = json.load(open(sys.argv[1])).get(sys.argv[2])
except Exception: v = None
print("" if v is None else v)' "$1" "$2"; }
now() { date +%s.%N; }
secs() { "$PY" -c 'import sys; print("%.2f" % (float(sys.argv[2]) - float(sys.argv[1])))' "$1" "$2"; }
# wait_for FILE REGEX SECONDS [PID]: until a line of FILE matches (a polled
# condition with a deadline); 1 at the deadline or once PID has exited.
wait_for() {
  local end=$((SECONDS + $3))
  while [ $SECONDS -lt $end ]; do
    grep -Eq "$2" "$1" 2>/dev/null && return 0
    if [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null; then return 1; fi
    sleep 0.2
  done
  return 1
}
# agent_exit_log FILE: the trainer's exit code as the agent logged it (JSON log).
trainer_code() { grep -o '"msg":"trainer exited"[^}]*"code":[0-9-]*' "$1" 2>/dev/null | tail -1 | grep -o '[0-9-]*$'; }
# The agent's flags every case shares: no cloud, a store and socket in $work.
# Each run is bounded (LIMIT seconds, then SIGTERM to the agent, SIGKILL
# 30 s later), so that a hang fails its case instead of eating the
# machine's time. `agent NAME` sets A to the agent's command line: started
# as "${A[@]}" ... &, $! is timeout's pid, which passes a SIGTERM on to the
# agent alone (--foreground: no second one through a process group).
LIMIT=${DEVICE_CHECK_LIMIT:-240}
A=()
agent() {
  A=(timeout --foreground -k 30 "$LIMIT" "$BIN" run --store "file://$work/$1/store" --run-id "$1" --cloud none
    --log-format json)
}

NGPU=1
CUDA=$(pyv 'import torch; print(int(torch.cuda.is_available()))')
TORCH=$(pyv 'import torch; print(torch.__version__)')
TORCH2=$(pyv 'import torch; print(int(int(torch.__version__.split(".")[0]) >= 2))')
GPU=$(pyv 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")')
say "device-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname): python $("$PY" -c 'import platform; print(platform.python_version())'), torch ${TORCH:-none}, GPU ${GPU:-none}"
say "  transformers $(pyv 'import transformers; print(transformers.__version__)' || echo none), lightning $(pyv 'import lightning; print(lightning.__version__)' || echo none), agent $("$BIN" version 2>/dev/null | head -1)"
if [ ! -x "$BIN" ]; then
  result all FAIL "no agent binary at $BIN: run make build first"
  exit 1
fi

# ------------------------------------------------------------------ case 1
case1() {
  local d=$work/c1 dev=cpu gib=0.05 steps=40 code t_sig stop_at rc
  mkdir -p "$d"
  # On a GPU the first commit of GiB takes seconds: steps enough to be
  # training still when the notice comes (the resumed run trains fast).
  if [ "$CUDA" = 1 ]; then dev=cuda gib=${DEVICE_CHECK_GIB:-4} steps=400; fi
  local tr=("$PY" "$ROOT/python/devicecheck/big_state.py" --device "$dev" --gib "$gib" --steps "$steps")
  (unset SPOTAGENT_SOCKET; "${tr[@]}" --out "$d/ref.json" >"$d/ref.log" 2>&1) || {
    cp "$d/ref.log" "$OUT/c1-ref.log"; result 1 FAIL "uninterrupted run failed (c1-ref.log)"; return; }
  # Periodic checkpoints every 4 s (the first stages into fresh pinned
  # buffers, later ones reuse them); the notice (SIGTERM) after the first commit.
  agent c1
  "${A[@]}" --checkpoint-dir "$d/ck1" --socket "$d/a1.sock" --interval 4s --term-grace 90s -- \
    "${tr[@]}" --step-time 0.25 --out "$d/int.json" >"$d/int.log" 2>"$d/int.agent.log" &
  local pid=$!
  if ! wait_for "$d/int.log" '^committed' 150 $pid; then
    kill -TERM $pid; wait $pid
    for f in "$d"/int*.log; do cp "$f" "$OUT/c1-$(basename "$f")"; done
    result 1 FAIL "no checkpoint committed within 150 s"; return
  fi
  t_sig=$(now)
  kill -TERM $pid
  wait $pid
  code=$?
  stop_at=$(json "$d/int.json" stop_at)
  # An empty machine: a new checkpoint directory, the same store.
  local t0
  t0=$(now)
  agent c1
  "${A[@]}" --checkpoint-dir "$d/ck2" --socket "$d/a2.sock" --interval 1h -- \
    "${tr[@]}" --out "$d/res.json" >"$d/res.log" 2>"$d/res.agent.log"
  rc=$?
  for f in "$d"/*.log "$d"/*.json; do [ -f "$f" ] && cp "$f" "$OUT/c1-$(basename "$f")"; done
  local ref res blocked bytes notice
  ref=$(json "$d/ref.json" sha256)
  res=$(json "$d/res.json" sha256)
  blocked=$(json "$d/int.json" blocked_s)
  bytes=$(json "$d/ref.json" state_bytes)
  notice=$([ -n "$stop_at" ] && secs "$t_sig" "$stop_at" || echo none)
  local figs
  figs="device=$dev state=$((bytes / 1048576))MiB blocked_s=$blocked notice_to_stop_s=$notice interrupted_exit=$code resumed_exit=$rc restore_wait_s=$(json "$d/res.json" restore_wait_s) resume_wall_s=$(secs "$t0" "$(now)")"
  if [ "$code" = 75 ] && [ "$rc" = 0 ] && [ -n "$ref" ] && [ "$ref" = "$res" ]; then
    result 1 PASS "$figs sha256 equal"
  else
    result 1 FAIL "$figs sha256 ref=${ref:0:12} resumed=${res:0:12}"
  fi
}

# ------------------------------------------------------------------ case 2
# node_cmd K PORT: N becomes torchrun's command line for node K of 2 (2
# ranks each) with the rendezvous on PORT (torch 1.13: the wrapper of
# python/examples/torchrun.py, for Debian's broken torchrun).
N=()
node_cmd() {
  if [ "$TORCH2" = 1 ]; then N=("$PY" -m torch.distributed.run); else N=("$PY" "$ROOT/python/examples/torchrun.py"); fi
  N+=(--nnodes 2 --node_rank "$1" --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$2"
    --monitor_interval 0.5 "$ROOT/python/examples/train_ddp.py")
}
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
final_lines() { grep -ho 'rank [0-9]* final sha256=[0-9a-f]*' "$@" | sed 's/ step=.*//' | sort; }

case2() {
  local d=$work/c2 port backend=gloo
  mkdir -p "$d"
  [ "$CUDA" = 1 ] && [ "$TORCH2" = 1 ] && backend="cpu:gloo,cuda:nccl"
  export TRAIN_DDP_BACKEND=$backend TOTAL_STEPS=160
  # Reference: the same job without agents, no interruption.
  port=$(free_port)
  local k
  for k in 0 1; do
    node_cmd $k "$port"
    (unset SPOTAGENT_SOCKET; exec "${N[@]}") >"$d/ref-$k.log" 2>&1 &
  done
  wait
  local ref
  ref=$(final_lines "$d"/ref-*.log)
  if [ "$(echo "$ref" | grep -c final)" != 4 ]; then
    result 2 FAIL "backend=$backend: the uninterrupted job did not finish (c2-ref-*.log)"
    for f in "$d"/ref-*.log; do cp "$f" "$OUT/c2-$(basename "$f")"; done
    return
  fi
  # Interrupted: a notice (SIGTERM) to node 0's agent at step 40.
  port=$(free_port)
  local pids=() codes=() t_sig t_end
  for k in 0 1; do
    agent c2
    node_cmd $k "$port"
    STEP_SLEEP_MS=40 "${A[@]}" --node-rank $k --checkpoint-dir "$d/ck1-$k" --socket "$d/a1-$k.sock" \
      --interval 1h --term-grace 40s -- "${N[@]}" >"$d/int-$k.log" 2>"$d/int-$k.agent.log" &
    pids+=($!)
  done
  if wait_for "$d/int-0.log" 'rank 0 step 40$' 120 "${pids[0]}"; then
    t_sig=$(now)
    kill -TERM "${pids[0]}"
  fi
  for k in 0 1; do wait "${pids[$k]}"; codes+=($?); done
  t_end=$(now)
  local stops
  stops=$(grep -ho 'stopping at step [0-9]*' "$d"/int-*.log | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  # Resume on empty machines (new checkpoint directories).
  port=$(free_port)
  pids=()
  local rcodes=()
  for k in 0 1; do
    agent c2
    node_cmd $k "$port"
    "${A[@]}" --node-rank $k --checkpoint-dir "$d/ck2-$k" --socket "$d/a2-$k.sock" --interval 1h -- \
      "${N[@]}" >"$d/res-$k.log" 2>"$d/res-$k.agent.log" &
    pids+=($!)
  done
  for k in 0 1; do wait "${pids[$k]}"; rcodes+=($?); done
  local res resumed
  res=$(final_lines "$d"/res-*.log)
  resumed=$(grep -ho 'resuming from step [0-9]*' "$d"/res-*.log | sort -u | tr '\n' ';')
  # A vanished node: SIGKILL node 1's agent (its guard takes torchrun and
  # the ranks with it) at step 30; node 0 must exit 75.
  port=$(free_port)
  pids=()
  for k in 0 1; do
    agent c2v
    node_cmd $k "$port"
    STEP_SLEEP_MS=40 "${A[@]}" --node-rank $k --checkpoint-dir "$d/ck3-$k" --socket "$d/a3-$k.sock" \
      --interval 1h -- "${N[@]}" >"$d/van-$k.log" 2>"$d/van-$k.agent.log" &
    pids+=($!)
  done
  local t_kill="" vcode=none vwait=none
  if wait_for "$d/van-0.log" 'rank 0 step 30$' 120 "${pids[0]}"; then
    t_kill=$(now)
    # The agent itself (timeout's child), then timeout (disowned: no job
    # notice from the shell for it).
    disown "${pids[1]}"
    kill -KILL "$(pgrep -P "${pids[1]}")" "${pids[1]}"
  fi
  wait "${pids[0]}"
  vcode=$?
  [ -n "$t_kill" ] && vwait=$(secs "$t_kill" "$(now)")
  for f in "$d"/*.log; do cp "$f" "$OUT/c2-$(basename "$f")"; done
  local figs
  figs="backend=$backend torch=$TORCH interrupted_exits=${codes[*]} torchrun_codes=$(trainer_code "$d/int-0.agent.log"),$(trainer_code "$d/int-1.agent.log") notice_to_exit_s=$([ -n "${t_sig:-}" ] && secs "$t_sig" "$t_end" || echo none) stops=[$stops] resumed=[$resumed] resumed_exits=${rcodes[*]} vanished_node0_exit=$vcode vanished_to_exit_s=$vwait vanished_torchrun_code=$(trainer_code "$d/van-0.agent.log")"
  if [ "${codes[*]}" = "75 75" ] && [ "${rcodes[*]}" = "0 0" ] && [ "$res" = "$ref" ] && [ "$vcode" = 75 ] && [ -n "$resumed" ]; then
    result 2 PASS "$figs final sha256 equal on 4 ranks"
  else
    result 2 FAIL "$figs final sha256 $([ "$res" = "$ref" ] && echo equal || echo DIFFER)"
  fi
  unset TRAIN_DDP_BACKEND TOTAL_STEPS
}

# ------------------------------------------------------------- cases 3, 4
# watch_case N NAME PATTERN DIRFLAG SCRIPT ARGS...: the same run three ways (bare;
# under --watch with a notice once checkpoint step >= 20 exists; on an empty
# machine under --watch), the final weights compared.
watch_case() {
  local n=$1 name=$2 dirflag=$4 script=$5 wf=()
  [ -n "$3" ] && wf=(--watch-pattern "$3")
  shift 5
  local d=$work/$name code rc t_sig t_end
  mkdir -p "$d"
  local tr=("$PY" "$ROOT/python/devicecheck/$script" "$@")
  (unset SPOTAGENT_SOCKET; "${tr[@]}" "$dirflag" "$d/ref" --out "$d/ref.json" >"$d/ref.log" 2>&1) || {
    cp "$d/ref.log" "$OUT/c$n-ref.log"; result "$n" FAIL "uninterrupted run failed (c$n-ref.log)"; return; }
  agent "$name"
  "${A[@]}" --checkpoint-dir "$d/ck1" --socket "$d/a1.sock" --watch "$d/run1" "${wf[@]}" \
    --term-grace 12s --margin 2s --watch-quiet 1s -- "${tr[@]}" "$dirflag" "$d/run1" --step-time 0.15 \
    --out "$d/int.json" >"$d/int.log" 2>"$d/int.agent.log" &
  local pid=$!
  if wait_for "$d/int.log" '^step (2[5-9]|[3-9][0-9])$' 120 $pid; then
    t_sig=$(now)
    kill -TERM $pid
  fi
  wait $pid
  code=$?
  t_end=$(now)
  local listed
  listed=$("$BIN" list --store "file://$d/store" 2>&1 | tail -n +2 | wc -l)
  # An empty machine: the same paths, nothing in them.
  rm -rf "$d/run1"
  agent "$name"
  "${A[@]}" --checkpoint-dir "$d/ck2" --socket "$d/a2.sock" --watch "$d/run1" "${wf[@]}" --watch-quiet 1s -- \
    "${tr[@]}" "$dirflag" "$d/run1" --out "$d/res.json" >"$d/res.log" 2>"$d/res.agent.log"
  rc=$?
  for f in "$d"/*.log "$d"/*.json; do [ -f "$f" ] && cp "$f" "$OUT/c$n-$(basename "$f")"; done
  local ref res from stopped
  ref=$(json "$d/ref.json" sha256)
  res=$(json "$d/res.json" sha256)
  from=$(json "$d/res.json" resumed_from)
  stopped=$(grep -E '^step [0-9]+$' "$d/int.log" | tail -1 | grep -o '[0-9]*$')
  local figs
  figs="interrupted_exit=$code notice_to_exit_s=$([ -n "${t_sig:-}" ] && secs "$t_sig" "$t_end" || echo none) last_step_before_stop=${stopped:-none} committed_in_store=$listed resumed_from=$(basename "${from:-none}") resumed_exit=$rc"
  if [ "$code" = 75 ] && [ "$rc" = 0 ] && [ -n "$from" ] && [ -n "$ref" ] && [ "$ref" = "$res" ]; then
    result "$n" PASS "$figs final weights equal"
  else
    result "$n" FAIL "$figs sha256 ref=${ref:0:12} resumed=${res:0:12}"
  fi
}

case3() {
  if ! pyv 'import transformers, accelerate' >/dev/null; then
    result 3 SKIP "transformers/accelerate not importable by $PY (torch $TORCH): the GPU machine has transformers 5.17"
    return
  fi
  watch_case 3 c3 "" --output-dir hf_trainer.py --steps 120 --save-steps 10
}

case4() {
  if ! pyv 'import lightning' >/dev/null; then
    result 4 SKIP "lightning not importable by $PY (torch $TORCH): the GPU machine has lightning 2.6.6"
    return
  fi
  watch_case 4 c4 'last-*.ckpt' --ckpt-dir lightning_trainer.py --steps 120 --every 10
  # 4b: the --signal fallback wired into Lightning as a callback (a notice at
  # step 40; the resume reads $SPOTAGENT_RESUME_DIR, so --restore-serial).
  local d=$work/c4b code rc
  mkdir -p "$d"
  local tr=("$PY" "$ROOT/python/devicecheck/lightning_trainer.py" --signal-mode --ckpt-dir "$d/unused" --steps 120)
  agent c4b
  "${A[@]}" --checkpoint-dir "$d/ck1" --socket "$d/a1.sock" --signal SIGUSR1 --restore-serial --interval 1h \
    --term-grace 30s -- "${tr[@]}" --step-time 0.15 --out "$d/int.json" >"$d/int.log" 2>"$d/int.agent.log" &
  local pid=$!
  wait_for "$d/int.log" '^step 40$' 120 $pid && kill -TERM $pid
  wait $pid
  code=$?
  agent c4b
  "${A[@]}" --checkpoint-dir "$d/ck2" --socket "$d/a2.sock" --signal SIGUSR1 --restore-serial --interval 1h -- \
    "${tr[@]}" --out "$d/res.json" >"$d/res.log" 2>"$d/res.agent.log"
  rc=$?
  for f in "$d"/*.log "$d"/*.json; do [ -f "$f" ] && cp "$f" "$OUT/c4b-$(basename "$f")"; done
  local ref res
  ref=$(json "$work/c4/ref.json" sha256)
  res=$(json "$d/res.json" sha256)
  local figs
  figs="signal: interrupted_exit=$code trainer_code=$(trainer_code "$d/int.agent.log") $(grep -ho 'checkpoint saved at step [0-9]*' "$d/int.log" | tail -1) resumed_from=$(json "$d/res.json" resumed_from) resumed_exit=$rc"
  if [ "$code" = 75 ] && [ "$rc" = 0 ] && [ -n "$ref" ] && [ "$ref" = "$res" ]; then
    result 4b PASS "$figs final weights equal"
  else
    result 4b FAIL "$figs sha256 ref=${ref:0:12} resumed=${res:0:12}"
  fi
}

# ------------------------------------------------------------------ case 5
case5() {
  if [ "$(pyv 'import torch.distributed.checkpoint as d; print(int(hasattr(d, "async_save")))')" != 1 ]; then
    result 5 SKIP "torch $TORCH has no torch.distributed.checkpoint.async_save (torch >= 2.3)"
    return
  fi
  local d=$work/c5 code rc
  mkdir -p "$d"
  local tr=("$PY" "$ROOT/python/devicecheck/dcp_async.py" --steps 80)
  (unset SPOTAGENT_SOCKET; "${tr[@]}" --out "$d/ref.json" >"$d/ref.log" 2>&1) || {
    cp "$d/ref.log" "$OUT/c5-ref.log"; result 5 FAIL "uninterrupted run failed (c5-ref.log)"; return; }
  agent c5
  "${A[@]}" --checkpoint-dir "$d/ck1" --socket "$d/a1.sock" --interval 3s --term-grace 30s -- \
    "${tr[@]}" --step-time 0.1 --out "$d/int.json" >"$d/int.log" 2>"$d/int.agent.log" &
  local pid=$!
  wait_for "$d/int.log" '^checkpoint .* \(periodic\)' 60 $pid && wait_for "$d/int.log" '^step 40$' 60 $pid
  kill -TERM $pid
  wait $pid
  code=$?
  agent c5
  "${A[@]}" --checkpoint-dir "$d/ck2" --socket "$d/a2.sock" --interval 1h -- \
    "${tr[@]}" --out "$d/res.json" >"$d/res.log" 2>"$d/res.agent.log"
  rc=$?
  for f in "$d"/*.log "$d"/*.json; do [ -f "$f" ] && cp "$f" "$OUT/c5-$(basename "$f")"; done
  local ref res
  ref=$(json "$d/ref.json" sha256)
  res=$(json "$d/res.json" sha256)
  local figs
  figs="async_saves=$(json "$d/int.json" async_saves) blocked_s=$(json "$d/int.json" blocked_s) interrupted_exit=$code resumed_exit=$rc $(grep -ho 'resumed from step [0-9]*' "$d/res.log")"
  if [ "$code" = 75 ] && [ "$rc" = 0 ] && [ -n "$ref" ] && [ "$ref" = "$res" ]; then
    result 5 PASS "$figs sha256 equal"
  else
    result 5 FAIL "$figs sha256 ref=${ref:0:12} resumed=${res:0:12}"
  fi
}

# ------------------------------------------------------- cases 6, 7, 8
# callback_case N NAME REF_REGEX CMD: CMD (a function below, run by bash
# with the word ref, int or res) bare
# (reference), then under the agent with SIGTERM at step 20 (exit 75), then
# a fresh agent and directory resuming; PASS when the final lines match.
callback_case() {
  local n=$1 name=$2 rx=$3
  shift 3
  local d=$work/$name code rc pid ref res
  mkdir -p "$d"
  export PY ROOT work CUDA NGPU
  export -f hf_cmd lightning_cmd dcp_cmd json free_port
  (unset SPOTAGENT_SOCKET; bash -c "$1 ref" >"$d/ref.log" 2>&1)
  ref=$(grep -Eo "$rx" "$d/ref.log" | tail -1)
  [ -n "$ref" ] || { cp "$d/ref.log" "$OUT/$name-ref.log"; result "$n" FAIL "uninterrupted run failed ($name-ref.log)"; return; }
  agent "$name"
  "${A[@]}" --checkpoint-dir "$d/ck1" --socket "$d/a1.sock" --interval 1h --term-grace 30s -- bash -c "$1 int" \
    >"$d/int.log" 2>"$d/int.agent.log" &
  pid=$!
  local t0=""
  wait_for "$d/int.log" '^step 20$' 180 $pid && { t0=$(now); kill -TERM $pid; }
  wait $pid
  code=$?
  local t1
  t1=$(now)
  agent "$name"
  "${A[@]}" --checkpoint-dir "$d/ck2" --socket "$d/a2.sock" --interval 1h -- bash -c "$1 res" >"$d/res.log" 2>"$d/res.agent.log"
  rc=$?
  for f in "$d"/*.log; do cp "$f" "$OUT/$name-$(basename "$f")"; done
  res=$(grep -Eo "$rx" "$d/res.log" | tail -1)
  local figs
  figs="interrupted_exit=$code sigterm_to_exit_s=$([ -n "$t0" ] && secs "$t0" "$t1" || echo none) resumed_exit=$rc $(grep -ho 'resum[a-z]* from [^ ]*' "$d/res.log" | head -1)"
  if [ "$code" = 75 ] && [ "$rc" = 0 ] && [ "$ref" = "$res" ]; then
    result "$n" PASS "$figs final equal"
  else
    result "$n" FAIL "$figs ref=${ref:0:40} resumed=${res:0:40}"
  fi
}

# The trainer's command for callback_case: the last word (ref, int, res) names its output.
hf_cmd() { local cuda=""; [ "$CUDA" = 1 ] && cuda=--cuda
  "$PY" "$ROOT/python/examples/hf_trainer.py" --steps 60 --step-sleep-ms 100 $cuda --output-dir "$work/c6/out-$1"; }
lightning_cmd() { "$PY" "$ROOT/python/devicecheck/lightning_callback.py" --steps 60 --step-time 0.1 --out "$work/c7/$1.json" &&
  echo "final sha256=$(json "$work/c7/$1.json" sha256)"; }
dcp_cmd() { TRAIN_DCP_DEVICE=cuda TOTAL_STEPS=60 STEP_SLEEP_MS=100 "$PY" "$ROOT/python/examples/torchrun.py" --nnodes 1 \
  --nproc-per-node "$NGPU" --master-addr 127.0.0.1 --master-port "$(free_port)" "$ROOT/python/examples/train_dcp.py" | sed 's/^rank 0 step/step/'; }

case6() {
  if ! pyv 'import transformers, accelerate' >/dev/null; then
    result 6 SKIP "transformers/accelerate not importable by $PY (torch $TORCH)"
    return
  fi
  callback_case 6 c6 'final sha256=[0-9a-f]+ step=[0-9]+' hf_cmd
}

case7() {
  if ! pyv 'import lightning' >/dev/null; then
    result 7 SKIP "lightning not importable by $PY (torch $TORCH)"
    return
  fi
  callback_case 7 c7 'final sha256=[0-9a-f]+' lightning_cmd
}

case8() {
  if [ "$CUDA" != 1 ] || [ "$TORCH2" != 1 ]; then
    result 8 SKIP "DCP on CUDA needs a GPU and torch 2.x (torch $TORCH, GPU ${GPU:-none})"
    return
  fi
  NGPU=$(pyv 'import torch; print(torch.cuda.device_count())')
  export NGPU
  callback_case 8 c8 'rank 0 final sha256=[0-9a-f]+ step=[0-9]+' dcp_cmd
  grep -h 'restored bytes=' "$OUT/c8-res.log" | tee -a "$report"
}

for c in $CASES; do
  t=$(now)
  case $c in
  1) case1 ;;
  2) case2 ;;
  3) case3 ;;
  4) case4 ;;
  5) case5 ;;
  6) case6 ;;
  7) case7 ;;
  8) case8 ;;
  *) result "$c" FAIL "no such case" ;;
  esac
  say "  (case $c took $(secs "$t" "$(now)") s)"
done
failed=$(grep -c '^case .*: FAIL' "$report")
say "device-check: $failed failed, $(($(date +%s) - started)) s in all; report $report"
[ "$failed" = 0 ]
