#!/usr/bin/env python3
"""A deterministic, standard-library-only trainer for spotagent.

Linear regression by minibatch SGD on data generated from random.Random(seed).
Its complete state (parameters, the shuffling RNG, the data position, the step)
is saved into each checkpoint directory the agent asks for, and a resumed run
continues bit-for-bit: its final parameters equal an uninterrupted run's.

    python3 train.py --steps 300 --out final.json            # bare (no agent)
    spotagent run --cloud none --store file:///tmp/store -- python3 train.py --out final.json

Test-only: SPOTAGENT_EXAMPLE_STOP_AT=K saves a checkpoint after step K into
$SPOTAGENT_CHECKPOINT_DIR/example-stop-<K> and exits 0, simulating an
interruption without an agent (resume it with SPOTAGENT_RESUME_DIR).
"""

import argparse
import hashlib
import json
import os
import random
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

try:
    import spotagent
except ImportError:  # running from a source checkout without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import spotagent

SEED = 1234
FEATURES = 8
SAMPLES = 512
BATCH = 16
LR = 0.02
STATE_FILE = "state.json"
PAYLOAD_FILE = "payload.bin"


def make_data(seed: int) -> Tuple[List[List[float]], List[float]]:
    rng = random.Random(seed)
    true_w = [rng.uniform(-2.0, 2.0) for _ in range(FEATURES)]
    xs, ys = [], []
    for _ in range(SAMPLES):
        x = [rng.gauss(0.0, 1.0) for _ in range(FEATURES)]
        xs.append(x)
        ys.append(sum(a * b for a, b in zip(true_w, x)) + 0.5 + rng.gauss(0.0, 0.1))
    return xs, ys


class Trainer(object):
    def __init__(self) -> None:
        self.xs, self.ys = make_data(SEED)
        self.w = [0.0] * FEATURES
        self.b = 0.0
        self.step = 0
        self.epoch = 0
        self.batch = 0  # next batch index within the epoch
        self.rng = random.Random(SEED + 1)  # shuffles the data each epoch
        self.epoch_rng_state = None  # type: Any
        self.loss = float("nan")
        self._start_epoch()

    def _start_epoch(self) -> None:
        # The RNG state *before* the shuffle is what a checkpoint stores: a
        # resumed run re-draws the same permutation and ends in the same state.
        self.epoch_rng_state = self.rng.getstate()
        self.perm = list(range(SAMPLES))
        self.rng.shuffle(self.perm)

    def train_step(self) -> None:
        idx = self.perm[self.batch * BATCH : (self.batch + 1) * BATCH]
        gw = [0.0] * FEATURES
        gb = 0.0
        loss = 0.0
        for i in idx:
            x, y = self.xs[i], self.ys[i]
            err = sum(a * b for a, b in zip(self.w, x)) + self.b - y
            loss += err * err
            for j in range(FEATURES):
                gw[j] += 2.0 * err * x[j]
            gb += 2.0 * err
        n = float(len(idx))
        self.w = [w - LR * g / n for w, g in zip(self.w, gw)]
        self.b -= LR * gb / n
        self.loss = loss / n
        self.step += 1
        self.batch += 1
        if self.batch * BATCH >= SAMPLES:
            self.epoch += 1
            self.batch = 0
            self._start_epoch()

    # -- checkpointing: everything needed to continue exactly
    def state(self) -> Dict[str, Any]:
        version, internal, gauss_next = self.epoch_rng_state
        return {
            "format": "spotagent-example-train/v1",
            "step": self.step,
            "epoch": self.epoch,
            "batch": self.batch,
            "w": [v.hex() for v in self.w],  # float.hex: exact, bit for bit
            "b": self.b.hex(),
            "loss": self.loss.hex(),
            "epoch_rng_state": [version, list(internal), gauss_next],
        }

    def load(self, st: Dict[str, Any]) -> None:
        self.step = int(st["step"])
        self.epoch = int(st["epoch"])
        self.batch = int(st["batch"])
        self.w = [float.fromhex(v) for v in st["w"]]
        self.b = float.fromhex(st["b"])
        self.loss = float.fromhex(st["loss"])
        version, internal, gauss_next = st["epoch_rng_state"]
        self.rng.setstate((version, tuple(internal), gauss_next))
        self._start_epoch()  # same permutation as before the interruption

    def metadata(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "batch": self.batch, "loss": self.loss}


def _write_durably(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(trainer: Trainer, directory: str, save_bytes: int) -> None:
    os.makedirs(directory, exist_ok=True)
    if save_bytes > 0:  # benchmark ballast: incompressible bytes
        tmp = os.path.join(directory, PAYLOAD_FILE + ".tmp")
        with open(tmp, "wb") as f:
            left = save_bytes
            while left > 0:
                n = min(left, 1 << 20)
                f.write(os.urandom(n))
                left -= n
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, PAYLOAD_FILE))
    _write_durably(os.path.join(directory, STATE_FILE), json.dumps(trainer.state()).encode())
    _fsync_dir(directory)


def load_checkpoint(directory: str) -> Dict[str, Any]:
    with open(os.path.join(directory, STATE_FILE), "rb") as f:
        return json.loads(f.read().decode())


def write_out(trainer: Trainer, path: str) -> None:
    params = [v.hex() for v in trainer.w] + [trainer.b.hex()]
    doc = {
        "step": trainer.step,
        "w": params[:-1],
        "b": params[-1],
        "sha256": hashlib.sha256(",".join(params).encode()).hexdigest(),
    }
    _write_durably(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="total training steps (default 300)")
    ap.add_argument("--step-time", type=float, default=0.05, help="seconds to sleep per step (default 0.05)")
    ap.add_argument("--out", help="write the final parameters here as JSON (exact, float.hex)")
    ap.add_argument("--save-bytes", type=int, default=0, help="extra payload bytes in each checkpoint (benchmarks)")
    args = ap.parse_args(argv)
    stop_at = int(os.environ.get("SPOTAGENT_EXAMPLE_STOP_AT") or 0)

    agent = spotagent.connect()
    trainer = Trainer()
    if agent.resume_dir:
        trainer.load(load_checkpoint(agent.resume_dir))
        print("resuming from step %d (%s)" % (trainer.step, agent.resume_dir), flush=True)
    else:
        print("starting fresh", flush=True)

    try:
        while trainer.step < args.steps:
            trainer.train_step()
            step = trainer.step  # steps completed = where a resumed run continues
            if args.step_time > 0:
                time.sleep(args.step_time)
            if step % 25 == 0:
                print("step %d  epoch %d  loss %.6f" % (step, trainer.epoch, trainer.loss), flush=True)

            req = agent.poll(step)  # never blocks
            if req:
                t0 = time.monotonic()
                try:
                    save_checkpoint(trainer, req.dir, args.save_bytes)
                except OSError as e:
                    # A full or read-only disk fails this checkpoint, not the
                    # run: the agent names the cause (ENOSPC, EACCES, ...)
                    # and the committed checkpoint stands.
                    req.fail(e)
                    print("checkpoint %s (%s) at step %d failed: %s" % (req.id, req.reason, step, e), flush=True)
                else:
                    req.done(step, metadata=trainer.metadata())
                    print("checkpoint %s (%s) at step %d in %.2fs" % (req.id, req.reason, step, time.monotonic() - t0),
                          flush=True)

            if stop_at and step == stop_at:  # test hook: simulate an interruption
                d = os.path.join(agent.checkpoint_dir or ".", "example-stop-%d" % step)
                save_checkpoint(trainer, d, args.save_bytes)
                agent.checkpoint_done(step, d, metadata=trainer.metadata())
                print("SPOTAGENT_EXAMPLE_STOP_AT: saved %s, exiting" % d, flush=True)
                return 0

            if agent.should_stop:
                print("stopping at step %d: %s" % (step, agent.stop_reason or "agent asked"), flush=True)
                return agent.exit_code  # 75: interrupted, run me again (resumes)
    finally:
        agent.close()

    print("finished %d steps, loss %.6f" % (trainer.step, trainer.loss), flush=True)
    if args.out:
        write_out(trainer, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
