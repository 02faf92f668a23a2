#!/usr/bin/env python3
"""Device check, case 4: Lightning under ``spotagent run --watch CKPT
--watch-pattern 'last-*.ckpt'``, wired as docs/watch.md says:
``ModelCheckpoint(dirpath=CKPT, every_n_train_steps=N, save_last=True)``
with ``CHECKPOINT_NAME_LAST = "last-{step}"``; on start it resumes from the
newest ``last-*.ckpt`` in CKPT (``trainer.fit(ckpt_path=...)``).

Each step's batch is drawn from a generator seeded by the global step, so
the data does not depend on where Lightning resumes its data loader in the
epoch: the weights, the optimizer and the step are the whole state, and a
resumed run's final weights equal an uninterrupted run's (``sha256``).

    python3 lightning_trainer.py --ckpt-dir ckpt --steps 120 --every 10 --out result.json

--signal-mode: for ``spotagent run --signal SIGUSR1 --restore-serial``, the
signal fallback wired into Lightning as a callback (the pattern of
python/examples/train_signal.py): the signal sets a flag; at the next batch
end the callback saves ``model.ckpt`` into the request's directory
(``$SPOTAGENT_REQUEST_FILE``) with ``trainer.save_checkpoint`` and then
writes the ``SPOTAGENT_DONE`` marker. On start it resumes from
``$SPOTAGENT_RESUME_DIR/model.ckpt``. The agent's SIGTERM after the commit is
Lightning's own to handle.
"""

import argparse
import glob
import hashlib
import json
import os
import re
import signal
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        g = torch.Generator().manual_seed(1000 + int(self.global_step))
        x = torch.randn(16, 32, generator=g).to(self.device)
        y = x[:, :1] * 0.5
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Pace(Callback):
    def __init__(self, step_time: float) -> None:
        self.step_time = step_time

    def on_train_batch_end(self, trainer, *a, **kw):  # type: ignore[no-untyped-def]
        if self.step_time > 0:
            time.sleep(self.step_time)
        print("step %d" % trainer.global_step, flush=True)


class SignalFallback(Callback):
    """spotagent's --signal protocol (see the module doc)."""

    def __init__(self) -> None:
        self.asked = False
        name = os.environ.get("SPOTAGENT_SIGNAL") or "SIGUSR1"
        signal.signal(getattr(signal, name), self._on_signal)

    def _on_signal(self, signum, frame):  # type: ignore[no-untyped-def]
        self.asked = True

    def on_train_batch_end(self, trainer, *a, **kw):  # type: ignore[no-untyped-def]
        if not self.asked:
            return
        self.asked = False
        try:
            with open(os.environ["SPOTAGENT_REQUEST_FILE"]) as f:
                req = json.load(f)
        except (KeyError, OSError, ValueError) as e:  # the request ended before we got to it
            print("no checkpoint request to answer: %s" % e, flush=True)
            return
        trainer.save_checkpoint(os.path.join(req["dir"], "model.ckpt"))
        marker = os.path.join(req["dir"], os.environ.get("SPOTAGENT_DONE_MARKER", "SPOTAGENT_DONE"))
        with open(marker + ".tmp", "w") as f:
            f.write(str(trainer.global_step))
            f.flush()
            os.fsync(f.fileno())
        os.rename(marker + ".tmp", marker)
        print("checkpoint saved at step %d (%s)" % (trainer.global_step, req.get("reason")), flush=True)


def newest_last(d: str) -> "str | None":
    best, path = -1, None
    for p in glob.glob(os.path.join(d, "last-*.ckpt")):
        m = re.findall(r"\d+", os.path.basename(p))
        if m and int(m[-1]) > best:
            best, path = int(m[-1]), p
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--step-time", type=float, default=0.0)
    ap.add_argument("--signal-mode", action="store_true", help="spotagent's --signal protocol, no ModelCheckpoint")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    L.seed_everything(0)
    model = Model()
    callbacks = [Pace(args.step_time)]  # type: list
    if args.signal_mode:
        callbacks.append(SignalFallback())
        rd = os.environ.get("SPOTAGENT_RESUME_DIR")
        resume = os.path.join(rd, "model.ckpt") if rd else None
    else:
        cb = ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every, save_last=True)
        cb.CHECKPOINT_NAME_LAST = "last-{step}"
        callbacks.append(cb)
        resume = newest_last(args.ckpt_dir)
    trainer = L.Trainer(max_steps=args.steps, callbacks=callbacks, logger=False, enable_checkpointing=not args.signal_mode,
                        enable_progress_bar=False, enable_model_summary=False, deterministic=True,
                        devices=1, num_sanity_val_steps=0)
    print("resuming from %s" % resume if resume else "starting fresh", flush=True)
    trainer.fit(model, DataLoader(list(range(args.steps * 2)), batch_size=1), ckpt_path=resume)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    with open(args.out, "w") as f:
        json.dump({"sha256": h.hexdigest(), "step": trainer.global_step, "resumed_from": resume}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
