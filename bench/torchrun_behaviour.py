#!/usr/bin/env python3
"""What the real torchrun (torch.distributed.run, the elastic agent) does
with signals and its workers' exit codes: the facts spotagent's exit-code
mapping and the Kubernetes manifests rely on (docs/distributed.md, "What
torchrun does").

    /usr/bin/python3 bench/torchrun_behaviour.py [--only NAME]

Each scenario starts python/examples/torchrun.py (the real torchrun; see
that file) with --nproc_per_node 2 --monitor_interval M in a process group
of its own (as `spotagent run` starts its trainer), around a tiny worker
(no process group, no GPU) that logs every signal it gets with a
timestamp and then does what the scenario says (ignore SIGTERM, exit 75 on
it, exit with a given code after a delay, or run until killed). It prints
one Markdown row per scenario: the signals each worker got and how long
after the test's signal, when the workers died, torchrun's exit code and
how long it took to exit. Runs about 1.5 minutes (two scenarios wait for
torchrun's own 30 s SIGTERM→SIGKILL timeout).
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(HERE, "..", "python", "examples", "torchrun.py")
PY = "/usr/bin/python3"

WORKER = r'''
import os, signal, sys, time
r = int(os.environ["LOCAL_RANK"])
log = open(os.path.join(os.environ["WDIR"], "w%d-%s" % (r, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))), "a", buffering=1)
def say(what):
    log.write("%.6f %s\n" % (time.time(), what))
plan = os.environ["WPLAN"].split(",")[r]   # ignore | exit75 | <code>@<seconds>
def on(s, f):
    say("signal " + signal.Signals(s).name)
    if plan == "exit75":
        say("exit 75"); os._exit(75)
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, on)
say("start pid=%d pgid=%d" % (os.getpid(), os.getpgrp()))
if "@" in plan:
    code, after = plan.split("@")
    time.sleep(float(after))
    say("exit " + code); sys.exit(int(code))
while True:
    time.sleep(0.01)
'''


def read_events(wdir):
    """{(local rank, restart): [(t, what)]}"""
    ev = {}
    for name in os.listdir(wdir):
        if not name.startswith("w"):
            continue
        r, restart = name[1:].split("-")
        with open(os.path.join(wdir, name)) as f:
            ev[(int(r), int(restart))] = [(float(l.split(" ", 1)[0]), l.split(" ", 1)[1].strip()) for l in f if l.strip()]
    return ev


def wait_started(wdir, n, timeout=60.0):
    end = time.time() + timeout
    while time.time() < end:
        ev = read_events(wdir)
        if sum(1 for k, v in ev.items() if any(w.startswith("start") for _, w in v)) >= n:
            return
        time.sleep(0.05)
    raise RuntimeError("workers did not start within %.0f s" % timeout)


def pids_alive(pids):
    alive = []
    for p in pids:
        try:
            with open("/proc/%d/stat" % p) as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(p)
        except OSError:
            pass
    return alive


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(name, plan, sig=None, target="torchrun", extra=(), monitor=0.1):
    """One scenario; returns a dict of results."""
    wdir = tempfile.mkdtemp(prefix="trb-")
    wpath = os.path.join(wdir, "prog.py")
    with open(wpath, "w") as f:
        f.write(WORKER)
    env = dict(os.environ, WDIR=wdir, WPLAN=plan, PYTHONUNBUFFERED="1")
    cmd = [PY, LAUNCHER, "--nnodes", "1", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "--monitor_interval", str(monitor)] + list(extra) + [wpath]
    out = open(os.path.join(wdir, "torchrun.log"), "w")
    p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_started(wdir, 2)
    except RuntimeError:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    ev = read_events(wdir)
    pids = [int(w.split("pid=")[1].split()[0]) for v in ev.values() for _, w in v if w.startswith("start")]
    t0 = time.time()
    if sig is not None:
        if target == "group":
            os.killpg(p.pid, sig)
        elif target == "group-twice":
            os.killpg(p.pid, sig)
            time.sleep(0.3)
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
    # when did the workers die (SIGKILL leaves no log line)?
    died = None
    while True:
        if died is None and not pids_alive(pids):
            died = time.time()
        rc = p.poll()
        if rc is not None and died is not None:
            break
        if time.time() - t0 > 120:
            p.kill()
            rc = "hung"
            break
        time.sleep(0.01)
    t_exit = time.time()
    out.close()
    ev = read_events(wdir)
    if sig is None:  # measure from the first worker's exit
        exits = [t for v in ev.values() for t, w in v if w.startswith("exit")]
        t0 = min(exits) if exits else t0
    res = {"name": name, "rc": rc, "exit_s": t_exit - t0, "died_s": died - t0}
    sigs = []
    for (r, restart), v in sorted(ev.items()):
        got = ["%s +%.0f ms" % (w.split()[1], (t - t0) * 1000) for t, w in v if w.startswith("signal")]
        sigs.append("r%d%s: %s" % (r, "" if restart == 0 else " (restart %d)" % restart, ", ".join(got) or "none"))
    res["signals"] = "; ".join(sigs)
    res["starts"] = sum(1 for v in ev.values() for _, w in v if w.startswith("start"))
    with open(os.path.join(wdir, "torchrun.log")) as f:
        log = f.read()
    res["sigkill"] = "forcefully exitting via Signals.SIGKILL" in log or "forcefully exitting via SIGKILL" in log
    shutil.rmtree(wdir)
    return res


SCENARIOS = [
    # name, worker plans, signal, target, extra args, monitor interval
    ("SIGTERM to torchrun, workers ignore it", "ignore,ignore", signal.SIGTERM, "torchrun", (), 0.1),
    ("SIGTERM to torchrun, workers exit 75 on it", "exit75,exit75", signal.SIGTERM, "torchrun", (), 0.1),
    ("SIGINT to torchrun, workers exit 75 on it", "exit75,exit75", signal.SIGINT, "torchrun", (), 0.1),
    ("SIGTERM to the process group, workers exit 75 on it", "exit75,exit75", signal.SIGTERM, "group", (), 0.1),
    ("SIGTERM to the process group, workers ignore it", "ignore,ignore", signal.SIGTERM, "group", (), 0.1),
    ("SIGTERM to the group twice 0.3 s apart, workers ignore it", "ignore,ignore", signal.SIGTERM, "group-twice", (), 0.1),
    ("workers exit 0, 0", "0@1,0@1", None, None, (), 0.1),
    ("workers exit 75, 75", "75@1,75@1", None, None, (), 0.1),
    ("workers exit 75, 75 (default --monitor_interval 5)", "75@1,75@1", None, None, (), 5),
    ("workers exit 1, 1", "1@1,1@1", None, None, (), 0.1),
    ("workers exit 75, 0", "75@1,0@1", None, None, (), 0.1),
    ("workers exit 75, 1", "75@1,1@1", None, None, (), 0.1),
    ("worker 0 exits 75, worker 1 runs and ignores SIGTERM", "75@1,ignore", None, None, (), 0.1),
    ("workers exit 75, 75 with --max_restarts 1", "75@1,75@1", None, None, ("--max_restarts", "1"), 0.1),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="run the scenarios whose name contains this")
    a = ap.parse_args()
    import torch
    print("torch %s, Python %s; torchrun = %s\n" % (torch.__version__, sys.version.split()[0], os.path.relpath(LAUNCHER)))
    print("| scenario | signals the workers got (ms after the test's signal or the first worker's exit) | workers gone after | torchrun exit code | torchrun exited after |")
    print("| --- | --- | --- | --- | --- |")
    for name, plan, sig, target, extra, monitor in SCENARIOS:
        if a.only and a.only not in name:
            continue
        r = run(name, plan, sig, target, extra, monitor)
        note = " (SIGKILLed by torchrun)" if r["sigkill"] else ""
        if r["starts"] > 2:
            note += " (%d worker starts: restarted)" % r["starts"]
        print("| %s | %s | %.2f s%s | %s | %.2f s |" % (name, r["signals"], r["died_s"], note, r["rc"], r["exit_s"]), flush=True)


if __name__ == "__main__":
    main()
