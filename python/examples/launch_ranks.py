#!/usr/bin/env python3
"""A minimal stand-in for torchrun, for tests and single-machine trials.

Debian's python3-torch 1.13 ships a torchrun that does not start under
Python 3.11, so the tests launch ranks with this instead. Real jobs use
torchrun (`spotagent run --node-rank K -- torchrun --node_rank=K ...`).

    launch_ranks.py --nnodes 2 --node-rank 1 --nproc-per-node 2 \
        --master-addr 127.0.0.1 --master-port 29500 -- python3 train_ddp.py

starts --nproc-per-node copies of the command with the environment
torchrun gives its workers (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), forwards SIGTERM and SIGINT to them, and exits as torchrun
does: 0 when every worker succeeded, else 1 whatever the workers' codes
(torchrun reports workers that exited 75 as 1; `spotagent run --node-rank`
knows). When one worker fails, the others are sent SIGTERM.
"""

import argparse
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("a command to run is required after --")
    world = a.nnodes * a.nproc_per_node
    procs = []
    for local in range(a.nproc_per_node):
        env = dict(os.environ)
        env.update({
            "RANK": str(a.node_rank * a.nproc_per_node + local),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(a.nproc_per_node),
            "GROUP_RANK": str(a.node_rank),
            "GROUP_WORLD_SIZE": str(a.nnodes),
            "MASTER_ADDR": a.master_addr,
            "MASTER_PORT": str(a.master_port),
        })
        procs.append(subprocess.Popen(cmd, env=env))

    def forward(signum, frame):
        for pr in procs:
            if pr.poll() is None:
                pr.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = 0
    while procs:
        for pr in list(procs):
            rc = pr.poll()
            if rc is None:
                continue
            procs.remove(pr)
            if rc != 0 and code == 0:
                code = 1  # torchrun: ChildFailedError, whatever the worker's code
                for other in procs:
                    if other.poll() is None:
                        other.terminate()
        time.sleep(0.05)
    return code


if __name__ == "__main__":
    sys.exit(main())
