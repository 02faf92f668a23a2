"""A fake spotagent: a real Unix socket server in a thread speaking protocol v1.

Tests drive it explicitly: every received message is recorded, and tests wait
for conditions with deadlines (threading.Condition), never with sleeps.
"""

import json
import os
import socket
import threading
from typing import Any, Callable, Dict, List, Optional

DEADLINE = 10.0  # generous upper bound for any wait in the tests


class FakeAgent(object):
    def __init__(
        self,
        path: str,
        welcome: Optional[Dict[str, Any]] = None,
        read: bool = True,
        join_dir: Optional[str] = None,
        commit: bool = False,
    ) -> None:
        self.path = path
        self.welcome = welcome  # sent in reply to hello; None = send nothing
        self.read = read  # False: accept, send welcome at once, never read
        # Answer join {id, reason, deadline} with checkpoint {id, reason,
        # dir: join_dir/id, deadline}, as the agent does (None: no answer).
        self.join_dir = join_dir
        # Answer done {id, step} with committed {id, uri, step}.
        self.commit = commit
        self.cond = threading.Condition()
        self.received = []  # type: List[Dict[str, Any]]
        self.raw = []  # type: List[bytes]
        self.conns = []  # type: List[socket.socket]
        self.accepted = 0
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
                with self.cond:
                    self.raw.append(line)
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        msg = {"type": "<garbage>", "line": line}
                    self.received.append(msg)
                    self.cond.notify_all()
                reply = None  # type: Optional[Dict[str, Any]]
                if msg.get("type") == "hello" and self.welcome is not None:
                    reply = self.welcome
                elif msg.get("type") == "join" and self.join_dir is not None:
                    if not msg.get("deadline"):
                        # As the real agent (agent_job.go onJoin).
                        reply = {"type": "error", "id": msg.get("id"),
                                 "error": "join: a deadline in the future is required"}
                    else:
                        reply = {"type": "checkpoint", "id": msg["id"], "reason": msg.get("reason"),
                                 "dir": os.path.join(self.join_dir, msg["id"]), "deadline": msg["deadline"]}
                elif msg.get("type") == "done" and self.commit and msg.get("id"):
                    reply = {"type": "committed", "id": msg["id"], "uri": "file:///fake/" + msg["id"],
                             "step": msg.get("step")}
                if reply is not None:
                    try:
                        c.sendall((json.dumps(reply) + "\n").encode())
                    except OSError:
                        return
        except (OSError, ValueError):
            return
