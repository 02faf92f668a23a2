"""The connection to the agent (``Transport``): one thread connects
(retrying with backoff), checks who is at the other end, says ``hello`` and
reads lines; a writer thread per connection drains the outbound queue with
blocking ``sendall`` calls. The training loop only queues, under the agent's
lock, so a slow, stuck or missing agent can never stall training.

A hello the agent refuses for good (``AgentRefused``) ends the connecting.
"""

import json
import os
import socket
import struct
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

from ._common import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    DEFAULT_REFUSED_TIMEOUT,
    ENV_AGENT_UID,
    ENV_ALLOW_UNPROTECTED,
    MAX_LINE,
    MAX_METADATA,
    MAX_OUTBOUND,
    encode_line,
    env_float,
    log,
    shutdown_socket,
    stderr,
)
from ._state import State


class AgentRefused(Exception):
    """The agent refused this trainer for good (a node agent's ``error`` to
    ``hello``: a bad run id, a run that could not start; or a socket owned by
    another uid). Training on would checkpoint nothing, so :func:`connect`
    raises it, or the next ``poll`` when it came later. Opt out with
    ``$SPOTAGENT_ALLOW_UNPROTECTED=1`` or ``connect(allow_unprotected=True)``:
    then a warning on stderr and a no-op agent."""

    def __init__(self, path: str, error: str) -> None:
        super().__init__(
            "spotagent: the agent at %s refused this trainer: %s; nothing would be checkpointed. "
            "Fix the cause, or set %s=1 (connect(allow_unprotected=True)) to train without an agent"
            % (path, error, ENV_ALLOW_UNPROTECTED))
        self.path = path
        self.error = error


def refusal_is_permanent(msg: Mapping[str, Any]) -> bool:
    """Whether an ``error`` answering ``hello`` will be the answer to every
    later hello. A boolean ``permanent`` field says so; without it, the
    agent's wording (pkg/supervisor node.go, server.go): a refusal that says
    it heals ("try again", "busy", "frees once they close", "too many
    connections") is retried; any other (a bad run id, "run could not
    start: ...") is permanent: a restarted pod retries those, not a trainer
    training on unprotected."""
    flag = msg.get("permanent")
    if isinstance(flag, bool):
        return flag
    text = str(msg.get("error") or "").lower()
    return not any(w in text for w in ("try again", "busy", "frees once", "too many connections"))


#: Messages this client sends besides hello. The agent's error about one of
#: them starts with its type ("progress: step ... too large"): one without an
#: id that comes before the welcome is not the hello's refusal.
_NOT_HELLO = ("progress", "done", "saved", "failed", "status", "join", "bye")

#: hello's numbers (pkg/protocol validate.go checks them) and where the client takes them from.
_HELLO_NUMBERS = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "nodes")


def refuses_hello(msg: Mapping[str, Any]) -> bool:
    """Whether an ``error`` without an id, before the welcome, answers the
    hello: not when it names another message this client sends."""
    text = str(msg.get("error") or "")
    return not any(text.startswith(t + ":") for t in _NOT_HELLO)


def expected_agent_uids(env: Mapping[str, str]) -> Optional[Tuple[int, ...]]:
    """The uids an agent may run as: $SPOTAGENT_AGENT_UID when set (spotagent
    run sets it for its trainer), else this process's own uid or root."""
    raw = (env.get(ENV_AGENT_UID) or "").strip()
    if raw:
        try:
            return (int(raw),)
        except ValueError:
            log.warning("spotagent: $%s=%r is not a uid; expecting the agent as this user or root", ENV_AGENT_UID, raw)
    return tuple(sorted({os.getuid(), os.geteuid(), 0}))


def check_peer(sock: socket.socket, uids: Optional[Tuple[int, ...]]) -> Optional[str]:
    """Why the process at the other end of sock is not to be trusted, or
    None. Linux's SO_PEERCRED names the uid that created the listening
    socket; elsewhere nothing is checked."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None or uids is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", raw)
    except (OSError, struct.error) as e:
        return "cannot read its credentials (%s)" % e
    if uid not in uids:
        return "it runs as uid %d, expected %s" % (uid, " or ".join(str(u) for u in uids))
    return None


class Transport(object):
    """The agent's connection. It shares the state's lock and condition:
    every change (connected, a message queued or sent) notifies it.
    ``hello`` makes this trainer's hello, ``dispatch`` takes each message
    read (the Inbox), ``forget`` is called on a permanent refusal."""

    def __init__(
        self,
        state: State,
        hello: Callable[[], Dict[str, Any]],
        dispatch: Callable[[Dict[str, Any]], None],
        forget: Callable[[], None],
        env: Mapping[str, str],
        allow_unprotected: bool,
    ) -> None:
        self._state = state
        self._hello = hello
        self._dispatch = dispatch
        self._forget = forget
        self._lock = state.lock
        self._cond = state.cond
        self._closed = state.closed
        self.conn = 0  # generation of the current connection; 0 = none yet
        self.connected = False
        self.sock = None  # type: Optional[socket.socket]
        # Outbound: a FIFO of (conn, message); conn 0 = any connection.
        # Consecutive progress messages are coalesced into the newest.
        self.outbound = deque()  # type: Deque[Tuple[int, Dict[str, Any]]]
        self.in_flight = False  # the writer is inside sendall
        self.attempted = threading.Event()  # first connection attempt finished
        self.thread = None  # type: Optional[threading.Thread]
        self.writers = []  # type: List[threading.Thread]
        self.agent_uids = expected_agent_uids(env)
        #: Train on without an agent after a permanent refusal (else raise).
        self.allow_unprotected = allow_unprotected
        self.refused_timeout = env_float("SPOTAGENT_REFUSED_TIMEOUT", DEFAULT_REFUSED_TIMEOUT)
        self.refused = False  # refused for good: the agent runs as a no-op
        self.refusal = None  # type: Optional[AgentRefused]  # raised by poll
        self.refused_since = None  # type: Optional[float]  # monotonic: first healable refusal
        self.welcomed_conn = 0  # the connection that got the newest welcome

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="spotagent-conn", daemon=True)
        self.thread.start()

    def join(self, end: float) -> None:
        """Wait (until monotonic end) for the threads to finish."""
        for t in [self.thread] + list(self.writers):
            if t is not None and t is not threading.current_thread():
                t.join(max(0.0, end - time.monotonic()))

    def wake(self) -> None:
        """Unblock the reader after close (the agent set closed)."""
        with self._lock:
            sock = self.sock
        if sock is not None:
            shutdown_socket(sock)

    # ----------------------------------------------------------- outbound

    def send(self, msg: Dict[str, Any], conn: Optional[int]) -> bool:
        """Queue msg. ``conn`` ties it to one connection (answers to a
        request); None means "whichever connection is next". False when
        its connection is gone (dropped, with a warning)."""
        line = encode_line(msg)  # raises now, in the caller, for bad metadata
        if "metadata" in msg and len(encode_line(msg["metadata"])) - 1 > MAX_METADATA:
            raise ValueError("spotagent: metadata exceeds %d bytes of JSON; keep it small, put data in files" % MAX_METADATA)
        if len(line) > MAX_LINE:
            raise ValueError("spotagent: message of %d bytes exceeds the %d-byte line limit" % (len(line), MAX_LINE))
        with self._lock:
            if conn is not None and (conn != self.conn or not self.connected):
                log.warning("spotagent: %s for checkpoint %s dropped: its connection was lost", msg["type"], msg.get("id"))
                return False
            if len(self.outbound) >= MAX_OUTBOUND:
                dropped = self.outbound.popleft()
                log.warning("spotagent: agent not reading; dropped queued %s", dropped[1].get("type"))
            self.outbound.append((conn or 0, msg))
            self._cond.notify_all()
        return True

    def queue_progress(self, step: int) -> None:
        # lock held
        item = (0, {"type": "progress", "step": step})  # type: Tuple[int, Dict[str, Any]]
        if self.outbound and self.outbound[-1][1].get("type") == "progress":
            self.outbound[-1] = item
        else:
            self.outbound.append(item)
        self._cond.notify_all()

    def flush(self, end: float) -> None:
        """Wait (until monotonic end) while queued messages are sent."""
        with self._lock:
            while self.connected and (self.outbound or self.in_flight):
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)

    # ------------------------------------------------------------ refusal

    def raise_refusal(self) -> None:
        """Raise the agent's permanent refusal (every call once it came)."""
        with self._lock:
            err = self.refusal
        if err is not None:
            raise err

    def refuse(self, why: str) -> None:
        """The agent refused this trainer for good: stop connecting; raise
        from connect() or the next poll, or with allow_unprotected run on
        as a no-op agent."""
        state = self._state
        with self._lock:
            if self.refused:
                return  # the first refusal stands (and names the agent)
        path = state.path
        # Said before the state changes: connect() returns (or raises) then.
        if self.allow_unprotected:
            stderr("spotagent: WARNING: the agent at %s refused this trainer: %s; running WITHOUT an agent "
                   "(%s): nothing will be checkpointed" % (path, why, ENV_ALLOW_UNPROTECTED))
        else:
            stderr("spotagent: ERROR: the agent at %s refused this trainer: %s" % (path, why))
        self._forget()
        with self._lock:
            state.path = None
            self.refused = True
            self._closed.set()
            sock = self.sock
            if not self.allow_unprotected:
                self.refusal = AgentRefused(str(path), why)
            self._cond.notify_all()
        if sock is not None:
            shutdown_socket(sock)

    def hello_refused(self, msg: Mapping[str, Any]) -> None:
        """An ``error`` before this connection's welcome: the agent refused
        its hello. Permanent ones stop the client (see refusal_is_permanent);
        others are retried, at most ``refused_timeout`` seconds in all."""
        why = str(msg.get("error") or "refused")
        if refusal_is_permanent(msg):
            if why.startswith("hello: ") and any(" %s " % k in why for k in _HELLO_NUMBERS):
                why += self._numbers_hint()
            self.refuse(why)
            return
        now = time.monotonic()
        with self._lock:
            first = self.refused_since is None
            if first:
                self.refused_since = now
            lasting = now - (self.refused_since or now)
            sock = self.sock
        if lasting >= self.refused_timeout:
            self.refuse("%s (still refused after %.0fs)" % (why, lasting))
            return
        if first:
            stderr("spotagent: WARNING: the agent at %s refused this trainer (%s); retrying for up to %.0fs"
                   % (self._state.path, why, self.refused_timeout))
        log.warning("spotagent: hello refused (%s); reconnecting", why)
        if sock is not None:
            shutdown_socket(sock)  # the agent closes it too; reconnect with backoff

    def _numbers_hint(self) -> str:
        """Where the hello's numbers came from, for a refusal that names one."""
        try:
            hello = self._hello()
        except Exception:  # only a hint: never let it hide the refusal
            return ""
        said = " ".join("%s=%s" % (k, hello[k]) for k in _HELLO_NUMBERS if k in hello)
        return (" (this trainer's hello said %s: from connect()'s rank/world_size, the process group, or the "
                "environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK/NODE_RANK, "
                "GROUP_WORLD_SIZE/NNODES)" % (said or "none of rank, world_size"))

    def welcomed(self) -> None:
        """A welcome on the current connection (lock held)."""
        self.welcomed_conn = self.conn
        self.refused_since = None

    def before_welcome(self) -> bool:
        with self._lock:
            return self.welcomed_conn != self.conn

    # ------------------------------------------------------------ threads

    def _run(self) -> None:
        backoff = BACKOFF_MIN
        warned = False
        while not self._closed.is_set():
            path = self._state.path
            if not path:
                break
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
            except OSError as e:
                sock.close()
                if not warned:
                    log.warning("spotagent: cannot connect to %s (%s); retrying in the background", path, e)
                    warned = True
                else:
                    log.debug("spotagent: connect %s: %s", path, e)
                self.attempted.set()
                self._closed.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            if warned:
                log.info("spotagent: connected to %s", path)
            warned = False
            backoff = BACKOFF_MIN
            self._serve(sock)
            self.attempted.set()
            if not self._closed.is_set():
                log.warning("spotagent: connection to %s lost; reconnecting", path)
                self._closed.wait(backoff)
        # closed: wake any waiters
        with self._lock:
            self._cond.notify_all()

    def _serve(self, sock: socket.socket) -> None:
        why = check_peer(sock, self.agent_uids)
        if why:
            # Someone else's socket: it could choose where the trainer
            # resumes from (and so what it unpickles) and stop the run.
            sock.close()
            self.refuse("refusing the agent: %s" % why)
            return
        hello = self._hello()
        with self._lock:
            if self._closed.is_set():
                sock.close()
                return
            self.conn += 1
            conn = self.conn
            self.connected = True
            self.sock = sock
            # hello goes first on every connection; the last step seen goes
            # with it so the agent learns where training is at once.
            last = self._state.last_step
            if last is not None:
                self.outbound.appendleft((conn, {"type": "progress", "step": last}))
            self.outbound.appendleft((conn, hello))
            self._cond.notify_all()
        writer = threading.Thread(target=self._write_loop, args=(sock, conn), name="spotagent-writer", daemon=True)
        self.writers = [w for w in self.writers if w.is_alive()] + [writer]
        writer.start()
        self.attempted.set()
        try:
            self._read_loop(sock)
        finally:
            with self._lock:
                self.connected = False
                self.sock = None
                # Answers tied to this connection are meaningless on the next.
                self.outbound = deque(m for m in self.outbound if m[0] == 0)
                self._cond.notify_all()
            self._state.connection_lost(conn)
            shutdown_socket(sock)
            writer.join(1.0)
            sock.close()

    def _read_loop(self, sock: socket.socket) -> None:
        buf = b""
        skipping = False  # inside an over-long line
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError as e:
                if not self._closed.is_set():
                    log.debug("spotagent: read: %s", e)
                return
            if not chunk:
                return
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    if len(buf) >= MAX_LINE:
                        if not skipping:
                            log.warning("spotagent: line from agent longer than %d bytes ignored", MAX_LINE)
                        skipping = True
                        buf = b""
                    break
                line, buf = buf[:nl], buf[nl + 1 :]
                if skipping:
                    skipping = False
                    continue
                self._handle_line(line)

    def _write_loop(self, sock: socket.socket, conn: int) -> None:
        while True:
            with self._lock:
                while True:
                    if self._closed.is_set() or self.conn != conn or not self.connected:
                        return
                    item = None  # type: Optional[Dict[str, Any]]
                    if self.outbound:
                        c, item = self.outbound.popleft()
                        if c not in (0, conn):
                            continue
                    if item is not None:
                        break
                    self._cond.wait()
                self.in_flight = True
            try:
                sock.sendall(encode_line(item))
                ok = True
            except OSError as e:
                log.debug("spotagent: write: %s", e)
                ok = False
            with self._lock:
                self.in_flight = False
                self._cond.notify_all()  # close() waits for the queue to drain
            if not ok:
                shutdown_socket(sock)  # let the reader notice and reconnect
                return

    def _handle_line(self, raw: bytes) -> None:
        raw = raw.strip()
        if not raw:
            return
        try:
            msg = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("spotagent: malformed line from agent ignored (%s): %.200r", e, raw)
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            log.warning("spotagent: message without a type ignored: %.200r", raw)
            return
        try:
            self._dispatch(msg)
        except (TypeError, ValueError, AttributeError) as e:
            log.warning("spotagent: bad %s message ignored (%s): %.200r", msg.get("type"), e, raw)
