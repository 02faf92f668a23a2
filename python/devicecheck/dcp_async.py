#!/usr/bin/env python3
"""Device check, case 5: torch.distributed.checkpoint (DCP) writing into the
agent's request directory under ``spotagent run``, with ``async_save``:
training goes on while DCP writes; once its future is done every file is
complete, so the trainer tells the agent (``req.saved``) and then ``done``.
On resume, ``dcp.load`` reads the restored directory.

A process group of one rank (``cpu:gloo,cuda:nccl`` on a GPU: async_save
runs its collectives on the CPU backend). Deterministic: the resumed run's
final weights equal an uninterrupted run's (``sha256`` in the --out JSON).

    python3 dcp_async.py --steps 80 --out result.json
"""

import argparse
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

import spotagent  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--step-time", type=float, default=0.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29700 + os.getpid() % 200))
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", rank=0, world_size=1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.Tanh(), nn.Linear(512, 256)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    agent = spotagent.connect()
    step = 0
    if agent.resume_dir:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=agent.resume_dir)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = int(agent.resume_step or 0)
        print("resumed from step %d" % step, flush=True)

    pending = None  # (request, future, step)
    blocked = []
    async_saves = 0
    try:
        while step < args.steps:
            g = torch.Generator(device=dev).manual_seed(1000 + step)
            x = torch.randn(32, 256, device=dev, generator=g)
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), x.flip(1)).backward()
            opt.step()
            step += 1
            if args.step_time > 0:
                time.sleep(args.step_time)
            print("step %d" % step, flush=True)
            if pending is not None and pending[1].done():
                req, fut, at = pending
                fut.result()  # raises what the background write raised
                for name in sorted(os.listdir(req.dir)):
                    req.saved(name)
                req.done(at)
                pending = None
            req = agent.poll(step)
            if req:
                if pending is not None:  # one async save at a time
                    pending[1].result()
                    for name in sorted(os.listdir(pending[0].dir)):
                        pending[0].saved(name)
                    pending[0].done(pending[2])
                    pending = None
                msd, osd = get_state_dict(model, opt)
                t0 = time.monotonic()
                resp = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=req.dir)
                blocked.append(round(time.monotonic() - t0, 4))
                async_saves += 1
                fut = getattr(resp, "upload_completion", resp)  # AsyncSaveResponse or a Future
                pending = (req, fut, step)
                print("checkpoint %s (%s) at step %d" % (req.id, req.reason, step), flush=True)
            if agent.should_stop and pending is None:
                print("stopping at step %d: %s" % (step, agent.stop_reason), flush=True)
                break
        if pending is not None:
            pending[1].result()
            for name in sorted(os.listdir(pending[0].dir)):
                pending[0].saved(name)
            pending[0].done(pending[2])
            if not agent.should_stop:
                agent.wait_committed(pending[0].id, timeout=30)
    finally:
        agent.close(timeout=30.0)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    with open(args.out, "w") as f:
        json.dump({"sha256": h.hexdigest(), "step": step, "blocked_s": blocked, "async_saves": async_saves,
                   "exit_code": agent.exit_code, "torch": torch.__version__}, f)
    dist.destroy_process_group()
    return agent.exit_code


if __name__ == "__main__":
    sys.exit(main())
