"""One rank of a torch.distributed (gloo) job for test_dist.py.

Loop: poll(step), save + done a returned request, then one all_reduce(MAX)
of an "exit" flag standing in for DDP's gradient all-reduce (ranks in lock
step, and a rank that left early makes the others fail, not hang: the
process group has a short timeout). Knobs (env):

  DW_OUT            write the result here as JSON
  DW_CONNECT_FIRST  1: spotagent.connect() before init_process_group
  DW_WAIT           request | stop: before poll DW_WAIT_AT (default 1), wait
                    until this rank's agent sent a checkpoint / stop
  DW_SIGTERM_AT     send SIGTERM to itself after poll at that step
  DW_AFTER          steps to run on after the first request (default 2)
  DW_MAX_SECONDS    give up, counted from the first step (default 60)
  DW_PG_TIMEOUT     the process group's timeout, seconds (default 20): its
                    collectives', not the rendezvous's (init())
  DW_VANISH_AT      N:where: at step N this rank vanishes. where: "poll"
                    (before poll: the others fail in the agreement),
                    "collective" (after it: in the all_reduce standing for
                    DDP's); how: DW_VANISH (kill: SIGKILL; stop: SIGSTOP,
                    a partitioned machine; raise: a bug of its own,
                    ValueError)
"""

import datetime
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import spotagent  # noqa: E402


# The rendezvous waits this long for the other ranks. env:// would wait only
# the process group's timeout (torch 1.13 and 2.x alike: the TCPStore gets
# init_process_group's timeout), and the ranks reach it as far apart as
# their interpreters' imports of torch differ: each took 14 s (torch 1.13)
# and 21 s (torch 2.14, the Debian unstable root) at a load average of 14
# here; one test's DW_PG_TIMEOUT is 3 s.
RENDEZVOUS_SECONDS = 300


def init() -> None:
    """init_process_group("gloo") on the env:// variables, with the
    rendezvous's timeout apart from the collectives' (DW_PG_TIMEOUT)."""
    timeout = float(os.environ.get("DW_PG_TIMEOUT") or 20)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    args = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
            datetime.timedelta(seconds=RENDEZVOUS_SECONDS))
    try:
        # torch 2.x asks for libuv by default; Debian's torch 2.x has none.
        store = dist.TCPStore(*args, use_libuv=os.environ.get("USE_LIBUV", "1") == "1")
    except TypeError:  # torch 1.13: no use_libuv, no libuv
        store = dist.TCPStore(*args)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    # The tests' deadlines start at this line, not at the process's start.
    print("joined rank %d of %d" % (rank, world), flush=True)


def vanish(step: int, where: str) -> None:
    at, _, w = (os.environ.get("DW_VANISH_AT") or "").partition(":")
    if not at or int(at) != step or w != where:
        return
    how = os.environ.get("DW_VANISH") or "kill"
    print("vanishing (%s) at step %d" % (how, step), flush=True)
    if how == "raise":
        raise ValueError("a bug of this rank's own at step %d" % step)
    os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)


def main() -> int:
    if os.environ.get("DW_CONNECT_FIRST") == "1":
        agent = spotagent.connect(welcome_timeout=5)
        init()
    else:
        init()
        agent = spotagent.connect(welcome_timeout=5)
    wait = os.environ.get("DW_WAIT", "")
    wait_at = int(os.environ.get("DW_WAIT_AT") or 1)
    sigterm_at = int(os.environ.get("DW_SIGTERM_AT") or 0)
    after = int(os.environ.get("DW_AFTER") or 2)
    end = time.monotonic() + float(os.environ.get("DW_MAX_SECONDS") or 60)
    events = []
    out = {"rank": dist.get_rank(), "events": events, "stop_step": None}
    step, exit_at = 0, None
    while True:
        step += 1
        if wait and step == wait_at:
            print("waiting %d" % step, flush=True)  # the test sends now: the next poll is the first to see it
            with agent._cond:
                ok = agent._cond.wait_for(
                    lambda: bool(agent._requests) if wait == "request" else agent._should_stop, 30)
            out["waited"] = ok
        vanish(step, "poll")
        req = agent.poll(step)
        vanish(step, "collective")
        if req is not None:
            events.append({"step": step, "call": agent._sync.calls, "id": req.id, "reason": req.reason,
                           "deadline": req.deadline.isoformat() if req.deadline else None, "dir": req.dir})
            with open(os.path.join(req.dir, "rank-%d.txt" % dist.get_rank()), "w") as f:
                f.write("%d\n" % step)
            req.done(step, {"rank": dist.get_rank()})
            if exit_at is None:
                exit_at = step + after
        if agent.should_stop:
            out["stop_step"] = step
            break
        if sigterm_at and step == sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        flag = torch.tensor([1 if (exit_at is not None and step >= exit_at) or time.monotonic() > end else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            break
    out.update(step=step, active=agent._sync.active, exit_code=agent.exit_code, stop_reason=agent.stop_reason,
               timed_out=time.monotonic() > end)
    agent.close()
    with open(os.environ["DW_OUT"], "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The result is written: skip the interpreter's teardown, where torch
    # 1.13's gloo threads sometimes abort ("terminate called without an
    # active exception", SIGABRT) after a rank handled SIGTERM.
    os._exit(code)
