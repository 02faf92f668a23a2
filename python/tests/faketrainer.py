"""The fake trainer of the end-to-end tests: one script, its behaviours
chosen by flags.

A real trainer on the real client (``spotagent``, from this checkout) over
the real socket: it connects, reports its resume, trains in steps (a sleep
each), polls, answers the agent's checkpoint requests, and stops when told,
exiting with ``agent.exit_code``. The flags make it misbehave the ways the
tests need: never poll, ignore stop, answer never, wrongly or after a
sleep, fail a save, crash half-way through one, run without its socket.

What it does with a request is a list of actions, by request (``--on``):

    --on 'ACTIONS'         every request not named by another --on
    --on 'N=ACTIONS'       the Nth request (1 is the first)
    --on 'REASON=ACTIONS'  requests of that reason (periodic, interruption,
                           shutdown, manual)

ACTIONS, comma-separated, run in order (default ``write,done``):

    write                  write the --file files (fsynced)
    write:NAME:BYTES[:C]   write NAME (in the request's directory, or an
                           absolute path) of BYTES bytes of character C (by
                           default the step's byte), fsynced, in place
    sleep:S                sleep S seconds
    done                   answer done at the current step
    ignore                 leave the request unanswered
    exit:N                 sys.exit(N): the interpreter's exit, the
                           client closes as it does
    crash:N                os._exit(N): a native crash, nothing closed

An OSError of write fails the request (``failed``, with the
error) and ends its actions.

The other flags (connection, steps, stop, signals):
``--help``.

Every line it prints starts with "trainer: " (the agent's logs share the
pipe), one write a line; each message the agent sends is printed as
"trainer: got TYPE id=... reason=... error=...".

python/tests/test_faketrainer.py runs it against the fake agent;
integration/ runs it under the real one.
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

# The client of this checkout, wherever the script is started from.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def log(*a: Any) -> None:
    # One write per line: the agent's logs share the pipe.
    sys.stdout.write(" ".join(["trainer:"] + [str(x) for x in a]) + "\n")
    sys.stdout.flush()


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-socket", action="store_true",
                   help="drop SPOTAGENT_SOCKET from the environment first: the client is a no-op")
    p.add_argument("--pid-file", default=None, metavar="PATH", help="write the pid to PATH (whole, by rename) at boot")
    p.add_argument("--exit-on-signal", default=None, metavar="SIG:CODE",
                   help="a handler for signal SIG (e.g. SIGUSR1) that exits CODE at once, saving nothing")
    p.add_argument("--connect-after", type=float, default=0, metavar="S", help="sleep S seconds before connecting")
    p.add_argument("--sync-every", type=int, default=None, help="connect(sync_every=...); 0: no agreement")
    p.add_argument("--steps", type=int, default=0, metavar="N",
                   help="train until step N (a resumed run goes on from its step), then finish (0: until stopped)")
    p.add_argument("--step-time", type=float, default=0.01, metavar="S", help="seconds a step sleeps")
    p.add_argument("--no-poll", action="store_true", help="never poll: deaf to every request and to stop")
    p.add_argument("--ignore-stop", action="store_true", help="train on when the agent says stop")
    p.add_argument("--crash-file", default=None, metavar="PATH", help="crash (os._exit(1)) once PATH exists")
    p.add_argument("--resume-hash", default=None, metavar="NAME",
                   help="print the sha256 of NAME in the resumed checkpoint")
    p.add_argument("--file", action="append", default=[], metavar="NAME:BYTES[:C]",
                   help="what write writes (default state.bin:1024)")
    p.add_argument("--on", action="append", default=[], metavar="[WHEN=]ACTIONS", help="see the module doc")
    a = p.parse_args(argv)
    a.file = [parse_file(f) for f in (a.file or ["state.bin:1024"])]
    a.plan = {}  # type: Dict[str, List[List[str]]]
    for spec in a.on:
        when, _, actions = spec.rpartition("=")
        a.plan[when or "*"] = [x.split(":") for x in actions.split(",") if x]
    return a


def parse_file(spec: str) -> Tuple[str, int, Optional[bytes]]:
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise SystemExit("trainer: bad file %r: want NAME:BYTES[:C]" % spec)
    fill = parts[2].encode()[:1] if len(parts) == 3 else None
    return parts[0], int(parts[1]), fill


def trace_messages() -> None:
    """Print every message the agent sends. The client has no public hook
    for that: its inbox is wrapped (the tests wait on these lines)."""
    from spotagent import _inbox

    dispatch = _inbox.Inbox.dispatch

    def traced(self: Any, msg: Dict[str, Any]) -> None:
        extra = ""
        if msg.get("type") == "welcome" and msg.get("restore"):
            extra = " restore=%s" % msg.get("restore")
        log("got", msg.get("type"), "id=%s reason=%s error=%s%s" % (msg.get("id", ""), msg.get("reason", ""),
                                                                    msg.get("error", ""), extra))
        dispatch(self, msg)

    _inbox.Inbox.dispatch = traced  # type: ignore[method-assign]


def write_file(path: str, size: int, fill: bytes) -> None:
    """Write size bytes of fill at path, in place (a file already there is
    overwritten, never replaced), and fsync it."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        data = fill * size
        while data:
            data = data[os.write(fd, data):]
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


class Trainer(object):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.step = 0
        self.requests = 0
        self.agent = None  # type: Any

    def write(self, d: str, files: List[Tuple[str, int, Optional[bytes]]]) -> None:
        for name, size, fill in files:
            write_file(os.path.join(d, name), size, fill or bytes([self.step % 256]))

    def actions_for(self, req: Any) -> List[List[str]]:
        plan = self.args.plan
        for key in (str(self.requests), req.reason, "*"):
            if key in plan:
                return plan[key]
        return [["write"], ["done"]]

    def answer(self, req: Any) -> None:
        self.requests += 1
        log("asked for checkpoint %s (%s) at step %d" % (req.id, req.reason, self.step))
        for act in self.actions_for(req):
            name, params = act[0], act[1:]
            try:
                if name == "write":
                    if params:
                        self.write(req.dir, [parse_file(":".join(params))])
                    else:
                        self.write(req.dir, self.args.file)
                elif name == "sleep":
                    time.sleep(float(params[0]))
                elif name == "done":
                    req.done(self.step)
                    log("saved checkpoint %s (%s) at step %d" % (req.id, req.reason, self.step))
                elif name == "ignore":
                    log("ignoring request", req.id)
                elif name == "exit":
                    log("exiting %s on request %s" % (params[0], req.id))
                    sys.exit(int(params[0]))
                elif name == "crash":
                    log("crashing mid-save", req.id)
                    os._exit(int(params[0]))
                else:
                    raise SystemExit("trainer: unknown action %r" % name)
            except OSError as e:
                req.fail(e)
                log("save failed", req.id, e)
                return

    def resume(self) -> None:
        import spotagent

        try:
            step = self.agent.resume_step
        except spotagent.RestoreFailed as e:
            log("restore failed:", e.error)
            sys.exit(3)
        if step is None:
            log("fresh start")
            return
        self.step = step
        meta = json.dumps(self.agent.resume_metadata, sort_keys=True)
        if self.args.resume_hash:
            with open(os.path.join(self.agent.resume_dir, self.args.resume_hash), "rb") as f:
                h = hashlib.sha256(f.read()).hexdigest()
            log("resumed at step %d sha256 %s metadata %s" % (step, h, meta))
        else:
            log("resumed at step %d metadata %s" % (step, meta))

    def run(self) -> int:
        a = self.args
        log("booted pid", os.getpid())
        if a.pid_file:
            with open(a.pid_file + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(a.pid_file + ".tmp", a.pid_file)
        if a.exit_on_signal:
            name, code = a.exit_on_signal.split(":")
            signal.signal(getattr(signal, name), lambda s, f: os._exit(int(code)))
            log("exits %s on %s" % (code, name))
        if a.no_socket:
            os.environ.pop("SPOTAGENT_SOCKET", None)
        trace_messages()
        time.sleep(a.connect_after)
        import spotagent

        self.agent = agent = spotagent.connect(sync_every=a.sync_every)
        log("connected pending=%s enabled=%s rank=%s" % (agent.restore_pending, agent.enabled, agent.rank))
        self.resume()
        last = None if a.steps <= 0 else a.steps
        while last is None or self.step < last:
            self.step += 1
            time.sleep(a.step_time)
            if a.crash_file and os.path.exists(a.crash_file):
                log("crashing at step %d" % self.step)
                os._exit(1)
            if a.no_poll:
                continue
            req = agent.poll(self.step)
            if req is not None:
                self.answer(req)
            if agent.should_stop:
                if not a.ignore_stop:
                    log("stopping at step %d (%s)" % (self.step, agent.stop_reason))
                    agent.close()
                    return int(agent.exit_code)
        log("finished at step %d" % self.step)
        agent.close()
        return 0


if __name__ == "__main__":
    sys.exit(Trainer(parse_args(sys.argv[1:])).run())
