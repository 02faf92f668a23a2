"""The golden transcripts of the protocol (pkg/supervisor/testdata/golden),
replayed against fakeagent.py. pkg/supervisor's TestGolden replays the same
files against the real agent, so whatever the fake answers on its own
(welcome, errors, committed, a join's checkpoint) is what the agent answers:
the fake cannot accept what the agent refuses. The format is described in
pkg/supervisor/golden_test.go. Lines the agent sends on its own initiative
("own": a periodic request, a stop) are sent by this test through the fake.
"""

import datetime
import glob
import json
import os
import queue
import re
import shutil
import socket
import sys
import tempfile
import threading
import unittest
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fakeagent import DEADLINE, FakeAgent  # noqa: E402

GOLDEN = os.path.join(HERE, "..", "..", "pkg", "supervisor", "testdata", "golden")
VAR = re.compile(r"^\$[A-Z][A-Z0-9_]*$")
UTC = datetime.timezone.utc


def rfc3339(t: datetime.datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def is_time(v: Any) -> bool:
    return isinstance(v, str) and re.match(
        r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$", v) is not None


def substitute(v: Any, vars: Dict[str, Any]) -> Any:
    """A trainer line's placeholders (as golden_test.go substituteGolden)."""
    if isinstance(v, dict):
        return {k: substitute(e, vars) for k, e in v.items()}
    if isinstance(v, list):
        return [substitute(e, vars) for e in v]
    if v == "$PID":
        return os.getpid()
    if v == "$FUTURE":
        return rfc3339(datetime.datetime.now(UTC) + datetime.timedelta(seconds=30))
    if v == "$PAST":
        return rfc3339(datetime.datetime.now(UTC) - datetime.timedelta(minutes=1))
    if isinstance(v, str) and VAR.match(v) and v[1:] in vars:
        return vars[v[1:]]
    return v


def match(want: Any, got: Any, vars: Dict[str, Any], path: str = "") -> None:
    """Raise AssertionError unless got matches want (as golden_test.go matchGolden)."""
    if isinstance(want, str):
        if want == "$ANY":
            return
        if want == "$TIME":
            if not is_time(got):
                raise AssertionError("%s: %r is not an RFC 3339 time" % (path, got))
            return
        if want.endswith("$*"):
            if not isinstance(got, str) or not got.startswith(want[:-2]):
                raise AssertionError("%s: %r does not start with %r" % (path, got, want[:-2]))
            return
        if VAR.match(want):
            name = want[1:]
            if name in vars:
                if vars[name] != got:
                    raise AssertionError("%s: %r, want %s = %r" % (path, got, want, vars[name]))
                return
            vars[name] = got
            return
    if isinstance(want, dict):
        if not isinstance(got, dict):
            raise AssertionError("%s: %r is not an object" % (path, got))
        if sorted(want) != sorted(got):
            raise AssertionError("%s: keys %s, want %s" % (path, sorted(got), sorted(want)))
        for k, e in want.items():
            match(e, got[k], vars, path + "." + k)
        return
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            raise AssertionError("%s: %r, want %r" % (path, got, want))
        for i, (w, g) in enumerate(zip(want, got)):
            match(w, g, vars, "%s[%d]" % (path, i))
        return
    if want != got or type(want) is not type(got):
        raise AssertionError("%s: %r, want %r" % (path, got, want))


def read(path: str) -> List[Dict[str, Any]]:
    lines = []
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            if raw.strip():
                try:
                    lines.append(json.loads(raw))
                except ValueError as e:
                    raise AssertionError("%s:%d: %s" % (path, n, e))
    if not lines or "golden" not in lines[0]:
        raise AssertionError("%s: the first line must be {\"golden\": {...}}" % path)
    return lines


class TestGolden(unittest.TestCase):
    def test_transcripts_exist(self):
        names = {os.path.basename(p) for p in glob.glob(os.path.join(GOLDEN, "*.jsonl"))}
        for must in ("hello_welcome.jsonl", "periodic.jsonl", "shutdown_stop.jsonl", "interruption.jsonl",
                     "failed.jsonl", "garbage.jsonl", "saved.jsonl", "join.jsonl", "join_errors.jsonl",
                     "restore_pending.jsonl", "restore_held_v1.jsonl", "restore_failed.jsonl",
                     "bad_numbers.jsonl", "bad_numbers_done.jsonl"):
            self.assertIn(must, names)

    def test_fake_answers_as_the_real_agent(self):
        paths = sorted(glob.glob(os.path.join(GOLDEN, "*.jsonl")))
        self.assertTrue(paths, "no transcripts in %s" % GOLDEN)
        for p in paths:
            with self.subTest(transcript=os.path.basename(p)):
                self.replay(read(p))

    def replay(self, lines: List[Dict[str, Any]]) -> None:
        tmp = tempfile.mkdtemp(prefix="spa-golden-")
        self.addCleanup(shutil.rmtree, tmp, True)
        ckpt = os.path.join(tmp, "ckpt")
        os.makedirs(ckpt)
        restore = lines[0]["golden"].get("restore")
        srv = FakeAgent(os.path.join(tmp, "a.sock"), commit=True, join_dir=os.path.join(ckpt, "job"),
                        welcome={"type": "welcome", "version": 1, "run_id": "test", "checkpoint_dir": ckpt},
                        restore="pending" if restore else None)
        self.addCleanup(srv.stop)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(srv.path)
        self.addCleanup(sock.close)
        incoming = queue.Queue()  # type: queue.Queue[Any]

        def reader() -> None:
            for line in sock.makefile("rb"):
                incoming.put(line)
            incoming.put(None)

        threading.Thread(target=reader, daemon=True).start()
        srv.wait_connections(1)
        vars = {}  # type: Dict[str, Any]
        for n, g in enumerate(lines[1:], 2):
            where = "line %d" % n
            if "trainer" in g:
                sock.sendall((json.dumps(substitute(g["trainer"], vars)) + "\n").encode())
            elif "trainer_raw" in g:
                sock.sendall((g["trainer_raw"] + "\n").encode())
            elif "agent" in g:
                if g.get("own"):
                    srv.send(self.own(g["agent"], vars, ckpt))
                try:
                    raw = incoming.get(timeout=DEADLINE)
                except queue.Empty:
                    raise AssertionError("%s: no line from the fake, want %s" % (where, g["agent"]))
                if raw is None:
                    raise AssertionError("%s: connection closed, want %s" % (where, g["agent"]))
                try:
                    match(g["agent"], json.loads(raw), vars)
                except AssertionError as e:
                    raise AssertionError("%s: the fake sent %s, the agent %s: %s" % (where, raw, g["agent"], e))
            elif g.get("do") == "write":
                d = vars[g["dir"][1:]]
                with open(os.path.join(d, g["file"]), "w") as f:
                    f.write(g.get("data", ""))
            elif g.get("do") == "restore":
                # The restore's end: the fake's state changes as the
                # agent's; what the agent then sends on its own (restored,
                # a held welcome, restore_failed) is an "own" line.
                with srv.cond:
                    srv.waiting, srv.held = [], []
                    srv.restore = None
                    if restore == "fail":
                        srv.restore_error = "restore: the fake's store failed half-way"
            elif g.get("do") in ("signal", "notice") or "#" in g:
                pass  # the agent's own lines that follow are sent by own()
            else:
                raise AssertionError("%s: nothing to do: %r" % (where, g))

    def own(self, want: Any, vars: Dict[str, Any], ckpt: str) -> Any:
        """A line the agent sends on its own, with its placeholders made up
        as the agent would: ids of 12 hex digits, created directories."""
        if isinstance(want, dict):
            return {k: self.own(v, vars, ckpt) for k, v in want.items()}
        if isinstance(want, list):
            return [self.own(v, vars, ckpt) for v in want]
        if want == "$TIME":
            return rfc3339(datetime.datetime.now(UTC) + datetime.timedelta(minutes=10))
        if isinstance(want, str) and VAR.match(want):
            name = want[1:]
            if name not in vars:
                if name.startswith("ID"):
                    vars[name] = os.urandom(6).hex()
                elif name.startswith("DIR"):
                    d = os.path.join(ckpt, "spotagent-test", os.urandom(6).hex())
                    os.makedirs(d)
                    vars[name] = d
                else:
                    vars[name] = "made-up-" + name.lower()
            return vars[name]
        return want


if __name__ == "__main__":
    unittest.main()
