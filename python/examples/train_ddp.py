#!/usr/bin/env python3
"""A small DistributedDataParallel job under spotagent, resumed exactly.

Every rank connects to its node's agent; the ranks agree on each checkpoint
inside agent.poll() (one small gloo all_reduce, see python/README.md
"Distributed jobs"), so every rank saves the SAME step into its own file
`rank-<global rank>.pt` in req.dir, and every rank stops at the same step.

Start the ranks yourself (or with torchrun, which sets the same variables):

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 GROUP_RANK=0 LOCAL_RANK=0 python3 train_ddp.py &
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=1 GROUP_RANK=1 LOCAL_RANK=0 python3 train_ddp.py

Environment: TOTAL_STEPS (default 200); STEP_SLEEP_MS (each rank sleeps a
random 0..N ms per step, seeded by its rank: ranks at different speeds).
SAVE_BYTES adds a random payload of that size per rank to each checkpoint
(for benchmarks). TRAIN_DDP_BACKEND: the process group's backend (default
gloo; "cpu:gloo,cuda:nccl" on torch 2). FAIL_RANK and FAIL_AT_STEP make that rank raise a
ValueError at that step (a bug of its own, for tests: exit 1, not 75). Prints `rank <r> step <n>` after every step (flushed) and
at the end `rank <r> final sha256=<hex> step=<n>`, the sha256 of the concatenated parameter bytes:
an interrupted and resumed job ends with the same line as an uninterrupted one.
Exits with agent.exit_code (75 after an interruption: run me again).

Deterministic: same seed on every rank (same initial weights), data drawn per
rank from a generator whose state is checkpointed, torch's RNG (dropout)
checkpointed, SGD momentum checkpointed; gloo's all-reduce is deterministic
for a fixed world size.
"""

import datetime
import hashlib
import os
import random
import sys
import time
from typing import Any, Dict, Optional

try:
    import spotagent
except ImportError:  # running from a source checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import spotagent

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

SEED = 1234
IN, HIDDEN, BATCH, LR = 8, 16, 32, 0.05


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Dropout(0.1), nn.Linear(HIDDEN, 1))


def rank_file(rank: int) -> str:
    # Named by GLOBAL rank: every rank of a node writes into the same
    # req.dir, and a resumed job may place the ranks on other nodes.
    return "rank-%d.pt" % rank


def find_rank_file(root: str, rank: int) -> Optional[str]:
    """rank-<r>.pt in the restored directory (or below it: a `--restore all`
    keeps every node's part in its own subdirectory)."""
    name = rank_file(rank)
    if os.path.isfile(os.path.join(root, name)):
        return os.path.join(root, name)
    for d, _, files in sorted(os.walk(root)):
        if name in files:
            return os.path.join(d, name)
    return None


def save_atomic(obj: Any, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    total = int(os.environ.get("TOTAL_STEPS") or 200)
    sleep_ms = float(os.environ.get("STEP_SLEEP_MS") or 0)
    save_bytes = int(os.environ.get("SAVE_BYTES") or 0)
    payload = os.urandom(save_bytes) if save_bytes > 0 else None
    fail_rank = int(os.environ.get("FAIL_RANK") or -1)
    fail_at = int(os.environ.get("FAIL_AT_STEP") or -1)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    # TRAIN_DDP_BACKEND: e.g. torch 2's "cpu:gloo,cuda:nccl" (the model stays
    # on the CPU: no CUDA collective; the client's agreement then runs on a
    # gloo group of its own, as on an NCCL job).
    backend = os.environ.get("TRAIN_DDP_BACKEND") or "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(SEED)  # the same initial weights on every rank
    model = make_model()
    ddp = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    data = torch.Generator().manual_seed(SEED + 1 + rank)  # this rank's shard of the data
    torch.manual_seed(SEED + 100 + rank)  # dropout masks differ per rank
    w_true = torch.linspace(-1.0, 1.0, IN).unsqueeze(1)
    jitter = random.Random(rank)  # sleeps only; not part of the result
    step = 0

    # spotagent: connect (a no-op without an agent); the agreement between
    # the ranks switches itself on (the process group is initialised).
    agent = spotagent.connect()
    if agent.resume_dir:
        path = find_rank_file(agent.resume_dir, rank)
        if path is None:
            print("rank %d: no %s in %s" % (rank, rank_file(rank), agent.resume_dir), file=sys.stderr, flush=True)
            return 1
        ck = torch.load(path)
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["torch_rng"])
        data.set_state(ck["data_rng"])
        step = ck["step"]
        print("rank %d resuming from step %d" % (rank, step), flush=True)
    else:
        print("rank %d starting fresh" % rank, flush=True)

    def state() -> Dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "torch_rng": torch.get_rng_state(), "data_rng": data.get_state(),
                "step": step, "rank": rank, "world_size": world}

    # DDP lays its gradient buckets out again after the first backward
    # pass (in the order the gradients became ready). With more than two
    # ranks the order of gloo's sums depends on that layout, so a resumed
    # job whose first step ran on the initial layout would drift from an
    # uninterrupted one by a rounding error. One warm-up pass (no optimizer
    # step, RNG state put back) makes every real step use the same layout.
    rng = torch.get_rng_state()
    ddp(torch.zeros(BATCH, IN)).sum().backward()
    optimizer.zero_grad()
    torch.set_rng_state(rng)

    loss_fn = nn.MSELoss()
    try:
        while step < total:
            x = torch.randn(BATCH, IN, generator=data)
            y = x @ w_true + 0.01 * torch.randn(BATCH, 1, generator=data)
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()  # DDP's all-reduce of the gradients
            optimizer.step()
            step += 1
            if rank == fail_rank and step == fail_at:
                raise ValueError("train_ddp: FAIL_AT_STEP=%d on rank %d" % (step, rank))
            if sleep_ms > 0:
                time.sleep(jitter.uniform(0, sleep_ms) / 1000.0)
            print("rank %d step %d" % (rank, step), flush=True)

            # spotagent: every rank polls once per step; a request comes back
            # on every rank at the same step.
            req = agent.poll(step)
            if req:
                save_atomic(state(), os.path.join(req.dir, rank_file(rank)))
                if payload is not None:  # SAVE_BYTES: a checkpoint of a realistic size
                    with open(os.path.join(req.dir, "payload-%d.bin" % rank), "wb") as f:
                        f.write(payload)
                        f.flush()
                        os.fsync(f.fileno())
                req.done(step, metadata={"rank": rank, "world_size": world})
                print("rank %d checkpoint %s (%s) at step %d" % (rank, req.id, req.reason, step), flush=True)
            # spotagent: agreed too: true on every rank at the same step.
            if agent.should_stop:
                print("rank %d stopping at step %d: %s" % (rank, step, agent.stop_reason), flush=True)
                break
    finally:
        agent.close()
    print("rank %d final sha256=%s step=%d" % (rank, params_sha256(model), step), flush=True)
    code = agent.exit_code
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
