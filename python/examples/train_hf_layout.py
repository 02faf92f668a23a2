#!/usr/bin/env python3
"""A plain PyTorch loop that saves checkpoints the way Hugging Face's Trainer does.

No spotagent import: this is what `spotagent run --watch OUTPUT_DIR` protects
without a line changed. Every --save-steps steps it writes

    OUTPUT_DIR/checkpoint-<step>/
        pytorch_model.bin   model weights (torch.save)
        optimizer.pt        optimizer state
        scheduler.pt        LR scheduler state
        rng_state.pth       every RNG, and the data loader's shuffle state
        trainer_state.json  step, epoch, batch: written last (the completion signal)

and on start it resumes from the newest checkpoint-<step> in OUTPUT_DIR, as
`Trainer.train(resume_from_checkpoint=True)` does. The resumed run's final
weights are bit-identical to an uninterrupted run's.

    python3 train_hf_layout.py --output-dir out --steps 200 --save-steps 40
    spotagent run --store s3://bucket/runs/exp1 --watch out -- python3 train_hf_layout.py --output-dir out

--save-on-signal: on SIGTERM, save a checkpoint at the current step and exit 0
(use with spotagent run --notice-signal SIGTERM). Test-only:
--die-while-saving-at STEP kills the process (SIGKILL) half-way through that
step's checkpoint, leaving a torn directory.
"""

import argparse
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEED = 0
SAMPLES, FEATURES, HIDDEN, CLASSES = 1024, 16, 32, 4
BATCH = 32
LR = 1e-2
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")  # as transformers' get_last_checkpoint


def make_dataset():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    y = (x @ teacher + 0.3 * torch.randn(SAMPLES, CLASSES, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def make_model():
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Dropout(p=0.1), nn.Linear(HIDDEN, CLASSES))


def last_checkpoint(output_dir):
    """The newest checkpoint-<step> directory, like get_last_checkpoint."""
    if not os.path.isdir(output_dir):
        return None
    found = [(int(m.group(1)), n) for n in os.listdir(output_dir)
             for m in [CHECKPOINT_RE.match(n)] if m and os.path.isdir(os.path.join(output_dir, n))]
    return os.path.join(output_dir, max(found)[1]) if found else None


def params_digest(model):
    total = hashlib.sha256()
    per = {}
    for name, t in model.state_dict().items():
        data = t.detach().cpu().contiguous().numpy().tobytes()
        per[name] = hashlib.sha256(data).hexdigest()
        total.update(name.encode() + b"\0" + data)
    return {"sha256": total.hexdigest(), "params": per}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-steps", type=int, default=40)
    ap.add_argument("--step-time", type=float, default=0.05)
    ap.add_argument("--out", help="write the final parameter digests here as JSON")
    ap.add_argument("--save-on-signal", action="store_true", help="on SIGTERM save at the current step and exit 0")
    ap.add_argument("--save-total-limit", type=int, default=0,
                    help="after each save delete the oldest checkpoints beyond this many, as TrainingArguments(save_total_limit=N)")
    ap.add_argument("--die-while-saving-at", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    random.seed(SEED)

    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, args.steps))
    loader_gen = torch.Generator().manual_seed(SEED + 1)
    loader = DataLoader(make_dataset(), batch_size=BATCH, shuffle=True, drop_last=True, generator=loader_gen)
    loss_fn = nn.CrossEntropyLoss()
    step, epoch, batch = 0, 0, 0
    epoch_loader_state = loader_gen.get_state()

    ckpt = last_checkpoint(args.output_dir)
    if ckpt:
        model.load_state_dict(torch.load(os.path.join(ckpt, "pytorch_model.bin")))
        optimizer.load_state_dict(torch.load(os.path.join(ckpt, "optimizer.pt")))
        scheduler.load_state_dict(torch.load(os.path.join(ckpt, "scheduler.pt")))
        rng = torch.load(os.path.join(ckpt, "rng_state.pth"))
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        epoch_loader_state = rng["loader_epoch_start"]
        with open(os.path.join(ckpt, "trainer_state.json")) as f:
            state = json.load(f)
        step, epoch, batch = state["global_step"], state["epoch"], state["batch_in_epoch"]
        print("resuming from step %d (epoch %d, batch %d) from %s" % (step, epoch, batch, ckpt), flush=True)
    else:
        print("starting fresh", flush=True)

    def save(at):
        d = os.path.join(args.output_dir, "checkpoint-%d" % at)
        os.makedirs(d, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(d, "pytorch_model.bin"))
        torch.save(optimizer.state_dict(), os.path.join(d, "optimizer.pt"))
        if args.die_while_saving_at and at == args.die_while_saving_at:
            print("dying while saving %s" % d, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save(scheduler.state_dict(), os.path.join(d, "scheduler.pt"))
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                    "loader_epoch_start": epoch_loader_state}, os.path.join(d, "rng_state.pth"))
        with open(os.path.join(d, "trainer_state.json"), "w") as f:  # last, as the Trainer does
            json.dump({"global_step": at, "epoch": epoch, "batch_in_epoch": batch}, f)
        if args.save_total_limit > 0:  # the Trainer's _rotate_checkpoints: right after the save
            found = sorted((int(m.group(1)), n) for n in os.listdir(args.output_dir)
                           for m in [CHECKPOINT_RE.match(n)] if m)
            for _, n in found[:-args.save_total_limit]:
                shutil.rmtree(os.path.join(args.output_dir, n), ignore_errors=True)
        return d

    signalled = []
    if args.save_on_signal:
        signal.signal(signal.SIGTERM, lambda *_: signalled.append(True))

    model.train()
    while step < args.steps:
        loader_gen.set_state(epoch_loader_state)
        for x, y in itertools.islice(iter(loader), batch, None):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            batch += 1
            if args.step_time > 0:
                time.sleep(args.step_time)
            if step % 10 == 0:
                print("step %d  loss %.4f" % (step, loss.item()), flush=True)
            if step % args.save_steps == 0:
                print("saved %s" % save(step), flush=True)
            elif signalled:
                print("saved %s on SIGTERM" % save(step), flush=True)
            if signalled:
                print("exiting at step %d on SIGTERM" % step, flush=True)
                return 0
            if step >= args.steps:
                break
        else:
            epoch, batch = epoch + 1, 0
            epoch_loader_state = loader_gen.get_state()

    print("finished %d steps" % step, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(params_digest(model), step=step), f, indent=1, sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
