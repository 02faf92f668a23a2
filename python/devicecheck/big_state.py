#!/usr/bin/env python3
"""Device check, case 1: a model whose training state is several GiB, on the
GPU when there is one, saved with the client's non-blocking save
(``spotagent.torch.save``: staged into reused pinned CPU buffers, written
and uploaded in the background).

Deterministic: the weights start from a fixed seed, every step's input is
drawn from a generator seeded by the step, deterministic algorithms only.
So an interrupted and resumed run ends with the same parameters, bit for
bit, as an uninterrupted one (``sha256`` in the --out JSON).

    python3 big_state.py --steps 60 --gib 4 --out result.json

Prints ``step N`` after every step and ``committed STEP`` when a commit
comes back (the check sends its notice after the first). The --out JSON
holds: sha256, step, blocked_s (per checkpoint: the time training was
blocked, staging), stop_at (time.time() when the stop reached the
trainer), restore_wait_s, state_bytes, device, exit_code.
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
from torch import nn  # noqa: E402

import spotagent  # noqa: E402
import spotagent.torch  # noqa: E402


def build(device: str, gib: float) -> "tuple[nn.Module, int]":
    hidden = 4096 if device == "cuda" else 512
    per_layer = hidden * hidden * 4 * 3  # weights + Adam's two moments, fp32
    layers = max(2, int(gib * (1 << 30) // per_layer))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(hidden, hidden, bias=False) for _ in range(layers)]).to(device)
    return model, hidden


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gib", type=float, default=4.0, help="training state, GiB (weights + Adam)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds slept per step (pacing)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    model, hidden = build(args.device, args.gib)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3

    agent = spotagent.connect()
    t0 = time.monotonic()
    step = 0
    if agent.resume_dir:
        d = agent.resume_dir
        model.load_state_dict(torch.load(os.path.join(d, "model.pt"), map_location=args.device))
        opt.load_state_dict(torch.load(os.path.join(d, "optim.pt"), map_location=args.device))
        step = int(agent.resume_step or 0)
        print("resumed from step %d (%s)" % (step, d), flush=True)
    restore_wait = time.monotonic() - t0

    blocked = []  # seconds per checkpoint
    stop_at = None
    seen_commit = None
    try:
        while step < args.steps:
            g = torch.Generator(device=args.device).manual_seed(1000 + step)
            x = torch.randn(64, hidden, device=args.device, generator=g)
            opt.zero_grad(set_to_none=True)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            step += 1
            if args.step_time > 0:
                time.sleep(args.step_time)
            print("step %d" % step, flush=True)
            req = agent.poll(step)
            if req:
                spotagent.torch.save(req, model.state_dict(), "model.pt")
                spotagent.torch.save(req, opt.state_dict(), "optim.pt")
                req.done(step)
                blocked.append(round(req.blocked, 3))
                print("checkpoint %s (%s) at step %d: blocked %.3fs" % (req.id, req.reason, step, req.blocked),
                      flush=True)
            c = agent.last_committed
            if c is not None and c.id != seen_commit:
                seen_commit = c.id
                print("committed %s" % c.step, flush=True)
            if agent.should_stop:
                stop_at = time.time()
                print("stopping at step %d: %s" % (step, agent.stop_reason), flush=True)
                break
    finally:
        agent.close(timeout=120.0)
    if args.device == "cuda":
        torch.cuda.synchronize()
    out = {"sha256": digest(model), "step": step, "blocked_s": blocked, "stop_at": stop_at,
           "restore_wait_s": round(restore_wait, 3), "state_bytes": state_bytes, "device": args.device,
           "exit_code": agent.exit_code, "torch": torch.__version__}
    with open(args.out, "w") as f:
        json.dump(out, f)
    return agent.exit_code


if __name__ == "__main__":
    sys.exit(main())
