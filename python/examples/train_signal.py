#!/usr/bin/env python3
"""A trainer that does not speak the spotagent protocol: the signal fallback.

Run it under `spotagent run --signal SIGUSR1 -- python3 train_signal.py`. The
agent asks for a checkpoint by writing $SPOTAGENT_REQUEST_FILE (JSON: id, dir,
reason, deadline) and sending SIGUSR1. The handler only sets a flag; at the
next step boundary the trainer saves into the request's dir and then creates
the marker file SPOTAGENT_DONE there, holding the step. Once the interruption
(or shutdown) checkpoint is committed, or has failed, the agent sends SIGTERM.
On start, a restored checkpoint is in $SPOTAGENT_RESUME_DIR. The agent signals
the process it started: run this with `exec`, not behind a shell or launcher.

This is the pattern to copy into a framework's own handler (PyTorch Lightning,
a shell script): no library, standard library only. Its "model" is a
deterministic recurrence, so a resumed run's result equals an uninterrupted one.

    python3 train_signal.py --steps 300 --out final.json     # bare (no agent)
"""

import argparse
import json
import os
import signal
import sys
import time

STATE_FILE = "state.json"

checkpoint_asked = False
stop_asked = False


def on_checkpoint_signal(signum, frame):
    global checkpoint_asked
    checkpoint_asked = True


def on_sigterm(signum, frame):
    global stop_asked
    stop_asked = True


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def save(step, value):
    """Answer the agent's request: files first, the marker last."""
    try:
        with open(os.environ["SPOTAGENT_REQUEST_FILE"]) as f:
            req = json.load(f)
    except (OSError, ValueError) as e:  # the request ended (deadline) before we got to it
        print("no checkpoint request to answer: %s" % e, flush=True)
        return
    try:
        write_atomic(os.path.join(req["dir"], STATE_FILE), json.dumps({"step": step, "value": value}))
        marker = os.path.join(req["dir"], os.environ.get("SPOTAGENT_DONE_MARKER", "SPOTAGENT_DONE"))
        write_atomic(marker, str(step))
    except OSError as e:  # the agent gave up on this request and removed its dir
        print("checkpoint at step %d not saved: %s" % (step, e), flush=True)
        return
    print("checkpoint saved at step %d (%s)" % (step, req["reason"]), flush=True)


def main():
    global checkpoint_asked
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--out", default="")
    args = p.parse_args()

    if os.environ.get("SPOTAGENT_SIGNAL"):
        signal.signal(getattr(signal, os.environ["SPOTAGENT_SIGNAL"]), on_checkpoint_signal)
    signal.signal(signal.SIGTERM, on_sigterm)

    step, value = 0, 1
    resume = os.environ.get("SPOTAGENT_RESUME_DIR")
    if resume:
        with open(os.path.join(resume, STATE_FILE)) as f:
            st = json.load(f)
        step, value = int(st["step"]), int(st["value"])
        print("resumed at step %d" % step, flush=True)

    while step < args.steps:
        if stop_asked:
            print("stopping at step %d" % step, flush=True)
            return 75  # EX_TEMPFAIL: interrupted, run me again (spotagent's own exit code after a stop)
        value = (value * 48271 + step) % 2147483647  # one "training step"
        step += 1
        if args.step_time:
            time.sleep(args.step_time)
        if checkpoint_asked:
            checkpoint_asked = False
            save(step, value)

    print("finished at step %d value %d" % (step, value), flush=True)
    if args.out:
        write_atomic(args.out, json.dumps({"step": step, "value": value}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
