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
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/spotagent}
work=$(mktemp -d /tmp/spotagent-demo.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
store="file://$work/store"

py=/usr/bin/python3
[ -x "$py" ] || py=python3
if "$py" -c 'import torch' 2>/dev/null; then
  trainer=("$py" python/examples/train_torch.py --steps 600 --step-time 0.05)
  kind="PyTorch"
else
  trainer=("$py" python/examples/train.py --steps 600 --step-time 0.05)
  kind="standard-library"
fi

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

agent_flags=(--store "$store" --run-id demo --checkpoint-dir "$work/ckpt" --socket "$work/agent.sock"
  --cloud aws --interval 10s --log-format console)

say "1/4  a fake EC2 metadata service that will announce a spot interruption in 20s"
p1=$(port)
"$BIN" fake-metadata --cloud aws --addr "127.0.0.1:$p1" --notice-after 20s --log-level warn >/dev/null &
say "2/4  the $kind example trainer under spotagent run (periodic checkpoints every 10s)"
code=0
"$BIN" run "${agent_flags[@]}" --aws-imds-endpoint "http://127.0.0.1:$p1" -- "${trainer[@]}" --out "$work/final.json" || code=$?
# 75 (EX_TEMPFAIL) is the documented "interrupted, checkpoint committed, run me again".
if [ "$code" -ne 75 ]; then
  echo "demo: the interrupted run exited $code, expected 75" >&2
  exit 1
fi
echo "spotagent exited 75: interrupted, checkpoint committed, run me again"
kill %1 2>/dev/null || true
wait 2>/dev/null || true

say "the machine is gone. What the store holds:"
"$BIN" list --store "$store"

say "3/4  a new machine (no notice this time): restore and finish"
p2=$(port)
"$BIN" fake-metadata --cloud aws --addr "127.0.0.1:$p2" --log-level warn >/dev/null &
"$BIN" run "${agent_flags[@]}" --aws-imds-endpoint "http://127.0.0.1:$p2" -- "${trainer[@]}" --out "$work/final.json"

say "4/4  the run journal (spotagent history)"
"$BIN" history --store "$store"
echo
echo "final parameters: $(grep -o '"sha256": *"[0-9a-f]*"' "$work/final.json" | head -1)"
