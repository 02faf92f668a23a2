#!/usr/bin/env python3
"""Train a small PyTorch model under spotagent and resume it exactly.

THIS IS THE FILE TO COPY. The parts that matter for your own trainer are marked
"spotagent:"; everything else is an ordinary deterministic PyTorch loop.

The rule for an exact resume: a checkpoint holds *everything* the next step
depends on -- model weights, optimizer state (Adam moments), LR scheduler, every
RNG (torch's global RNG used by dropout, the DataLoader's shuffling generator,
Python's `random`, numpy's if you use it) and the data position (epoch, batch
index within the epoch). Then a resumed run's final weights are bit-identical to
an uninterrupted run's.

    python3 train_torch.py --steps 300 --out final.json          # bare (no agent)
    spotagent run --store s3://bucket/runs/exp1 -- python3 train_torch.py --out final.json

Checkpoints are saved without blocking training (spotagent.torch.save): the
state is copied to CPU memory at the step boundary -- the only pause -- and
written, fsynced and uploaded by background threads while training goes on;
the agent starts uploading each file as soon as it is written. Pass
--blocking-save for the plain torch.save path: right when there is no CPU RAM
for a second copy of the state, or when something else must see the files
complete before the next step.

Test-only: SPOTAGENT_EXAMPLE_STOP_AT=K saves a checkpoint after step K into
$SPOTAGENT_CHECKPOINT_DIR/example-stop-<K> and exits 0 (a simulated interruption
without an agent; resume it with SPOTAGENT_RESUME_DIR=that directory).
"""

import argparse
import hashlib
import itertools
import json
import os
import random
import sys
import time
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import spotagent
except ImportError:  # running from a source checkout without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import spotagent

SEED = 0
SAMPLES, FEATURES, HIDDEN, CLASSES = 1024, 16, 32, 4
BATCH = 32  # 32 batches per epoch
LR = 1e-2
STATE_FILE = "state.pt"  # everything but the model and the optimizer
MODEL_FILE = "model.pt"
OPTIM_FILE = "optim.pt"
PAYLOAD_FILE = "payload.bin"


def make_dataset() -> TensorDataset:
    """A synthetic classification task, identical on every run."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    y = (x @ teacher + 0.3 * torch.randn(SAMPLES, CLASSES, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Dropout(p=0.1),  # uses torch's global RNG: that state must be checkpointed
        nn.Linear(HIDDEN, CLASSES),
    )


# --------------------------------------------------------------------------
# spotagent: saving and loading a checkpoint
# --------------------------------------------------------------------------


def split_state(state: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The files of a checkpoint: the model, the optimizer, and the rest."""
    rest = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
    return {MODEL_FILE: state["model"], OPTIM_FILE: state["optimizer"], STATE_FILE: rest}


def write_payload(f: Any, n: int) -> None:
    """Benchmark ballast (--save-bytes): n incompressible bytes."""
    left = n
    while left > 0:
        k = min(left, 1 << 20)
        f.write(os.urandom(k))
        left -= k


def save_checkpoint(directory: str, state: Dict[str, Any], save_bytes: int = 0) -> None:
    """The blocking save: write each file durably (temp name, fsync, rename,
    fsync dir) before returning.

    spotagent uploads whatever files are in the directory once you call done(),
    so every file must be complete and on disk by then."""
    os.makedirs(directory, exist_ok=True)
    files = split_state(state)
    if save_bytes > 0:
        files[PAYLOAD_FILE] = save_bytes
    for name, obj in files.items():
        tmp = os.path.join(directory, name + ".tmp")
        with open(tmp, "wb") as f:
            if name == PAYLOAD_FILE:
                write_payload(f, obj)
            else:
                torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, name))
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint_background(req: "spotagent.CheckpointRequest", state: Dict[str, Any], save_bytes: int = 0) -> None:
    """The non-blocking save: each file's tensors are copied to CPU memory
    now; the files are written in parallel in the background, each reported
    to the agent (which uploads it at once) when it is fsynced. req.done()
    then returns at once and reaches the agent after the last file."""
    for name, obj in split_state(state).items():
        spotagent.torch.save(req, obj, name)
    if save_bytes > 0:
        req.write_async(PAYLOAD_FILE, lambda f: write_payload(f, save_bytes))


def load_checkpoint(directory: str) -> Dict[str, Any]:
    # The file is our own; on torch >= 2.6 pass weights_only=False because it
    # holds Python objects (the `random` state) besides tensors.
    ck = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu")
    if "model" not in ck:
        ck["model"] = torch.load(os.path.join(directory, MODEL_FILE), map_location="cpu")
        ck["optimizer"] = torch.load(os.path.join(directory, OPTIM_FILE), map_location="cpu")
    return ck


def params_digest(model: nn.Module) -> Dict[str, Any]:
    """sha256 over every parameter's raw bytes: equal digests = identical weights."""
    total = hashlib.sha256()
    per = {}
    for name, t in model.state_dict().items():
        data = t.detach().cpu().contiguous().numpy().tobytes()
        per[name] = hashlib.sha256(data).hexdigest()
        total.update(name.encode() + b"\0" + data)
    return {"sha256": total.hexdigest(), "params": per}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="total training steps (default 300)")
    ap.add_argument("--step-time", type=float, default=0.05, help="seconds to sleep per step (default 0.05)")
    ap.add_argument("--out", help="write final parameter digests here as JSON, and the weights to OUT.pt")
    ap.add_argument("--save-bytes", type=int, default=0, help="extra payload bytes in each checkpoint (benchmarks)")
    ap.add_argument("--blocking-save", action="store_true",
                    help="save with a plain blocking torch.save (no second copy of the state in CPU RAM)")
    args = ap.parse_args(argv)
    stop_at = int(os.environ.get("SPOTAGENT_EXAMPLE_STOP_AT") or 0)

    # Determinism: same seed, same single-threaded kernels, every run.
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    random.seed(SEED)

    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, args.steps))
    # The DataLoader shuffles with its own generator, so its state can be saved.
    loader_gen = torch.Generator().manual_seed(SEED + 1)
    loader = DataLoader(make_dataset(), batch_size=BATCH, shuffle=True, drop_last=True, generator=loader_gen)
    loss_fn = nn.CrossEntropyLoss()

    step, epoch, batch = 0, 0, 0  # batch = batches of `epoch` already trained on
    epoch_loader_state = loader_gen.get_state()  # the loader generator at the start of `epoch`
    loss = torch.tensor(float("nan"))

    # spotagent: connect (a no-op when not run under spotagent) and resume.
    agent = spotagent.connect()
    if agent.resume_dir:
        ck = load_checkpoint(agent.resume_dir)
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        scheduler.load_state_dict(ck["scheduler"])
        torch.set_rng_state(ck["torch_rng"])
        random.setstate(ck["python_rng"])
        # np.random.set_state(ck["numpy_rng"])  # if you use numpy's global RNG
        epoch_loader_state = ck["loader_epoch_start"]
        step, epoch, batch = ck["step"], ck["epoch"], ck["batch"]
        loss = ck["loss"]
        print("resuming from step %d (epoch %d, batch %d) from %s" % (step, epoch, batch, agent.resume_dir), flush=True)
    else:
        print("starting fresh", flush=True)

    def checkpoint_state() -> Dict[str, Any]:
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            # "numpy_rng": np.random.get_state(),
            # Data position: replaying the epoch from its start state reproduces
            # the same shuffle; the first `batch` batches are then skipped.
            "loader_epoch_start": epoch_loader_state,
            "step": step,
            "epoch": epoch,
            "batch": batch,
            "loss": loss,
        }

    def metadata() -> Dict[str, Any]:
        # Small JSON kept in the manifest; handed back as agent.resume_metadata.
        return {"epoch": epoch, "batch": batch, "loss": float(loss)}

    model.train()
    try:
        while step < args.steps:
            # Start (or re-enter) an epoch: restoring the generator first makes
            # iter(loader) draw the same permutation as the first time round.
            loader_gen.set_state(epoch_loader_state)
            batches = itertools.islice(iter(loader), batch, None)
            for x, y in batches:
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                scheduler.step()
                loss = loss.detach()
                step += 1
                batch += 1
                if args.step_time > 0:
                    time.sleep(args.step_time)
                if step % 25 == 0:
                    print("step %d  epoch %d  loss %.4f" % (step, epoch, loss.item()), flush=True)

                # spotagent: the only per-step call. Never blocks.
                req = agent.poll(step)
                if req:
                    t0 = time.monotonic()
                    if args.blocking_save:
                        save_checkpoint(req.dir, checkpoint_state(), args.save_bytes)
                    else:
                        save_checkpoint_background(req, checkpoint_state(), args.save_bytes)
                    req.done(step, metadata=metadata())  # report steps *completed*
                    print("checkpoint %s (%s) at step %d: training blocked %.2fs" % (
                        req.id, req.reason, step, time.monotonic() - t0), flush=True)

                if stop_at and step == stop_at:  # test hook: simulate an interruption
                    d = os.path.join(agent.checkpoint_dir or ".", "example-stop-%d" % step)
                    save_checkpoint(d, checkpoint_state(), args.save_bytes)
                    agent.checkpoint_done(step, d, metadata=metadata())  # an unsolicited checkpoint
                    print("SPOTAGENT_EXAMPLE_STOP_AT: saved %s, exiting" % d, flush=True)
                    return 0

                # spotagent: after an interruption checkpoint the agent says stop.
                if agent.should_stop:
                    print("stopping at step %d: %s" % (step, agent.stop_reason or "agent asked"), flush=True)
                    return agent.exit_code  # 75: interrupted, run me again (resumes)
                if step >= args.steps:
                    break
            else:
                # The epoch ran out: move on to the next one.
                epoch, batch = epoch + 1, 0
                epoch_loader_state = loader_gen.get_state()
    finally:
        agent.close()  # waits for a background save still writing

    print("finished %d steps, loss %.4f" % (step, loss.item()), flush=True)
    if args.out:
        torch.save(model.state_dict(), args.out + ".pt")
        doc = dict(params_digest(model), step=step, loss=float(loss).hex())
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
