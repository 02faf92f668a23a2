#!/usr/bin/env python3
"""Device check, case 7: spotagent.lightning.SpotagentCallback in a real
Lightning Trainer (the GPU machine has Lightning; this one cannot install
it). A small regression model on the GPU when there is one; the callback
answers the agent's requests with trainer.save_checkpoint into the request
directory, stops on the agent's stop and exits with its code (75); a
restart resumes from the agent's restore through ckpt_path.

Prints `step <n>` per step, `resuming from <path>` or `starting fresh`,
and at the end writes --out (JSON: sha256 of the weights, steps).
"""

import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import spotagent  # noqa: E402
import spotagent.lightning  # noqa: E402

try:
    import lightning as L
except ImportError:  # pragma: no cover
    import pytorch_lightning as L  # type: ignore


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Pace(L.Callback):
    def __init__(self, sleep: float) -> None:
        self.sleep = sleep

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        print("step %d" % trainer.global_step, flush=True)
        if self.sleep:
            time.sleep(self.sleep)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--step-time", type=float, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    L.seed_everything(0, workers=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4096, 16, generator=g)
    y = x.sum(dim=1, keepdim=True)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True,
                                       generator=torch.Generator().manual_seed(2))
    agent = spotagent.connect()
    ckpt = spotagent.lightning.resume_path(agent)
    print("resuming from %s" % ckpt if ckpt else "starting fresh", flush=True)
    cb = spotagent.lightning.SpotagentCallback(agent)
    trainer = L.Trainer(max_steps=a.steps, callbacks=[cb, Pace(a.step_time)], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, deterministic=True,
                        accelerator="auto", devices=1)
    model = Model()
    trainer.fit(model, data, ckpt_path=ckpt)
    agent.close()
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    with open(a.out, "w") as f:
        json.dump({"sha256": h.hexdigest(), "steps": trainer.global_step, "resumed_from": ckpt,
                   "saved": cb.saved}, f)
    return agent.exit_code


if __name__ == "__main__":
    sys.exit(main())
