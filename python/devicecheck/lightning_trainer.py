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
"""

import argparse
import glob
import hashlib
import json
import os
import re
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
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    L.seed_everything(0)
    model = Model()
    cb = ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every, save_last=True)
    cb.CHECKPOINT_NAME_LAST = "last-{step}"
    trainer = L.Trainer(max_steps=args.steps, callbacks=[cb, Pace(args.step_time)], logger=False,
                        enable_progress_bar=False, enable_model_summary=False, deterministic=True,
                        devices=1, num_sanity_val_steps=0)
    resume = newest_last(args.ckpt_dir)
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
