#!/usr/bin/env python3
"""spotbench's trainer for the "Restore from a peer" section (issue 38),
one rank of a data-parallel job under the real torchrun
(python/examples/torchrun.py), each node's torchrun under its own
`spotagent run --node-rank K`.

Every rank holds a replicated tensor (the same bytes on every rank, as the
weights of a data-parallel job are) of PEER_REPLICA_BYTES and a tensor of
its own (optimizer state, a shard) of PEER_SHARD_BYTES, beside a small
DistributedDataParallel model that takes the steps (gloo, CPU).

Fresh start (the seeding job): the ranks train until the agent asks for a
checkpoint (every rank polls once per step; the client's agreement makes
the request come back on every rank at the same step), save
`replica-<rank>.pt` (the replicated tensor: the same bytes on every rank)
and `shard-<rank>.pt` (the rank's own tensor and its model, optimizer and
step) with torch.save, answer done, wait for the commit, print
`bench: saved step <n> rank <r>` and idle until killed.

Resumed: torch.load both files of this rank from agent.resume_dir (which
blocks while the agent restores), check them, take one training step (its
DDP all_reduce waits for every rank of the job) and print

    bench: first_step <t_step> rank <r> resumed <n> started <t0> imported <t1> pg <t2> restored <t3> loaded <t4>

(Unix times: this process's start, torch imported, process group
initialised, resume_dir returned, both files loaded, first step taken),
then idle until killed: spotbench takes the machines away with SIGKILL.

Standard library and torch only.
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

SEED = 38
IN, BATCH, LR = 8, 32, 0.05


def find(root: str, name: str) -> str:
    """name in the restored directory, or below it."""
    for d, _, files in sorted(os.walk(root)):
        if name in files:
            return os.path.join(d, name)
    raise FileNotFoundError("%s not in %s" % (name, root))


def save(obj: object, path: str) -> None:
    # Through a file object: the archive's inner name is then the same
    # whatever the file's name, so equal tensors give equal bytes.
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def sample(t: torch.Tensor) -> float:
    return float(t[:: max(1, t.numel() // 4096)].double().sum())


def say(line: str) -> None:
    # One write(2) per line: the ranks of a node share torchrun's stdout,
    # and print() writes the text and its newline apart.
    os.write(1, (line + "\n").encode())


def idle() -> None:
    while True:  # until spotbench takes the machine away (SIGKILL)
        time.sleep(1)


def main() -> int:
    t_import = time.time()
    replica_n = int(os.environ["PEER_REPLICA_BYTES"]) // 4
    shard_n = int(os.environ["PEER_SHARD_BYTES"]) // 4
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    t_pg = time.time()
    rank = dist.get_rank()
    say("bench: rank %d pid %d" % (rank, os.getpid()))

    torch.manual_seed(SEED)
    model = nn.Linear(IN, 1)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    data = torch.Generator().manual_seed(SEED + 1 + rank)
    w_true = torch.linspace(-1.0, 1.0, IN).unsqueeze(1)

    def train_step() -> None:
        x = torch.randn(BATCH, IN, generator=data)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), x @ w_true).backward()  # DDP's all_reduce
        optimizer.step()

    agent = spotagent.connect()
    resume = agent.resume_dir  # blocks while the agent restores
    t_restored = time.time()
    if resume:
        rep = torch.load(find(resume, "replica-%d.pt" % rank))
        own = torch.load(find(resume, "shard-%d.pt" % rank))
        t_loaded = time.time()
        if rep["weights"].numel() != replica_n or own["shard"].numel() != shard_n:
            raise ValueError("rank %d: restored tensors of %d and %d elements, want %d and %d"
                             % (rank, rep["weights"].numel(), own["shard"].numel(), replica_n, shard_n))
        if sample(rep["weights"]) != rep["sample"] or rep["step"] != own["step"]:
            raise ValueError("rank %d: restored files disagree with what was saved" % rank)
        model.load_state_dict(own["model"])
        optimizer.load_state_dict(own["optimizer"])
        data.set_state(own["data_rng"])
        step = own["step"]
        train_step()
        say("bench: first_step %.6f rank %d resumed %d started %.6f imported %.6f pg %.6f restored %.6f loaded %.6f"
            % (time.time(), rank, step, T0, t_import, t_pg, t_restored, t_loaded))
        idle()

    weights = torch.rand(replica_n, generator=torch.Generator().manual_seed(SEED))
    shard = torch.rand(shard_n, generator=torch.Generator().manual_seed(SEED + 100 + rank))
    step = 0
    while True:
        train_step()
        step += 1
        req = agent.poll(step)
        if req:
            save({"step": step, "weights": weights, "sample": sample(weights)},
                 os.path.join(req.dir, "replica-%d.pt" % rank))
            save({"step": step, "rank": rank, "shard": shard, "model": model.state_dict(),
                  "optimizer": optimizer.state_dict(), "data_rng": data.get_state()},
                 os.path.join(req.dir, "shard-%d.pt" % rank))
            req.done(step)
            if agent.wait_committed(req.id, timeout=600) is None:
                raise RuntimeError("rank %d: checkpoint %s not committed" % (rank, req.id))
            say("bench: saved step %d rank %d" % (step, rank))
            idle()
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
