#!/usr/bin/env python3
"""What spotagent's agreement costs per poll() in a torch.distributed job.

Starts 2, 4 and 8 local ranks (subprocesses with MASTER_ADDR/MASTER_PORT, RANK,
WORLD_SIZE; not torchrun) on the gloo backend, connects each to no agent
(the collective runs all the same) and times agent.poll(step) call by call,
with sync_every 1 and 10: the all_reduce(MAX) of two int64 every
sync_every-th call is all the work. Prints a markdown table (median, p99 and
mean microseconds per poll, over every rank's calls) next to a poll without
a process group.

    /usr/bin/python3 bench/collective_cost.py [--ranks 2,4,8] [--sync-every 1,10] [--calls 5000]

Then it fits two models of the agreement's cost to the medians of the
polls that ran the all_reduce: a ring (gloo's allreduce for a small
tensor: 2(N-1) sequential hops, cost = a + h * 2(N-1)) and a tree or
recursive doubling (cost = a + h * log2 N), prints each fit's per-hop
time and residuals, and what each predicts at --predict ranks (1000),
both with the per-hop time fitted here (local processes, loopback,
oversubscribed cores: scheduling included) and with --hop-us (a network
hop between machines, 25 us by default).

Ranks poll back to back here, so a call also absorbs the skew between ranks
that a real step's own collectives (DDP's all-reduce) would otherwise take;
on a machine with fewer cores than ranks the figures include scheduling.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def time_polls(agent, calls: int, warmup: int):
    clock = time.perf_counter_ns
    for i in range(warmup):
        agent.poll(i)
    out = []
    for i in range(calls):
        t0 = clock()
        agent.poll(warmup + i)
        out.append(clock() - t0)
    return out


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import spotagent

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    res = {}
    # The bare collective, for comparison: what poll adds on top of it.
    t = torch.zeros(2, dtype=torch.int64)
    raw = []
    for i in range(args.warmup + args.calls):
        t0 = time.perf_counter_ns()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        raw.append(time.perf_counter_ns() - t0)
    res["raw"] = raw[args.warmup:]
    dist.barrier()
    for every in args.sync_every:
        agent = spotagent.connect(path=None, sync_every=every)  # no agent: the collective still runs
        assert agent._sync.active, "agreement not switched on"
        res[str(every)] = time_polls(agent, args.calls, args.warmup)
        agent.close()
        dist.barrier()
    with open(args.out, "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def run(world: int, args) -> dict:
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="collective-")
    procs, outs = [], []
    for r in range(world):
        out = os.path.join(tmp, "rank%d.json" % r)
        outs.append(out)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTAGENT_")}
        env.update(RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out, "--calls", str(args.calls),
               "--warmup", str(args.warmup), "--sync-every", ",".join(str(e) for e in args.sync_every)]
        procs.append(subprocess.Popen(cmd, env=env))
    for p in procs:
        if p.wait(600) != 0:
            raise SystemExit("a rank failed")
    merged = {}
    for out in outs:
        with open(out) as f:
            for k, v in json.load(f).items():
                merged.setdefault(k, []).extend(v)
        os.unlink(out)
    os.rmdir(tmp)
    return merged


def stats(ns) -> tuple:
    us = sorted(x / 1000.0 for x in ns)
    p99 = us[min(len(us) - 1, int(round(0.99 * (len(us) - 1))))]
    return (statistics.median(us), p99, statistics.fmean(us))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--predict", type=int, default=1000)
    ap.add_argument("--hop-us", type=float, default=25.0)
    ap.add_argument("--sync-every", default="1,10")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sync_every = [int(x) for x in args.sync_every.split(",")]
    if args.worker:
        worker(args)
        return

    import spotagent

    rows, synced_med = [], {}
    base = spotagent.connect(path=None)  # no process group: the single-trainer poll
    b = stats(time_polls(base, args.calls, args.warmup))
    rows.append(("1 (no process group)", "-") + b + (float("nan"),))
    for world in [int(x) for x in args.ranks.split(",")]:
        res = run(world, args)
        rows.append((str(world), "bare all_reduce") + stats(res["raw"]) + (stats(res["raw"])[0],))
        for every in args.sync_every:
            ns = res[str(every)]
            # The calls that ran the all_reduce: poll number warmup+i+1 of each rank.
            synced = [t for i, t in enumerate(ns) if (args.warmup + i % args.calls) % every == 0]
            rows.append((str(world), str(every)) + stats(ns) + (stats(synced)[0],))
            if every == 1:
                synced_med[world] = stats(synced)[0]
    print("poll() cost with the agreement, gloo on 127.0.0.1, %d cores, %d calls per rank, no agent" % (
        os.cpu_count() or 0, args.calls))
    print()
    print("| ranks | sync_every | median µs/poll | p99 µs/poll | mean µs/poll | median µs/all_reduce poll |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(("| %s | %s | %.1f | %.1f | %.1f | %.1f |" % r).replace("nan", "-"))
    if len(synced_med) >= 2:
        fit_models(synced_med, args.predict, args.hop_us)


def fit(xs, ys):
    """Least squares y = a + h x: (a, h)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    h = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - h * mx, h


def fit_models(med: dict, predict: int, hop_us: float) -> None:
    """Fits the ring and the log model to {ranks: median µs of an agreeing poll}."""
    import math
    worlds = sorted(med)
    print()
    print("Models of one agreement (sync_every=1 polls), fitted to the medians above (%s ranks):" % ", ".join(map(str, worlds)))
    print()
    print("| model | hops at N | fixed a µs | per hop h µs | residuals µs | at %d ranks, h fitted here | at %d ranks, h = %g µs (network) |" % (predict, predict, hop_us))
    print("| --- | --- | ---: | ---: | --- | ---: | ---: |")
    for name, hops in (("ring", lambda n: 2.0 * (n - 1)), ("tree / recursive doubling", lambda n: math.log2(n))):
        xs = [hops(n) for n in worlds]
        ys = [med[n] for n in worlds]
        a, h = fit(xs, ys)
        res = ", ".join("%+.0f" % (y - (a + h * x)) for x, y in zip(xs, ys))
        here = a + h * hops(predict)
        net = max(a, 0.0) + hop_us * hops(predict)  # a < 0: a fit's artefact, not a cost
        print("| %s | %s | %.1f | %.1f | %s | %.1f ms | %.1f ms |" % (
            name, "2(N-1)" if name == "ring" else "log2 N", a, h, res, here / 1000.0, net / 1000.0))


if __name__ == "__main__":
    main()
