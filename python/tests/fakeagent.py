"""A fake spotagent: a real Unix socket server in a thread speaking protocol v2.

Tests drive it explicitly: every received message is recorded, and tests wait
for conditions with deadlines (threading.Condition), never with sleeps.

What it answers on its own (welcome, error, committed, a join's checkpoint)
follows the real agent line for line: test_golden.py replays the golden
transcripts that pkg/supervisor's TestGolden checks against the real agent
(pkg/supervisor/testdata/golden) against this fake, so the fake cannot accept
what the agent refuses. What the agent says on its own initiative (a
periodic or interruption request, stop) the tests send with ``send``; a
``checkpoint`` sent that way is pending here, as in the agent, until its done
or failed.
"""

import datetime
import json
import os
import re
import socket
import threading
from typing import Any, Callable, Dict, List, Optional, Set

#: Message types a trainer may send (anything else: "unknown message type").
TRAINER_TYPES = ("hello", "progress", "done", "saved", "failed", "status", "join", "bye")
REASONS = ("periodic", "manual", "shutdown", "interruption")
_ID = re.compile(r"^[0-9a-f]{12}$")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")

DEADLINE = 10.0  # generous upper bound for any wait in the tests
PROTOCOL_VERSION = 2  # the newest the agent speaks (protocol.ProtocolVersion)


class FakeAgent(object):
    def __init__(
        self,
        path: str,
        welcome: Optional[Dict[str, Any]] = None,
        read: bool = True,
        join_dir: Optional[str] = None,
        commit: bool = False,
        restore: Optional[str] = None,
    ) -> None:
        self.path = path
        self.welcome = welcome  # sent in reply to hello; None = send nothing
        self.read = read  # False: accept, send welcome at once, never read
        # Answer join {id, reason, deadline} with checkpoint {id, reason,
        # dir: join_dir/id, deadline}, as the agent does (None: no answer).
        self.join_dir = join_dir
        # Answer done {id, step} with committed {id, uri, step}.
        self.commit = commit
        # "pending": as an agent restoring beside the trainer's start
        # (protocol 2): a hello with version >= 2 is welcomed at once with
        # restore "pending" (and waits in self.waiting for restored or
        # restore_failed), one without is held (self.held: its welcome comes
        # with the resume); see restore_done. None: resume is final.
        self.restore = restore
        self.restore_error = None  # type: Optional[str]
        self.waiting = []  # type: List[socket.socket]
        self.held = []  # type: List[socket.socket]
        self.cond = threading.Condition()
        self.received = []  # type: List[Dict[str, Any]]
        self.raw = []  # type: List[bytes]
        self.conns = []  # type: List[socket.socket]
        self.accepted = 0
        # As the agent: requests pending an answer (id -> dir), the paths
        # reported saved for each, and the connections that said hello.
        self.pending = {}  # type: Dict[str, str]
        self._requests = {}  # type: Dict[str, Dict[str, Any]]  # id -> the checkpoint message
        self.saved_paths = {}  # type: Dict[str, Set[str]]
        self._hello = {}  # type: Dict[int, bool]  # connection -> a rank of a multi-rank job
        self._threads = []  # type: List[threading.Thread]
        self._listener = None  # type: Optional[socket.socket]
        self._stopped = False
        self.start()

    # -- lifecycle
    def start(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ls.bind(self.path)
        ls.listen(8)
        self._listener = ls
        self._stopped = False
        t = threading.Thread(target=self._accept_loop, args=(ls,), daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        """Close the listener and every connection (the agent went away)."""
        with self.cond:
            self._stopped = True
            conns, self.conns = self.conns, []
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        if os.path.exists(self.path):
            os.unlink(self.path)

    def restart(self) -> None:
        self.stop()
        self.start()

    # -- sending
    def send(self, msg: Any, conn: int = -1) -> None:
        line = msg if isinstance(msg, bytes) else (json.dumps(msg) + "\n").encode()
        with self.cond:
            c = self.conns[conn]
            if isinstance(msg, dict) and msg.get("type") == "checkpoint" and msg.get("id"):
                self.pending[str(msg["id"])] = str(msg.get("dir") or "")
                self._requests[str(msg["id"])] = msg
        c.sendall(line)

    # -- waiting
    def wait_for(self, pred: Callable[[], bool], timeout: float = DEADLINE) -> bool:
        with self.cond:
            return self.cond.wait_for(pred, timeout)

    def wait_message(self, type_: str, count: int = 1, timeout: float = DEADLINE) -> List[Dict[str, Any]]:
        ok = self.wait_for(lambda: len(self.of_type(type_)) >= count, timeout)
        if not ok:
            raise AssertionError("no %d %r message(s) within %ss; got %r" % (count, type_, timeout, self.received))
        return self.of_type(type_)

    def of_type(self, type_: str) -> List[Dict[str, Any]]:
        with self.cond:
            return [m for m in self.received if m.get("type") == type_]

    def wait_connections(self, n: int, timeout: float = DEADLINE) -> None:
        if not self.wait_for(lambda: self.accepted >= n and len(self.conns) > 0, timeout):
            raise AssertionError("fewer than %d connections within %ss" % (n, timeout))

    # -- internals
    def _accept_loop(self, ls: socket.socket) -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            with self.cond:
                if self._stopped:
                    c.close()
                    return
                self.conns.append(c)
                self.accepted += 1
                self.cond.notify_all()
            if not self.read:
                if self.welcome is not None:
                    c.sendall((json.dumps(self.welcome) + "\n").encode())
                continue
            t = threading.Thread(target=self._read_loop, args=(c,), daemon=True)
            t.start()
            self._threads.append(t)

    def _read_loop(self, c: socket.socket) -> None:
        f = c.makefile("rb")
        try:
            for line in f:
                if not line.strip():
                    continue
                msg = None  # type: Any
                try:
                    msg = json.loads(line)
                except ValueError:
                    pass
                with self.cond:
                    self.raw.append(line)
                    self.received.append(msg if isinstance(msg, dict) else {"type": "<garbage>", "line": line})
                    self.cond.notify_all()
                reply = self._answer(c, msg, line)
                if reply is not None:
                    try:
                        c.sendall((json.dumps(reply) + "\n").encode())
                    except OSError:
                        return
        except (OSError, ValueError):
            return

    def _answer(self, c: socket.socket, msg: Any, line: bytes) -> Optional[Dict[str, Any]]:
        """What the real agent answers to msg (None: nothing), as far as the
        fake's configuration lets it (welcome, join_dir, commit)."""
        if not isinstance(msg, dict):
            return {"type": "error", "error": "malformed json: %s" % (line.strip()[:64],)}
        why = _undecodable(msg)
        if why is not None:
            return {"type": "error", "error": "malformed json: " + why}
        mid = msg.get("id")
        mid = mid if isinstance(mid, str) else ""
        t = msg.get("type")
        why = _out_of_bounds(msg)
        if why is not None:
            # As pkg/protocol's Conn.handle: refused where it enters, before
            # its type is looked at; nothing else sees it (a refused hello
            # leaves the connection without one).
            return _error(mid, "%s: %s" % (t if isinstance(t, str) else "", why))
        if not t:
            return _error(mid, "missing type")
        if t not in TRAINER_TYPES:
            return _error(mid, "unknown message type %s" % json.dumps(t))
        if t == "hello":
            with self.cond:
                ws, nodes = msg.get("world_size"), msg.get("nodes")
                self._hello[id(c)] = (isinstance(ws, int) and ws > 1) or (isinstance(nodes, int) and nodes > 1)
            return self._welcome(c, msg)
        if t == "done":
            return self._done(msg, mid)
        if t == "failed":
            with self.cond:
                if mid and mid in self.pending:
                    del self.pending[mid]
                    return None
            return _error(mid, "failed: unknown checkpoint id " + mid)
        if t == "saved":
            return self._saved(msg, mid)
        if t == "join" and self.join_dir is not None:
            return self._join(c, msg, mid)
        return None

    def _welcome(self, c: socket.socket, hello: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """As the agent's onHello: the version both speak; while restoring,
        "pending" for protocol 2 and nothing (held) for protocol 1; after a
        failed restore, "failed" (protocol 1: a permanent error)."""
        if self.welcome is None:
            return None
        v = hello.get("version")
        v = v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else 1
        w = dict(self.welcome)
        if "version" in w:
            w["version"] = min(v, PROTOCOL_VERSION)
        with self.cond:
            if self.restore is None and self.restore_error is None:
                return w
            if v < 2:
                if self.restore_error is not None:
                    return {"type": "error", "error": "run could not start: " + self.restore_error}
                self.held.append(c)
                return None
            if self.restore_error is not None:
                w["restore"], w["error"] = "failed", self.restore_error
            else:
                w["restore"] = "pending"
                self.waiting.append(c)
            w.pop("resume", None)
            return w

    def restore_done(self, resume: Optional[Dict[str, Any]] = None, error: Optional[str] = None) -> None:
        """The restore ends: restored {resume} (or restore_failed {error})
        to the trainers told "pending", the held welcome (or a permanent
        error) to the others."""
        with self.cond:
            waiting, held = self.waiting, self.held
            self.waiting, self.held = [], []
            self.restore = None
            self.restore_error = error
            if error is None and resume is not None and self.welcome is not None:
                self.welcome = dict(self.welcome, resume=resume)
        for c in waiting:
            m = {"type": "restore_failed", "error": error} if error is not None else {"type": "restored"}
            if error is None and resume is not None:
                m["resume"] = resume
            c.sendall((json.dumps(m) + "\n").encode())
        for c in held:
            if error is not None:
                c.sendall((json.dumps({"type": "error", "error": "run could not start: " + error}) + "\n").encode())
            elif self.welcome is not None:
                c.sendall((json.dumps(dict(self.welcome, version=1)) + "\n").encode())

    def _done(self, msg: Dict[str, Any], mid: str) -> Optional[Dict[str, Any]]:
        step = msg.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            return _error(mid, "done: step is required and must be >= 0")
        if not mid:
            return None  # unsolicited: not modelled
        with self.cond:
            if mid not in self.pending:
                return _error(mid, "done: unknown checkpoint id %s" % json.dumps(mid))
            del self.pending[mid]
            self.saved_paths.pop(mid, None)
        if not self.commit:
            return None
        return {"type": "committed", "id": mid, "uri": "file:///fake/" + mid, "step": step}

    def _saved(self, msg: Dict[str, Any], mid: str) -> Optional[Dict[str, Any]]:
        with self.cond:
            d = self.pending.get(mid) if mid else None
        if d is None:
            return _error(mid, "saved: unknown checkpoint id %s" % json.dumps(mid))
        path = str(msg.get("path") or "")
        rel = os.path.normpath(os.path.relpath(path, d) if os.path.isabs(path) else path)
        why = None
        if not path or rel == ".." or rel.startswith("../") or os.path.isabs(rel) or rel == ".":
            why = "not a path inside the checkpoint directory: unsafe path: %s" % json.dumps(path)
        else:
            with self.cond:
                seen = self.saved_paths.setdefault(mid, set())
                if rel in seen:
                    why = "already reported saved"
                else:
                    full = os.path.join(d, rel)
                    if not os.path.lexists(full):
                        why = "open %s: no such file or directory" % rel
                    elif os.path.islink(full) or not os.path.isfile(full):
                        why = "%s is not a regular file" % rel
                    else:
                        seen.add(rel)
        if why is not None:
            return _error(mid, "saved %s: %s" % (json.dumps(path), why))
        return None

    def _join(self, c: socket.socket, msg: Dict[str, Any], mid: str) -> Optional[Dict[str, Any]]:
        with self.cond:
            said_hello = id(c) in self._hello
            multi = self._hello.get(id(c), False)
        if not said_hello:
            return _error(mid, "join: say hello first")
        if not multi:
            # As the real agent: only a rank of a multi-rank job joins.
            return _error(mid, "join: only a rank of a multi-rank job joins a checkpoint (this trainer said no world_size > 1)")
        if not _ID.match(mid):
            return _error(mid, "join: id must be 12 lowercase hex digits")
        with self.cond:
            if mid in self.pending and mid in self._requests:
                return self._requests[mid]  # a repeated join: the same request again
        reason = msg.get("reason")
        if reason not in REASONS:
            return _error(mid, "join: unknown reason %s" % json.dumps(reason))
        now = datetime.datetime.now(datetime.timezone.utc)
        deadline = _parse(msg.get("deadline"))
        if deadline is None and "deadline" not in msg and reason in ("shutdown", "interruption"):
            # As the real agent (agent_job.go onJoin): a rank's own SIGTERM
            # offered to the job gets the agent's grace (25 s less the margin).
            deadline = now + datetime.timedelta(seconds=20)
        elif deadline is None or deadline <= now:
            return _error(mid, "join: a deadline in the future is required")
        d = os.path.join(self.join_dir or "", mid)
        dl = deadline.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        req = {"type": "checkpoint", "id": mid, "reason": reason, "dir": d, "deadline": dl}
        with self.cond:
            self.pending[mid] = d
            self._requests[mid] = req
        return req


# The bounds of pkg/protocol/validate.go: every number a trainer sends is
# checked against them where it enters (test_golden.py replays
# bad_numbers*.jsonl against this fake and TestGolden against the agent).
MAX_WORLD_SIZE = 1 << 20
MAX_STEP = 1 << 53
MAX_BLOCKED_MS = 1 << 40
MAX_PID = 1 << 22
MAX_VERSION = 1 << 16
_INT_FIELDS = ("pid", "rank", "world_size", "local_rank", "local_world_size", "node_rank", "nodes", "step",
               "blocked_ms", "version")
_STR_FIELDS = ("type", "run_id", "id", "path", "error", "checkpoint_dir", "restore", "reason", "dir", "uri")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _undecodable(msg: Dict[str, Any]) -> Optional[str]:
    """Why Go's encoding/json cannot decode msg into protocol.Message (its
    "malformed json" reply), for the fields the fake models: a number field
    that holds no integer a Go int64 holds, a string field that is no
    string (null leaves a field unset)."""
    for k in _INT_FIELDS:
        v = msg.get(k)
        if v is not None and (not _is_int(v) or not -(1 << 63) <= v < (1 << 63)):
            return "json: cannot unmarshal %s into Go struct field Message.%s" % (json.dumps(v), k)
    for k in _STR_FIELDS:
        v = msg.get(k)
        if v is not None and not isinstance(v, str):
            return "json: cannot unmarshal %s into Go struct field Message.%s of type string" % (json.dumps(v), k)
    dl = msg.get("deadline")  # a *time.Time: an RFC 3339 string or null
    if dl is not None and (not isinstance(dl, str) or not _RFC3339.match(dl) or _parse(dl) is None):
        return "parsing time %s as RFC 3339" % json.dumps(dl)
    return None


def _out_of_bounds(m: Dict[str, Any]) -> Optional[str]:
    """pkg/protocol's Message.validate, line for line: the first number out
    of its bounds, or None. A field that is absent or null is unset (pid and
    version then count as 0, as a Go int does)."""
    pid, version = m.get("pid") or 0, m.get("version") or 0
    if not 0 <= pid <= MAX_PID:
        return "pid %d out of range (0..%d)" % (pid, MAX_PID)
    if not 0 <= version <= MAX_VERSION:
        return "version %d out of range (0..%d)" % (version, MAX_VERSION)
    for name in ("world_size", "local_world_size", "nodes"):
        v = m.get(name)
        if v is not None and not 1 <= v <= MAX_WORLD_SIZE:
            return "%s %d out of range (1..%d)" % (name, v, MAX_WORLD_SIZE)
    for name, of in (("rank", "world_size"), ("local_rank", "local_world_size"), ("node_rank", "nodes")):
        v, n = m.get(name), m.get(of)
        if v is None:
            continue
        if not 0 <= v < MAX_WORLD_SIZE:
            return "%s %d out of range (0..%d)" % (name, v, MAX_WORLD_SIZE - 1)
        if n is not None and v >= n:
            return "%s %d must be below %s %d" % (name, v, of, n)
    ws = m.get("world_size")
    if ws is not None:
        for name in ("local_world_size", "nodes"):
            v = m.get(name)
            if v is not None and v > ws:
                return "%s %d exceeds world_size %d" % (name, v, ws)
    step = m.get("step")
    if step is not None:
        if step < 0:
            return "step is required and must be >= 0"
        if step > MAX_STEP:
            return "step %d too large (at most %d)" % (step, MAX_STEP)
    blocked = m.get("blocked_ms")
    if blocked is not None and not 0 <= blocked <= MAX_BLOCKED_MS:
        return "blocked_ms %d out of range (0..%d)" % (blocked, MAX_BLOCKED_MS)
    return None


def _error(mid: str, text: str) -> Dict[str, Any]:
    m = {"type": "error", "error": text}  # type: Dict[str, Any]
    if mid:
        m["id"] = mid
    return m


def _parse(value: Any) -> Optional[datetime.datetime]:
    if not isinstance(value, str) or not value:
        return None
    v = value.replace("Z", "+00:00")
    m = re.match(r"^(.*T\d{2}:\d{2}:\d{2})(\.\d+)?(.*)$", v)
    if m is not None and m.group(2):  # fromisoformat takes at most 6 digits
        v = m.group(1) + m.group(2)[:7] + m.group(3)
    try:
        t = datetime.datetime.fromisoformat(v)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None
