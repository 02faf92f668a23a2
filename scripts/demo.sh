#!/usr/bin/env bash
# make demo: the product's promise on one machine, no cloud account needed.
#  1. A fake AWS metadata service (IMDSv2) will announce a spot interruption
#     about 20 s in.
#  2. The example trainer (PyTorch when importable, else the stdlib one) runs
#     under `spotagent run` with a file:// store.
#  3. The notice arrives: the agent asks for a checkpoint, commits it, tells
#     the trainer to stop; both exit 75 ("run me again"). The "machine" is gone.
#  4. A new run on the same store restores the checkpoint and finishes.
#  5. `spotagent history` shows what happened.
#  6. The same trainer runs once more without any interruption (no sleeps:
#     a second or two); the resumed run's final parameters must be
#     identical to its, bit for bit, or the demo fails.
#  7. `spotagent report` on the store, which the demo keeps (its path is
#     printed) so that list, history and report can be tried afterwards.
# Nothing here talks to a cloud: the metadata service is a fake on
# loopback and the AWS SDK never asks the link-local address for credentials.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/spotagent}
export AWS_EC2_METADATA_DISABLED=true
work=$(mktemp -d /tmp/spotagent-demo.XXXXXX)
keep=$(mktemp -d /tmp/spotagent-demo-store.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
store="file://$keep/store"

py=/usr/bin/python3
[ -x "$py" ] || py=python3
if "$py" -c 'import torch' 2>/dev/null; then
  trainer=("$py" python/examples/train_torch.py --steps 600 --step-time 0.05)
  kind="PyTorch"
else
  trainer=("$py" python/examples/train.py --steps 600 --step-time 0.05)
  kind="standard-library"
fi

# Bold headings on a terminal only: a log file or a pipe gets no escape codes.
if [ -t 1 ]; then
  say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
  say() { printf '\n== %s\n' "$*"; }
fi

# metadata ARGS...: starts a fake EC2 metadata service on a free port and
# sets imds to its URL once it is listening (md_pid to its process). It writes `export NAME=URL` on stdout
# only after it has bound its port, so reading that line (through a FIFO, no
# polling) is the wait: the trainer never starts before its metadata service.
metadata() {
  local fifo="$work/metadata.$RANDOM" line
  mkfifo "$fifo"
  "$BIN" fake-metadata --cloud aws --addr 127.0.0.1:0 --log-level warn "$@" >"$fifo" &
  md_pid=$!
  if ! read -r -t 30 line <"$fifo"; then
    echo "demo: the fake metadata service did not start" >&2
    exit 1
  fi
  rm -f "$fifo"
  imds=${line#*=}
}

agent_flags=(--store "$store" --run-id demo --checkpoint-dir "$work/ckpt" --socket "$work/agent.sock"
  --cloud aws --interval 10s --log-format console)

say "0/5  the store: $store (kept after the demo)"

say "1/5  a fake EC2 metadata service that will announce a spot interruption in 20s"
metadata --notice-after 20s
say "2/5  the $kind example trainer under spotagent run (periodic checkpoints every 10s)"
code=0
"$BIN" run "${agent_flags[@]}" --aws-imds-endpoint "$imds" -- "${trainer[@]}" --out "$work/final.json" || code=$?
# 75 (EX_TEMPFAIL) is the documented "interrupted, checkpoint committed, run me again".
if [ "$code" -ne 75 ]; then
  echo "demo: the interrupted run exited $code, expected 75" >&2
  exit 1
fi
echo "spotagent exited 75: interrupted, checkpoint committed, run me again"
kill "$md_pid" 2>/dev/null || true
wait "$md_pid" 2>/dev/null || true

say "the machine is gone. What the store holds:"
"$BIN" list --store "$store"

say "3/5  a new machine (no notice this time): restore and finish"
metadata
"$BIN" run "${agent_flags[@]}" --aws-imds-endpoint "$imds" -- "${trainer[@]}" --out "$work/final.json"

say "4/5  the run journal (spotagent history)"
"$BIN" history --store "$store"

say "5/5  the promise: the resumed run ends where an uninterrupted one does"
# The same trainer, same data and seed, bare (no agent, no interruption) and
# without the per-step sleep, which only paces the demo.
(unset SPOTAGENT_SOCKET SPOTAGENT_RESUME_DIR SPOTAGENT_RESUME_STEP SPOTAGENT_RESUME_MANIFEST
 "${trainer[@]}" --step-time 0 --out "$work/uninterrupted.json" >/dev/null)
digest() { "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["sha256"])' "$1"; }
resumed=$(digest "$work/final.json")
reference=$(digest "$work/uninterrupted.json")
echo "resumed run:       sha256 $resumed"
echo "uninterrupted run: sha256 $reference"
if [ "$resumed" != "$reference" ]; then
  echo "demo: FAILED: the resumed run's final parameters differ from an uninterrupted run's" >&2
  exit 1
fi
echo "identical: the interruption cost no training state"

say "the run's goodput (spotagent report)"
"$BIN" report --store "$store" --advice-runs 0

cat <<EOF

The store is kept: try
  $BIN list    --store $store
  $BIN history --store $store
  $BIN report  --store $store
  $BIN restore --store $store --dest /tmp/restored
Clean up with: rm -rf $keep
EOF
