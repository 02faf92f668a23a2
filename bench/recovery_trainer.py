#!/usr/bin/env python3
"""spotbench's trainer for the "Recovery, end to end" section (issue 51
item 3): one rank of a data-parallel job under the real torchrun
(python/examples/torchrun.py), each node's torchrun under its own
`spotagent run --node-rank K`.

It is python/examples/train_ddp.py's loop (DDP, gloo, CPU; every rank polls
its agent once per step, saves `rank-<rank>.pt` and a random payload of
SAVE_BYTES in req.dir when asked, stops when told and exits with
agent.exit_code) with the timestamps the section needs printed as one line
per rank:

    bench: training rank <r> step <n>                        (first step of a fresh start)
    bench: first_step <t_step> rank <r> resumed <n> started <t0> imported <t1> pg <t2> connected <t3> restored <t4> loaded <t5>

(Unix times: this process's start, torch imported, process group
initialised, agent.connect returned, resume_dir returned, the checkpoint
loaded, the first resumed step taken.) Standard library and torch only.
"""

import datetime
import os
import sys
import time

T0 = time.time()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import spotagent  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

SEED = 51
IN, BATCH, LR = 8, 32, 0.05


def say(line: str) -> None:
    # One write(2) per line: the ranks of a node share torchrun's stdout.
    os.write(1, (line + "\n").encode())


def find(root: str, name: str) -> str:
    for d, _, files in sorted(os.walk(root)):
        if name in files:
            return os.path.join(d, name)
    raise FileNotFoundError("%s not in %s" % (name, root))


def save(obj: object, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def main() -> int:
    t_import = time.time()
    save_bytes = int(os.environ.get("SAVE_BYTES") or 0)
    sleep_s = float(os.environ.get("STEP_SLEEP_MS") or 20) / 1000.0
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t_pg = time.time()
    rank = dist.get_rank()

    torch.manual_seed(SEED)
    model = nn.Linear(IN, 1)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    data = torch.Generator().manual_seed(SEED + 1 + rank)
    w_true = torch.linspace(-1.0, 1.0, IN).unsqueeze(1)

    agent = spotagent.connect()
    t_conn = time.time()
    resume = agent.resume_dir  # blocks while the agent restores
    t_restored = time.time()
    step, resumed = 0, False
    if resume:
        ck = torch.load(find(resume, "rank-%d.pt" % rank))
        if save_bytes > 0:
            with open(find(resume, "payload-%d.bin" % rank), "rb") as f:
                n = len(f.read())
            if n != save_bytes:
                raise ValueError("rank %d: payload of %d bytes, want %d" % (rank, n, save_bytes))
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        data.set_state(ck["data_rng"])
        step, resumed = ck["step"], True
    t_loaded = time.time()
    payload = os.urandom(save_bytes) if save_bytes > 0 else None
    first = True
    while True:
        x = torch.randn(BATCH, IN, generator=data)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), x @ w_true).backward()  # DDP's all_reduce
        optimizer.step()
        step += 1
        if first and resumed:
            say("bench: first_step %.6f rank %d resumed %d started %.6f imported %.6f pg %.6f connected %.6f restored %.6f loaded %.6f"
                % (time.time(), rank, step - 1, T0, t_import, t_pg, t_conn, t_restored, t_loaded))
        elif first:
            say("bench: training rank %d step %d" % (rank, step))
        first = False
        req = agent.poll(step)
        if req:
            save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                  "data_rng": data.get_state()}, os.path.join(req.dir, "rank-%d.pt" % rank))
            if payload is not None:
                with open(os.path.join(req.dir, "payload-%d.bin" % rank), "wb") as f:
                    f.write(payload)
                    f.flush()
                    os.fsync(f.fileno())
            req.done(step)
        if agent.should_stop:
            break
        time.sleep(sleep_s)
    agent.close()
    return agent.exit_code


if __name__ == "__main__":
    sys.exit(main())
