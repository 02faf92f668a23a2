#!/usr/bin/env python3
"""A torchrun DDP job whose checkpoints are DCP (torch.distributed.checkpoint),
sharded so that at resume each rank reads only its own shards.

The model trains with DistributedDataParallel (every rank holds all of it).
The checkpoint is sharded ZeRO-style: each parameter and momentum buffer is
saved as a DTensor sharded on dim 0 over the job's ranks, so rank r writes
only its slice (``__<r>_0.distcp``) and, at resume, reads only that slice;
the ranks then all-gather the slices back into the full tensors (the
network, not the disk or the object store, carries the rest). With
spotagent each node's agent commits and restores only its own ranks' files
(spotagent.dcp puts a copy of DCP's metadata in every node's part).

    spotagent run --store URI --run-id job --node-rank K -- \\
      torchrun --nnodes 2 --node-rank K --nproc-per-node 2 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-conf use_libuv=0 \\
        python/examples/train_dcp.py

(torch 2.x; `--rdzv-conf use_libuv=0` only on builds without libuv, such as
Debian's: docs/frameworks.md.) Environment: TOTAL_STEPS (default 200),
STEP_SLEEP_MS, TRAIN_DCP_DEVICE (cpu, default; cuda: one GPU per rank,
NCCL for the model, gloo beside it). Prints `rank <r> step <n>` after every step, at resume
`rank <r> restored bytes=<n> files=<names> of=<total bytes>`, and at the end
`rank <r> final sha256=<hex> step=<n>`: an interrupted and resumed job ends
with the same line as an uninterrupted one. Exits with agent.exit_code.
"""

import datetime
import hashlib
import os
import random
import sys
import time
from typing import Any, Dict

try:
    import spotagent
except ImportError:  # running from a source checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import spotagent
import spotagent.dcp

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
except ImportError:  # torch < 2.4
    from torch.distributed._tensor import DTensor, Shard, distribute_tensor  # type: ignore
from torch.distributed.device_mesh import init_device_mesh

SEED = 4321
IN, HIDDEN, BATCH, LR = 8, 64, 32, 0.05


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    total = int(os.environ.get("TOTAL_STEPS") or 200)
    sleep_ms = float(os.environ.get("STEP_SLEEP_MS") or 0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    kind = os.environ.get("TRAIN_DCP_DEVICE") or "cpu"
    backend = "gloo" if kind == "cpu" else "cpu:gloo,cuda:nccl"
    if kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK") or 0))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(kind, (world,))
    device = torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else torch.device("cpu")

    torch.manual_seed(SEED)
    model = make_model().to(device)
    ddp = DDP(model, device_ids=[device.index] if kind == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    names = [n for n, _ in model.named_parameters()]
    jitter = random.Random(rank)
    step = 0

    def sharded() -> Dict[str, Any]:
        """The checkpoint: every parameter and momentum buffer as a DTensor
        sharded on dim 0 (this rank's slice of the replicated tensor)."""
        out = {}  # type: Dict[str, Any]
        for n, p in model.named_parameters():
            out["model." + n] = distribute_tensor(p.detach().clone(), mesh, [Shard(0)])
            buf = optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is None:
                buf = torch.zeros_like(p)
            out["momentum." + n] = distribute_tensor(buf.detach().clone(), mesh, [Shard(0)])
        return out

    agent = spotagent.connect()
    if agent.resume_dir:
        state = sharded()
        stats = spotagent.dcp.load(agent.resume_dir, state)
        total_bytes = sum(os.path.getsize(os.path.join(agent.resume_dir, f))
                          for f in os.listdir(agent.resume_dir) if f.endswith(".distcp"))
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n in names:
                params[n].copy_(state["model." + n].full_tensor())  # all-gather of the slices
                optimizer.state[params[n]]["momentum_buffer"] = state["momentum." + n].full_tensor().clone()
        step = int(agent.resume_step or 0)
        print("rank %d restored bytes=%d files=%s of=%d step=%d" % (
            rank, stats.bytes, ",".join(sorted(stats.files)), total_bytes, step), flush=True)
    else:
        print("rank %d starting fresh" % rank, flush=True)

    # As train_ddp.py: one warm-up pass so that DDP's bucket layout is the
    # same for every real step of a fresh and a resumed run.
    ddp(torch.zeros(BATCH, IN, device=device)).sum().backward()
    optimizer.zero_grad()

    w_true = torch.linspace(-1.0, 1.0, IN).unsqueeze(1).to(device)
    loss_fn = nn.MSELoss()
    try:
        while step < total:
            # This rank's batch of this step: drawn from (seed, step, rank), so
            # no data-loader state needs saving.
            g = torch.Generator().manual_seed(SEED * 1000003 + step * 131 + rank)
            x = torch.randn(BATCH, IN, generator=g).to(device)
            y = x @ w_true + 0.01 * torch.randn(BATCH, 1, generator=g).to(device)
            optimizer.zero_grad()
            loss_fn(ddp(x), y).backward()
            optimizer.step()
            step += 1
            if sleep_ms > 0:
                time.sleep(jitter.uniform(0, sleep_ms) / 1000.0)
            print("rank %d step %d" % (rank, step), flush=True)
            req = agent.poll(step)
            if req:
                h = spotagent.dcp.save(req, sharded(), step, metadata={"world_size": world})
                print("rank %d checkpoint %s (%s) at step %d, blocked %.3f s" % (
                    rank, req.id, req.reason, step, h.blocked), flush=True)
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
