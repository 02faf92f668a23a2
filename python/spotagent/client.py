"""Trainer-side client for the spotagent protocol v1.

One JSON object per line over a Unix stream socket (see docs/protocol.md and
pkg/supervisor/protocol.go). Everything that touches the socket runs on
background threads: the training loop only ever takes a lock for a moment, so
a slow, stuck or missing agent can never stall training.

Threads per agent:
  * the connection thread connects (retrying with backoff), sends ``hello``
    and reads lines, dispatching them into the agent's state;
  * a writer thread per connection drains the outbound queue with blocking
    ``sendall`` calls.
"""

import atexit
import datetime
import json
import logging
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

from . import dist as _dist

__all__ = [
    "Agent",
    "AgentRefused",
    "CheckpointRequest",
    "Committed",
    "UploadFailed",
    "connect",
    "parse_time",
    "EXIT_INTERRUPTED",
    "MAX_LINE",
    "MAX_METADATA",
    "PROTOCOL_VERSION",
]

log = logging.getLogger("spotagent")

#: Longest line either side accepts, newline included (supervisor.MaxLine).
MAX_LINE = 1 << 20
#: Largest ``done`` metadata the agent accepts (encoded JSON bytes).
MAX_METADATA = 64 << 10
#: Protocol version this client speaks.
PROTOCOL_VERSION = 1
#: Exit code meaning "interrupted: the checkpoint is committed (or a best
#: effort was made), run me again" (EX_TEMPFAIL). ``agent.exit_code`` is this
#: after a stop for an interruption or shutdown; ``spotagent run`` exits with
#: it too, and orchestrators restart on it (a Kubernetes Job's
#: podFailurePolicy ignores it, systemd's Restart=on-failure restarts).
EXIT_INTERRUPTED = 75

ENV_SOCKET = "SPOTAGENT_SOCKET"
ENV_RUN_ID = "SPOTAGENT_RUN_ID"
ENV_CHECKPOINT_DIR = "SPOTAGENT_CHECKPOINT_DIR"
ENV_RESUME_DIR = "SPOTAGENT_RESUME_DIR"
ENV_RESUME_STEP = "SPOTAGENT_RESUME_STEP"
ENV_RESUME_MANIFEST = "SPOTAGENT_RESUME_MANIFEST"
#: The uid the agent runs as; set by ``spotagent run`` for its trainer. When
#: absent the client accepts an agent running as itself or as root.
ENV_AGENT_UID = "SPOTAGENT_AGENT_UID"
#: Set to 1 to train on, without an agent, after the agent refused this
#: trainer for good (connect(allow_unprotected=True) does the same).
ENV_ALLOW_UNPROTECTED = "SPOTAGENT_ALLOW_UNPROTECTED"

# Outbound messages kept while the agent is not reading (progress is
# coalesced, so these are done/failed messages). Beyond this, the oldest are
# dropped with a warning rather than growing without bound.
_MAX_OUTBOUND = 1024
_BACKOFF_MIN = 0.1
_BACKOFF_MAX = 2.0
#: Polls between two agreements of a torch.distributed job's ranks (see
#: dist.py and README "Distributed jobs"); $SPOTAGENT_SYNC_EVERY overrides.
DEFAULT_SYNC_EVERY = 1
#: Longest wait in poll for the agent's answer to a join ($SPOTAGENT_JOIN_TIMEOUT).
DEFAULT_JOIN_TIMEOUT = 10.0
#: Seconds between a SIGTERM and the end of the trainer's grace
#: ($SPOTAGENT_SIGTERM_GRACE): the agent's own --term-grace default, i.e.
#: Kubernetes' default terminationGracePeriodSeconds (30 s) less the 5 s
#: the agent keeps to stop its trainer.
DEFAULT_SIGTERM_GRACE = 25.0
#: Kept before the end of the grace for the upload (the agent's --margin).
SIGTERM_MARGIN = 5.0


#: Seconds a refusal the agent says heals ("busy", "try again") may last
#: before it counts as permanent ($SPOTAGENT_REFUSED_TIMEOUT).
DEFAULT_REFUSED_TIMEOUT = 120.0


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


class UploadFailed(Exception):
    """The agent reported ``upload_failed`` for a checkpoint."""

    def __init__(self, id: str, error: str) -> None:
        super().__init__("checkpoint %s: upload failed: %s" % (id, error))
        self.id = id
        self.error = error


class Committed(object):
    """A checkpoint the agent committed to the store (a ``committed`` message)."""

    __slots__ = ("id", "uri", "step")

    def __init__(self, id: str, uri: str, step: Optional[int]) -> None:
        self.id = id
        self.uri = uri
        #: The step this client reported in ``done`` for this id (None if the
        #: checkpoint was answered by another process or connection).
        self.step = step

    def __repr__(self) -> str:
        return "Committed(id=%r, uri=%r, step=%r)" % (self.id, self.uri, self.step)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Committed) and (self.id, self.uri, self.step) == (
            other.id,
            other.uri,
            other.step,
        )


class CheckpointRequest(object):
    """The agent asks for a checkpoint: write files into ``dir``, then call
    ``done(step, metadata)`` (or ``fail(error)``)."""

    def __init__(
        self,
        agent: "Agent",
        conn: int,
        id: str,
        dir: str,
        reason: str,
        deadline: Optional[datetime.datetime],
    ) -> None:
        self._agent = agent
        self._conn = conn
        self._answered = False
        #: Checkpoint id chosen by the agent; echo it in done/failed.
        self.id = id
        #: Directory to write the checkpoint files into (created if missing).
        self.dir = dir
        #: periodic | interruption | shutdown | manual
        self.reason = reason
        #: When the agent stops waiting (timezone-aware UTC), or None.
        self.deadline = deadline
        #: time.time() when the request arrived.
        self.received = time.time()
        # Background writes (write_async, spotagent.torch.save): threads
        # still writing, their errors, and the seconds the caller was blocked.
        self._writes = []  # type: List[threading.Thread]
        self._unstarted = []  # type: List[threading.Thread]
        self._write_errors = []  # type: List[str]
        self._saved_names = set()  # type: set
        self._running = 0
        self._blocked = 0.0
        self._finished = threading.Event()  # done/failed queued (or never to be)
        self._step_hint = None  # type: Optional[int]  # the step poll() was at
        self._seq = 0  # arrival order among the agent's messages
        # Called after done() (distributed SIGTERM checkpoint: wait for the
        # commit, then ask the job to stop).
        self._after_done = None  # type: Optional[Callable[[int], None]]
        if dir:
            try:
                os.makedirs(dir, exist_ok=True)
            except OSError as e:
                log.warning("spotagent: cannot create checkpoint dir %s: %s", dir, e)

    def time_left(self) -> Optional[float]:
        """Seconds until the deadline (negative once passed), or None."""
        if self.deadline is None:
            return None
        now = datetime.datetime.now(datetime.timezone.utc)
        return (self.deadline - now).total_seconds()

    @property
    def answered(self) -> bool:
        return self._answered

    def done(self, step: int, metadata: Optional[Mapping[str, Any]] = None) -> None:
        """Report that every file of the checkpoint is written (and fsynced).

        ``step`` is what a resumed run gets back as ``resume_step``: report the
        number of completed steps, i.e. the step to continue from.
        ``metadata`` must be a JSON-serialisable mapping; it is stored in the
        manifest and returned as ``resume_metadata``.

        With background writes (:meth:`write_async`, ``spotagent.torch.save``)
        in flight, ``done`` returns at once: ``done`` goes to the agent when
        the last file is written and fsynced (``failed`` if one could not be),
        with ``blocked_ms``, the time training was blocked by this checkpoint.
        """
        msg = {"type": "done", "id": self.id, "step": int(step), "metadata": _meta(metadata)}
        if not self._claim("done"):
            return
        with self._agent._lock:
            background = bool(self._writes)
        if not background:
            self._agent._send(msg, conn=self._conn, step=int(step))
            self._finished.set()
        else:
            msg["blocked_ms"] = int(round(self._blocked * 1000))
            # _finish starts the writers: started here, each start() would wait for the GIL that a running writer holds.
            t = threading.Thread(target=self._finish, args=(msg,), name="spotagent-done", daemon=True)
            t.start()
        if self._after_done is not None:
            self._after_done(int(step))

    def _finish(self, msg: Dict[str, Any]) -> None:
        try:
            self._join_writes()
            errors = list(self._write_errors)
            if not errors:
                try:
                    _fsync_dir(self.dir)
                except OSError as e:
                    errors.append("fsync %s: %s" % (self.dir, e))
            if errors:
                log.warning("spotagent: checkpoint %s not saved: %s", self.id, "; ".join(errors))
                self._agent._send({"type": "failed", "id": self.id, "error": "; ".join(errors)}, conn=self._conn)
            else:
                self._agent._send(msg, conn=self._conn, step=msg["step"])
        finally:
            self._finished.set()
            with self._agent._lock:
                self._agent._cond.notify_all()

    def saved(self, name: str) -> None:
        """Tell the agent that the file ``name`` (relative to ``dir``, or an
        absolute path inside it) is complete, fsynced, and will not change:
        the agent uploads it at once instead of at ``done``. Optional; a
        file changed after ``saved`` is uploaded again at ``done``."""
        if not self.id or self._finished.is_set():
            return
        msg = {"type": "saved", "id": self.id, "path": str(name)}  # type: Dict[str, Any]
        if self._step_hint is not None:
            msg["step"] = self._step_hint
        self._agent._send(msg, conn=self._conn)

    def write_async(self, name: str, write: Callable[[Any], None]) -> None:
        """Write the file ``name`` (relative to ``dir``) in a background
        thread: ``write(f)`` gets the open binary file; it is then flushed,
        fsynced and reported ``saved``. Files of one request are written in
        parallel, one thread each, started once the caller is done staging:
        at :meth:`done`, the next ``poll``, or a wait. Call :meth:`done` once
        every file is submitted. ``write`` must only read data nobody changes meanwhile:
        stage a copy first (``spotagent.torch.save`` does).

        Waits first, in the caller, while an *earlier* request's background
        writes are still running: a trainer never holds more than one
        staged copy beyond what it is writing."""
        if self._answered:
            raise RuntimeError("spotagent: checkpoint %s already answered; write_async(%r) refused" % (self.id, name))
        rel = os.path.normpath(str(name))
        if os.path.isabs(rel) or rel.startswith(".."):
            raise ValueError("spotagent: %r is not a path inside the checkpoint directory" % (name,))
        t0 = time.monotonic()
        self._agent._await_background(self)
        with self._agent._lock:
            if rel in self._saved_names:
                raise ValueError("spotagent: %s written twice for checkpoint %s" % (rel, self.id))
            self._saved_names.add(rel)
            self._running += 1
        self._blocked += time.monotonic() - t0
        t = threading.Thread(target=self._write, args=(rel, write), name="spotagent-write", daemon=True)
        with self._agent._lock:
            self._writes.append(t)
            self._unstarted.append(t)

    def _start_writes(self) -> None:
        """Start the queued writers. They wait until the caller is done
        staging (its done(), its next poll(), or a wait): started at once,
        a writer's CPU and disk would slow the staging of the next file,
        which is the part training waits for."""
        with self._agent._lock:
            ts, self._unstarted = self._unstarted, []
        for t in ts:
            t.start()

    def _write(self, rel: str, write: Callable[[Any], None]) -> None:
        path = os.path.join(self.dir, rel)
        try:
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            with open(path, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            self.saved(rel)
        except Exception as e:  # reported as failed at done
            log.warning("spotagent: writing %s for checkpoint %s failed: %s", path, self.id, e)
            with self._agent._lock:
                self._write_errors.append("%s: %s" % (rel, e))
        finally:
            with self._agent._lock:
                self._running -= 1
                self._agent._cond.notify_all()

    def _join_writes(self, timeout: Optional[float] = None) -> bool:
        self._start_writes()
        end = None if timeout is None else time.monotonic() + timeout
        with self._agent._lock:
            while self._running > 0:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._agent._cond.wait(left)
        return True

    @property
    def writing(self) -> bool:
        """True while background writes of this request are running."""
        with self._agent._lock:
            return self._running > 0

    @property
    def blocked(self) -> float:
        """Seconds the caller was blocked by this request's background saves
        (staging, and waiting for an earlier request's writes)."""
        return self._blocked

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until the background writes are finished and ``done`` (or
        ``failed``) is queued for the agent; True if so within ``timeout``."""
        if not self._join_writes(timeout):
            return False
        if self._answered:
            return self._finished.wait(timeout)
        return True

    def fail(self, error: str) -> None:
        """Report that this checkpoint could not be written."""
        if self._claim("fail"):
            self._agent._send({"type": "failed", "id": self.id, "error": str(error)}, conn=self._conn)
            self._finished.set()

    def _claim(self, what: str) -> bool:
        if self._answered:
            log.warning("spotagent: checkpoint %s already answered; %s() ignored", self.id, what)
            return False
        self._answered = True
        return True

    def __repr__(self) -> str:
        return "CheckpointRequest(id=%r, reason=%r, dir=%r, deadline=%r)" % (
            self.id,
            self.reason,
            self.dir,
            self.deadline,
        )


class _SigtermRequest(CheckpointRequest):
    """The checkpoint a trainer takes because it got SIGTERM (a Kubernetes
    pod deletion reaches the trainer container before its sidecar). ``done``
    reports it as an unsolicited checkpoint, waits until the agent has
    committed it (at most ``wait`` seconds), then sets ``should_stop``."""

    def __init__(self, agent: "Agent", dir: str, wait: float, deadline: Optional[datetime.datetime]) -> None:
        CheckpointRequest.__init__(self, agent, -1, id="", dir=dir, reason="shutdown", deadline=deadline)
        self._wait = wait

    def done(self, step: int, metadata: Optional[Mapping[str, Any]] = None) -> None:
        if not self._claim("done"):
            return
        agent = self._agent
        self._join_writes()  # background writes: the files must be complete
        self._finished.set()
        if self._write_errors:
            self._answered = False
            self.fail("; ".join(self._write_errors))
            return
        with agent._lock:
            before = set(agent._committed)
        agent.checkpoint_done(step, self.dir, metadata)
        end = time.monotonic() + self._wait
        with agent._lock:
            while True:
                new = [c for k, c in agent._committed.items() if k not in before and c.step == int(step)]
                left = end - time.monotonic()
                if new or left <= 0 or agent._closed.is_set():
                    break
                agent._cond.wait(left)
            if not new:
                log.warning("spotagent: SIGTERM checkpoint at step %d not confirmed within %.0fs", step, self._wait)
            agent._should_stop = True
            agent._stop_reason = "shutdown"
            agent._cond.notify_all()

    def fail(self, error: str) -> None:
        if self._claim("fail"):
            with self._agent._lock:
                self._agent._should_stop = True
                self._agent._stop_reason = "shutdown"


class Agent(object):
    """A connection to the local spotagent, or a no-op stand-in.

    Create it with :func:`connect`. All public methods are safe to call from
    the training loop: none of them waits on the agent except
    :meth:`wait_committed` and :meth:`close` (both bounded).
    """

    def __init__(
        self,
        path: Optional[str],
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        run_id: Optional[str] = None,
        progress_interval: float = 1.0,
        env: Optional[Mapping[str, str]] = None,
        process_group: Any = None,
        sync_every: Optional[int] = None,
        allow_unprotected: Optional[bool] = None,
    ) -> None:
        env = os.environ if env is None else env
        if allow_unprotected is None:
            allow_unprotected = (env.get(ENV_ALLOW_UNPROTECTED) or "").strip().lower() in ("1", "true", "yes")
        #: Train on without an agent after a permanent refusal (else raise).
        self.allow_unprotected = bool(allow_unprotected)
        self.refused_timeout = _env_float("SPOTAGENT_REFUSED_TIMEOUT", DEFAULT_REFUSED_TIMEOUT)
        self._refusal = None  # type: Optional[AgentRefused]  # raised by poll
        self._refused_since = None  # type: Optional[float]  # monotonic: first healable refusal
        self._welcomed_conn = 0  # the connection that got the newest welcome
        self.path = path
        self.rank = rank
        self.world_size = world_size
        # torchrun's view of the node, sent in hello when known.
        self.local_rank = _env_int("LOCAL_RANK", env)
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE", env)
        self.node_rank = _first_int(env, "GROUP_RANK", "NODE_RANK")
        self.nodes = _first_int(env, "GROUP_WORLD_SIZE", "NNODES")
        if sync_every is None:
            sync_every = _env_int("SPOTAGENT_SYNC_EVERY", env)
            if sync_every is None:
                sync_every = DEFAULT_SYNC_EVERY
        # The agreement between the ranks of a torch.distributed job: off
        # (exactly the single-trainer behaviour) until poll sees an
        # initialised process group of more than one rank.
        self._sync = _dist.Sync(process_group, sync_every)
        self.join_timeout = _env_float("SPOTAGENT_JOIN_TIMEOUT", DEFAULT_JOIN_TIMEOUT)
        self._agreed_stop = False  # should_stop once the agreement is on
        self._agreed_stop_reason = None  # type: Optional[str]
        self._sigterm_id = None  # type: Optional[str]  # a SIGTERM checkpoint offered to the job
        self._agreed_ids = OrderedDict()  # type: OrderedDict[str, int]  # id -> step agreed at
        self._issued = OrderedDict()  # type: OrderedDict[str, CheckpointRequest]  # returned by poll
        self._errors = OrderedDict()  # type: OrderedDict[str, str]  # error {id} from the agent
        self._seq = 0
        self._warned_join = False
        self.progress_interval = progress_interval
        # Sent in hello: a node agent (one per machine) picks the run's
        # store from it; an agent that wraps the trainer ignores it.
        self._hello_run_id = run_id or env.get(ENV_RUN_ID) or None

        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)  # state changes (welcome, committed, ...)
        self._closed = threading.Event()

        # Fallbacks from the environment, used until a welcome arrives.
        self._env_run_id = run_id or env.get(ENV_RUN_ID) or None
        self._env_checkpoint_dir = env.get(ENV_CHECKPOINT_DIR) or None
        self._env_resume = _resume_from_env(env)

        self._welcome = None  # type: Optional[Dict[str, Any]]
        self._resume_from_welcome = None  # type: Optional[Tuple[Optional[str], Optional[int], Optional[Dict[str, Any]]]]
        self._should_stop = False
        self._sigterm = False  # set by the SIGTERM handler, see handle_sigterm
        self._sigterm_at = None  # type: Optional[float]  # time.time() of that SIGTERM
        self._sigterm_handled = False
        self._sigterm_deadline = None  # type: Optional[datetime.datetime]  # of the offered checkpoint
        self.sigterm_wait = _env_float("SPOTAGENT_SIGTERM_WAIT", 60.0)
        self.sigterm_grace = _env_float("SPOTAGENT_SIGTERM_GRACE", DEFAULT_SIGTERM_GRACE)
        # The newest interruption/shutdown request from the agent: a SIGTERM
        # that comes while it runs is folded into it (no second checkpoint).
        self._urgent = None  # type: Optional[CheckpointRequest]
        self._fold_until = None  # type: Optional[float]  # monotonic; see _fold_sigterm
        self._agent_uids = _expected_agent_uids(env)
        self._refused = False  # refused for good: runs as a no-op (see _refuse)
        self._stop_reason = None  # type: Optional[str]
        self._stop_deadline = None  # type: Optional[datetime.datetime]

        self._requests = deque()  # type: Deque[CheckpointRequest]
        # The newest request with background writes (write_async): a later
        # request's first write waits for it, so at most one staged copy.
        self._background = None  # type: Optional[CheckpointRequest]
        self._committed = OrderedDict()  # type: OrderedDict[str, Committed]
        self._failed_uploads = OrderedDict()  # type: OrderedDict[str, str]
        self._last_committed = None  # type: Optional[Committed]
        self._done_steps = OrderedDict()  # type: OrderedDict[str, int]

        # Outbound: a FIFO of (conn, message); conn 0 = any connection.
        # Consecutive progress messages are coalesced into the newest.
        self._outbound = deque()  # type: Deque[Tuple[int, Dict[str, Any]]]
        self._last_progress_at = None  # type: Optional[float]
        self._last_step = None  # type: Optional[int]
        self._in_flight = False  # the writer is inside sendall

        self._conn = 0  # generation of the current connection; 0 = none yet
        self._connected = False
        self._sock = None  # type: Optional[socket.socket]
        self._attempted = threading.Event()  # first connection attempt finished
        self._welcomed = threading.Event()
        self._thread = None  # type: Optional[threading.Thread]
        self._writers = []  # type: List[threading.Thread]

        if path:
            self._thread = threading.Thread(target=self._run, name="spotagent-conn", daemon=True)
            self._thread.start()
            with _live_lock:
                _live.add(self)

    # ------------------------------------------------------------------ API

    @property
    def enabled(self) -> bool:
        """False for the no-op agent (no SPOTAGENT_SOCKET)."""
        return bool(self.path)

    @property
    def connected(self) -> bool:
        with self._lock:
            return self._connected

    @property
    def run_id(self) -> Optional[str]:
        with self._lock:
            if self._welcome is not None and self._welcome.get("run_id"):
                return str(self._welcome["run_id"])
        return self._env_run_id

    @property
    def checkpoint_dir(self) -> Optional[str]:
        with self._lock:
            if self._welcome is not None and self._welcome.get("checkpoint_dir"):
                return str(self._welcome["checkpoint_dir"])
        return self._env_checkpoint_dir

    def _resume(self) -> Tuple[Optional[str], Optional[int], Optional[Dict[str, Any]]]:
        with self._lock:
            if self._resume_from_welcome is not None:
                return self._resume_from_welcome
        return self._env_resume

    @property
    def resume_dir(self) -> Optional[str]:
        """Directory of the restored checkpoint, or None for a fresh start."""
        return self._resume()[0]

    @property
    def resume_step(self) -> Optional[int]:
        """The step reported in ``done`` for the restored checkpoint, or None."""
        return self._resume()[1]

    @property
    def resume_metadata(self) -> Optional[Dict[str, Any]]:
        """The metadata reported in ``done`` for the restored checkpoint, or None."""
        return self._resume()[2]

    @property
    def should_stop(self) -> bool:
        """True once the agent sent ``stop``: finish any checkpoint, then exit.

        In a torch.distributed job it changes only at an agreement in
        ``poll``, on every rank at the same call: a rank stops when any rank's
        agent said ``stop`` (or SIGTERM stopped it), never on its own."""
        if self._sync.active:
            with self._lock:
                return self._agreed_stop
        return self._local_stop()

    def _local_stop(self) -> bool:
        """This process's own stop: the agent's ``stop``, or SIGTERM."""
        with self._lock:
            if not self._should_stop and self._fold_until is not None and time.monotonic() >= self._fold_until:
                # A folded SIGTERM whose interruption never ended in a stop
                # (the agent went away, or the notice was withdrawn).
                log.warning("spotagent: no stop after SIGTERM and the interruption checkpoint: stopping")
                self._should_stop = True
                self._stop_reason = "shutdown"
            return self._should_stop

    @property
    def exit_code(self) -> int:
        """What the trainer should exit with: :data:`EXIT_INTERRUPTED` (75)
        once it was stopped for an interruption or a shutdown (``stop`` from
        the agent, or SIGTERM), so that the orchestrator runs it again and it
        resumes; 0 otherwise. End the training script with
        ``sys.exit(agent.exit_code)``."""
        if self.should_stop and self.stop_reason in ("interruption", "shutdown"):
            return EXIT_INTERRUPTED
        return 0

    @property
    def stop_reason(self) -> Optional[str]:
        with self._lock:
            if self._sync.active:
                return self._agreed_stop_reason
            return self._stop_reason

    @property
    def stop_deadline(self) -> Optional[datetime.datetime]:
        with self._lock:
            return self._stop_deadline

    @property
    def last_committed(self) -> Optional[Committed]:
        """The newest ``committed`` message received, or None."""
        with self._lock:
            return self._last_committed

    def handle_sigterm(self) -> bool:
        """Turn SIGTERM into a final checkpoint: the next ``poll`` returns a
        request with reason ``shutdown``; its ``done`` waits until the agent
        has committed it, then ``should_stop`` is set. Use it where the
        trainer, not the agent, gets SIGTERM first: a Kubernetes sidecar or
        node agent. (Under ``spotagent run`` the agent gets the signal and asks
        for the checkpoint itself.) Only from the main thread; returns False
        when the handler could not be installed."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("spotagent: handle_sigterm() must be called from the main thread")
            return False

        def on_sigterm(signum: int, frame: Any) -> None:
            if not self._sigterm:
                self._sigterm_at = time.time()
            self._sigterm = True

        signal.signal(signal.SIGTERM, on_sigterm)
        return True

    def _fold_sigterm(self) -> bool:
        """A SIGTERM while the agent's interruption (or shutdown) checkpoint
        is in flight or committed -- a node drain on the same spot notice --
        joins that stop sequence instead of asking for a second checkpoint:
        the agent sends ``stop`` once it commits (or at its deadline). If no
        stop comes by the request's deadline (plus a little), stop anyway."""
        with self._lock:
            if self._should_stop:
                return True
            urgent = self._urgent
            if urgent is None:
                return False
            left = urgent.time_left()
            wait = self.sigterm_wait if left is None else min(max(left, 0.0) + 5.0, self.sigterm_wait)
            self._fold_until = time.monotonic() + wait
        log.info("spotagent: SIGTERM during the %s checkpoint %s: no second checkpoint, stopping with it",
                 urgent.reason, urgent.id)
        return True

    def _sigterm_request(self, step: Optional[int]) -> Optional[CheckpointRequest]:
        log.info("spotagent: SIGTERM: taking a final checkpoint")
        ckdir = self.checkpoint_dir
        if not self.path or not ckdir or step is None:
            with self._lock:
                self._should_stop = True
                self._stop_reason = "shutdown"
            return None
        d = os.path.join(ckdir, "sigterm-%d-%d" % (int(step), os.getpid()))
        return _SigtermRequest(self, d, self.sigterm_wait, self._shutdown_deadline())

    def _shutdown_deadline(self) -> datetime.datetime:
        """The deadline of a checkpoint this process asks for on SIGTERM,
        computed as the agent computes its own on SIGTERM (agent_notice.go
        beginStop): the grace (``sigterm_grace``, 25 s) from the signal,
        less a margin for the upload, but at least half the grace. A stop
        deadline the agent already sent is kept if it is earlier."""
        at = self._sigterm_at if self._sigterm_at is not None else time.time()
        grace = max(self.sigterm_grace, 0.0)
        left = max(grace - SIGTERM_MARGIN, grace / 2)
        deadline = datetime.datetime.fromtimestamp(at, datetime.timezone.utc) + datetime.timedelta(seconds=left)
        now = _utcnow()
        if deadline <= now:
            # The signal was handled late (a long step): best effort, as
            # the agent does with a notice seen late (LateNoticeGrace).
            deadline = now + datetime.timedelta(seconds=min(10.0, max(grace / 2, 1.0)))
        with self._lock:
            told = self._stop_deadline
        if told is not None and now < told < deadline:
            deadline = told
        return deadline

    def poll(self, step: Optional[int] = None) -> Optional[CheckpointRequest]:
        """Never blocks. Reports progress (at most every ``progress_interval``
        seconds) and returns the oldest pending checkpoint request, or None.

        In a torch.distributed job (an initialised process group of more than
        one rank, see dist.py) every rank must call poll once per step: every
        ``sync_every``-th call runs one small all_reduce that agrees on the
        job's request, and poll returns it on every rank at that same call
        (or None on a rank whose agent cannot take part). A rank whose own
        agent did not ask sends ``join`` and waits for the agent's answer
        (at most ``join_timeout`` seconds, never past the deadline)."""
        self._raise_refusal()
        if self._sync.active or self._sync.detect():
            return self._poll_job(step)
        if self._sigterm and not self._sigterm_handled:
            self._sigterm_handled = True
            if not self._fold_sigterm():
                return self._sigterm_request(step)
        bg = self._background
        if bg is not None and bg._unstarted:
            bg._start_writes()
        if not self.path:
            return None
        with self._lock:
            self._report_progress(step)
            while self._requests:
                req = self._requests.popleft()
                if req._conn == self._conn and self._connected:
                    return self._hand_out(req)
                log.info("spotagent: dropping checkpoint %s: its connection was lost", req.id)
        return None

    def _raise_refusal(self) -> None:
        """Raise the agent's permanent refusal (every call once it came)."""
        with self._lock:
            err = self._refusal
        if err is not None:
            raise err

    def _refuse(self, why: str) -> None:
        """The agent refused this trainer for good: stop connecting; raise
        from connect() or the next poll, or with allow_unprotected run on
        as a no-op agent."""
        path = self.path
        # Said before the state changes: connect() returns (or raises) then.
        if self.allow_unprotected:
            _stderr("spotagent: WARNING: the agent at %s refused this trainer: %s; running WITHOUT an agent "
                    "(%s): nothing will be checkpointed" % (path, why, ENV_ALLOW_UNPROTECTED))
        else:
            _stderr("spotagent: ERROR: the agent at %s refused this trainer: %s" % (path, why))
        with _live_lock:
            _live.discard(self)
        with self._lock:
            self.path = None
            self._refused = True
            self._closed.set()
            sock = self._sock
            if not self.allow_unprotected:
                self._refusal = AgentRefused(str(path), why)
            self._cond.notify_all()
        if sock is not None:
            _shutdown(sock)

    def _hello_refused(self, msg: Mapping[str, Any]) -> None:
        """An ``error`` before this connection's welcome: the agent refused
        its hello. Permanent ones stop the client (see refusal_is_permanent);
        others are retried, at most ``refused_timeout`` seconds in all."""
        why = str(msg.get("error") or "refused")
        if refusal_is_permanent(msg):
            self._refuse(why)
            return
        now = time.monotonic()
        with self._lock:
            first = self._refused_since is None
            if first:
                self._refused_since = now
            lasting = now - (self._refused_since or now)
            sock = self._sock
        if lasting >= self.refused_timeout:
            self._refuse("%s (still refused after %.0fs)" % (why, lasting))
            return
        if first:
            _stderr("spotagent: WARNING: the agent at %s refused this trainer (%s); retrying for up to %.0fs"
                    % (self.path, why, self.refused_timeout))
        log.warning("spotagent: hello refused (%s); reconnecting", why)
        if sock is not None:
            _shutdown(sock)  # the agent closes it too; reconnect with backoff

    def _report_progress(self, step: Optional[int]) -> None:
        # lock held
        if step is None:
            return
        now = time.monotonic()
        self._last_step = int(step)
        if self._connected and (
            self._last_progress_at is None or now - self._last_progress_at >= self.progress_interval
        ):
            self._last_progress_at = now
            self._queue_progress(int(step))

    def _hand_out(self, req: CheckpointRequest) -> CheckpointRequest:
        with self._lock:
            req._step_hint = self._last_step
            self._issued[req.id] = req
            _trim(self._issued, 256)
        return req

    # ------------------------------------------- the job's agreement (dist.py)

    def _poll_job(self, step: Optional[int]) -> Optional[CheckpointRequest]:
        if self._sigterm and not self._sigterm_handled:
            self._sigterm_handled = True
            if not self._fold_sigterm():
                # Offered to the job as a shutdown checkpoint: every rank
                # saves it. It has no agent id yet: make one (the MAX picks
                # one of several).
                self._sigterm_id = os.urandom(6).hex()
                # Always with a deadline: the agent's join requires one.
                self._sigterm_deadline = self._shutdown_deadline()
                log.info("spotagent: SIGTERM: asking the job for a final checkpoint (%s, deadline %s)",
                         self._sigterm_id, _format_time(self._sigterm_deadline))
        bg = self._background
        if bg is not None and bg._unstarted:
            bg._start_writes()
        if self.path:
            with self._lock:
                self._report_progress(step)
        elif step is not None:
            self._last_step = int(step)
        if not self._sync.due():
            return None
        agreed = self._sync.agree(self._contribution(), self.resume_step, self.enabled)
        return self._agreed(agreed, step)

    def _contribution(self) -> Tuple[int, int]:
        """This rank's entry in the collective: a stop, else its most urgent
        pending request (a SIGTERM checkpoint counts as shutdown)."""
        with self._lock:
            if self._local_stop():
                code = _dist.STOP_CODES.get(self._stop_reason or "", 0)
                return ((_dist.STOP << _dist.ID_BITS) | code, _dist.NO_DEADLINE)
            best = _dist.NOTHING
            if self._sigterm_id is not None:
                best = _dist.encode(_dist.URGENCY["shutdown"], int(self._sigterm_id, 16), self._sigterm_deadline)
            keep = deque()  # type: Deque[CheckpointRequest]
            for req in self._requests:
                if req._conn != self._conn or not self._connected:
                    log.info("spotagent: dropping checkpoint %s: its connection was lost", req.id)
                    continue
                if req.id in self._agreed_ids:
                    # The answer to a join that came too late: the job
                    # saved at an earlier step; this rank's part is missing.
                    log.warning("spotagent: checkpoint %s arrived after the job saved it; refused", req.id)
                    self._send({"type": "failed", "id": req.id, "error": "rank %s: joined too late" % self.rank},
                               conn=req._conn)
                    continue
                rid = _dist.parse_id(req.id)
                if rid is None:
                    log.warning("spotagent: checkpoint id %r is not 12 hex digits; ignored in a distributed job", req.id)
                    continue
                keep.append(req)
                c = _dist.encode(_dist.URGENCY.get(req.reason, 1), rid, req.deadline)
                if c[0] > best[0]:
                    best = c
            self._requests = keep
            return best

    def _agreed(self, agreed: Tuple[int, int], step: Optional[int]) -> Optional[CheckpointRequest]:
        urgency, idv, deadline = _dist.decode(agreed)
        if urgency == 0:
            return None
        if urgency >= _dist.STOP:
            self._sigterm_id = None  # the job stops anyway: no final checkpoint after it
            with self._lock:
                if not self._agreed_stop:
                    self._agreed_stop = True
                    self._agreed_stop_reason = _dist.STOP_REASONS.get(idv) or self._stop_reason or "stop"
                    self._cond.notify_all()
                    log.info("spotagent: the job stops (%s)", self._agreed_stop_reason)
            return None
        rid = _dist.format_id(idv)
        reason = _dist.REASONS.get(urgency, "periodic")
        sigterm, self._sigterm_id = self._sigterm_id, None
        with self._lock:
            self._agreed_ids[rid] = -1 if step is None else int(step)
            _trim(self._agreed_ids, 256)
            if sigterm is not None and sigterm != rid:
                # Another rank's checkpoint, at least as urgent: this rank's
                # SIGTERM stops with it instead of taking a second one.
                left = None if deadline is None else (deadline - _utcnow()).total_seconds()
                wait = self.sigterm_wait if left is None else min(max(left, 0.0) + 5.0, self.sigterm_wait)
                self._fold_until = time.monotonic() + wait
            for req in self._requests:
                if req.id == rid:
                    self._requests.remove(req)
                    req.deadline = deadline
                    return self._hand_out(req)
        req = self._join(rid, reason, deadline, step)
        if sigterm == rid:
            if req is None:
                self._stop_locally("shutdown")
            else:
                req._after_done = lambda s, r=req: self._stop_after_commit(r)
        return req

    def _join(self, rid: str, reason: str, deadline: Optional[datetime.datetime],
              step: Optional[int]) -> Optional[CheckpointRequest]:
        """Ask this rank's agent for its directory for the job's checkpoint
        rid; bounded wait for its ``checkpoint``. None if it cannot answer."""
        if not self.path:
            self._join_failed(rid, "no agent")
            return None
        if deadline is None:
            # Every contribution carries a deadline (the agent's requests,
            # a SIGTERM's); should none, the join still needs one.
            deadline = self._shutdown_deadline()
        timeout = min(self.join_timeout, (deadline - _utcnow()).total_seconds())
        if timeout <= 0:
            self._join_failed(rid, "its deadline has passed")
            return None
        msg = {"type": "join", "id": rid, "reason": reason, "deadline": _format_time(deadline)}  # type: Dict[str, Any]
        if step is not None:
            msg["step"] = int(step)

        def held() -> Optional[CheckpointRequest]:
            for r in self._requests:
                if r.id == rid and r._conn == self._conn:
                    return r
            return None

        with self._lock:
            if held() is None:  # another local rank's join may have brought it
                self._send(msg, conn=None)
            found = [None]  # type: List[Optional[CheckpointRequest]]

            def ready() -> bool:
                found[0] = held()
                return found[0] is not None or rid in self._errors or self._closed.is_set()

            self._cond.wait_for(ready, timeout)
            req = found[0]
            if req is None:
                why = self._errors.get(rid)
                self._join_failed(rid, "agent: %s" % why if why is not None else "no answer within %.1fs" % timeout)
                return None
            # The agent abandoned what it had pending for this connection
            # when the job's checkpoint reached it: those were sent before it.
            stale = [r for r in self._requests if r is not req and r._seq < req._seq]
            self._requests = deque(r for r in self._requests if r is not req and r._seq >= req._seq)
            req.reason = reason
            req.deadline = deadline
        for r in stale:
            log.info("spotagent: checkpoint %s superseded by the job's checkpoint %s", r.id, rid)
        return self._hand_out(req)

    def _join_failed(self, rid: str, why: str) -> None:
        text = "spotagent: rank %s takes no part in the job's checkpoint %s (%s); that checkpoint will be incomplete" % (
            self.rank, rid, why)
        log.warning("%s", text)
        if not self._warned_join:
            self._warned_join = True
            _stderr(text)

    def _stop_locally(self, reason: str) -> None:
        with self._lock:
            self._should_stop = True
            self._stop_reason = reason
            self._cond.notify_all()

    def _stop_after_commit(self, req: CheckpointRequest) -> None:
        """After this rank's SIGTERM checkpoint: wait (bounded) until the
        agent committed it, then ask the job to stop at the next agreement."""
        end = time.monotonic() + self.sigterm_wait
        with self._lock:
            while req.id not in self._committed and req.id not in self._failed_uploads and not self._closed.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    log.warning("spotagent: SIGTERM checkpoint %s not confirmed within %.0fs", req.id, self.sigterm_wait)
                    break
                self._cond.wait(left)
        self._stop_locally("shutdown")

    def checkpoint_done(self, step: int, dir: str, metadata: Optional[Mapping[str, Any]] = None) -> None:
        """Report a checkpoint the trainer took on its own (not requested):
        ``done`` with an empty id and the directory it wrote. Queued until a
        connection exists; a no-op without an agent."""
        msg = {"type": "done", "id": "", "step": int(step), "dir": str(dir), "metadata": _meta(metadata)}
        if self.path:
            self._send(msg, conn=None, step=int(step))

    def wait_committed(self, id: str, timeout: Optional[float] = None) -> Optional[Committed]:
        """Block until the checkpoint ``id`` is committed; None on timeout or
        without an agent. Raises :class:`UploadFailed` if the agent reports
        ``upload_failed`` for it."""
        if not self.path:
            return None
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                if id in self._committed:
                    return self._committed[id]
                if id in self._failed_uploads:
                    raise UploadFailed(id, self._failed_uploads[id])
                if self._closed.is_set():
                    return None
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def wait_welcome(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the agent's ``welcome``."""
        return self._welcomed.wait(timeout) if self.path else False

    def _write_exit_file(self) -> None:
        """Writes ``75`` to ``$SPOTAGENT_EXIT_FILE`` when stopped for an
        interruption or shutdown: a launcher that hides its workers' exit
        codes (torchrun exits 1 when a worker exits 75) can be wrapped by a
        shell that exits 75 when the file says so
        (deploy/kubernetes/multinode-job.yaml)."""
        path = os.environ.get("SPOTAGENT_EXIT_FILE")
        if not path or self.exit_code != EXIT_INTERRUPTED:
            return
        try:
            with open(path, "w") as f:
                f.write("%d\n" % EXIT_INTERRUPTED)
        except OSError as e:
            _stderr("spotagent: could not write %s: %s" % (path, e))

    def close(self, timeout: float = 2.0) -> None:
        """Stop the background threads (bounded by ``timeout``); queued
        messages are flushed first if the agent is reading. A background save
        still writing (``write_async``, ``spotagent.torch.save``) is waited
        for first, until its request's deadline if that is later: its
        ``done`` must reach the agent."""
        if self._closed.is_set():
            return
        with _live_lock:
            _live.discard(self)
        self._write_exit_file()
        end = time.monotonic() + timeout
        with self._lock:
            bg = self._background
        if bg is not None:
            left = bg.time_left()
            wait = timeout if left is None else max(timeout, left)
            bg.wait(wait)
            end = max(end, time.monotonic() + 0.5)
        if self.path:
            # Give the writer a moment to flush what is queued.
            with self._lock:
                while self._connected and (self._outbound or self._in_flight):
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
        self._closed.set()
        with self._lock:
            sock = self._sock
            self._cond.notify_all()
        if sock is not None:
            _shutdown(sock)
        for t in [self._thread] + list(self._writers):
            if t is not None and t is not threading.current_thread():
                t.join(max(0.0, end - time.monotonic()))

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if not self.path:
            return "Agent(no-op)"
        return "Agent(path=%r, connected=%r, run_id=%r)" % (self.path, self.connected, self.run_id)

    # ------------------------------------------------------------ internals

    def _await_background(self, req: CheckpointRequest) -> None:
        """Before req's first background write: wait while an earlier
        request's writes run (one staged copy at a time), then make req the
        current one."""
        with self._lock:
            prev = self._background
            self._background = req
        if prev is not None and prev is not req:
            if prev.writing:
                log.info("spotagent: checkpoint %s waits for checkpoint %s to finish writing", req.id or "(sigterm)", prev.id)
            prev._join_writes()

    def _send(self, msg: Dict[str, Any], conn: Optional[int], step: Optional[int] = None) -> None:
        """Queue a message. ``conn`` ties it to one connection (answers to a
        request); None means "whichever connection is next"."""
        line = _encode(msg)  # raises now, in the caller, for bad metadata
        if "metadata" in msg and len(_encode(msg["metadata"])) - 1 > MAX_METADATA:
            raise ValueError("spotagent: metadata exceeds %d bytes of JSON; keep it small, put data in files" % MAX_METADATA)
        if len(line) > MAX_LINE:
            raise ValueError("spotagent: message of %d bytes exceeds the %d-byte line limit" % (len(line), MAX_LINE))
        with self._lock:
            if conn is not None and (conn != self._conn or not self._connected):
                log.warning("spotagent: %s for checkpoint %s dropped: its connection was lost", msg["type"], msg.get("id"))
                return
            if msg.get("type") == "done" and msg.get("id") and step is not None:
                self._done_steps[msg["id"]] = step
                _trim(self._done_steps, 256)
            if len(self._outbound) >= _MAX_OUTBOUND:
                dropped = self._outbound.popleft()
                log.warning("spotagent: agent not reading; dropped queued %s", dropped[1].get("type"))
            self._outbound.append((conn or 0, msg))
            self._cond.notify_all()

    def _queue_progress(self, step: int) -> None:
        # lock held
        item = (0, {"type": "progress", "step": step})
        if self._outbound and self._outbound[-1][1].get("type") == "progress":
            self._outbound[-1] = item
        else:
            self._outbound.append(item)
        self._cond.notify_all()

    def _run(self) -> None:
        backoff = _BACKOFF_MIN
        warned = False
        while not self._closed.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)  # type: ignore[arg-type]
            except OSError as e:
                sock.close()
                if not warned:
                    log.warning("spotagent: cannot connect to %s (%s); retrying in the background", self.path, e)
                    warned = True
                else:
                    log.debug("spotagent: connect %s: %s", self.path, e)
                self._attempted.set()
                self._closed.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                continue
            if warned:
                log.info("spotagent: connected to %s", self.path)
            warned = False
            backoff = _BACKOFF_MIN
            self._serve(sock)
            self._attempted.set()
            if not self._closed.is_set():
                log.warning("spotagent: connection to %s lost; reconnecting", self.path)
                self._closed.wait(backoff)
        # closed: wake any waiters
        with self._lock:
            self._cond.notify_all()

    def _serve(self, sock: socket.socket) -> None:
        why = _check_peer(sock, self._agent_uids)
        if why:
            # Someone else's socket: it could choose where the trainer
            # resumes from (and so what it unpickles) and stop the run.
            sock.close()
            self._refuse("refusing the agent: %s" % why)
            return
        hello = {"type": "hello", "pid": os.getpid()}  # type: Dict[str, Any]
        if self.rank is not None:
            hello["rank"] = self.rank
        if self.world_size is not None:
            hello["world_size"] = self.world_size
        for key in ("local_rank", "local_world_size", "node_rank", "nodes"):
            v = getattr(self, key)
            if v is not None:
                hello[key] = v
        if self._hello_run_id:
            hello["run_id"] = self._hello_run_id
        with self._lock:
            if self._closed.is_set():
                sock.close()
                return
            self._conn += 1
            conn = self._conn
            self._connected = True
            self._sock = sock
            # hello goes first on every connection; the last step seen goes
            # with it so the agent learns where training is at once.
            if self._last_step is not None:
                self._outbound.appendleft((conn, {"type": "progress", "step": self._last_step}))
            self._outbound.appendleft((conn, hello))
            self._cond.notify_all()
        writer = threading.Thread(target=self._write_loop, args=(sock, conn), name="spotagent-writer", daemon=True)
        self._writers = [w for w in self._writers if w.is_alive()] + [writer]
        writer.start()
        self._attempted.set()
        try:
            self._read_loop(sock)
        finally:
            with self._lock:
                self._connected = False
                self._sock = None
                dropped = [r.id for r in self._requests if r._conn == conn]
                self._requests = deque(r for r in self._requests if r._conn != conn)
                # Answers tied to this connection are meaningless on the next.
                self._outbound = deque(m for m in self._outbound if m[0] == 0)
                self._cond.notify_all()
            for rid in dropped:
                log.warning("spotagent: dropping checkpoint %s: connection lost before it was answered", rid)
            _shutdown(sock)
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
                    if self._closed.is_set() or self._conn != conn or not self._connected:
                        return
                    item = None  # type: Optional[Dict[str, Any]]
                    if self._outbound:
                        c, item = self._outbound.popleft()
                        if c not in (0, conn):
                            continue
                    if item is not None:
                        break
                    self._cond.wait()
                self._in_flight = True
            try:
                sock.sendall(_encode(item))
                ok = True
            except OSError as e:
                log.debug("spotagent: write: %s", e)
                ok = False
            with self._lock:
                self._in_flight = False
                self._cond.notify_all()  # close() waits for the queue to drain
            if not ok:
                _shutdown(sock)  # let the reader notice and reconnect
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

    def _update_request(self, msg: Dict[str, Any]) -> bool:
        """A ``checkpoint`` for an id this client already holds (pending, or
        returned by poll and not answered yet) updates its reason and
        deadline in place: the agent re-sends a pending periodic request when
        it becomes the interruption checkpoint, and answers a repeated join
        with the same request. True when msg was such a repeat."""
        cid = str(msg.get("id") or "")
        if not cid:
            return False
        with self._lock:
            req = None  # type: Optional[CheckpointRequest]
            for r in self._requests:
                if r.id == cid and r._conn == self._conn:
                    req = r
                    break
            if req is None:
                r = self._issued.get(cid)
                if r is not None and r._conn == self._conn:
                    req = r
            if req is None:
                return False
            if not req._answered:
                reason = str(msg.get("reason") or "")
                if reason:
                    req.reason = reason
                if "deadline" in msg:
                    req.deadline = parse_time(msg.get("deadline"))
                if req.reason in ("interruption", "shutdown"):
                    self._urgent = req
                self._cond.notify_all()
        return True

    def _dispatch(self, msg: Dict[str, Any]) -> None:
        t = msg["type"]
        if t == "welcome":
            resume = msg.get("resume")
            parsed = (None, None, None)  # type: Tuple[Optional[str], Optional[int], Optional[Dict[str, Any]]]
            if isinstance(resume, dict) and resume.get("dir"):
                meta = resume.get("metadata")
                parsed = (
                    str(resume["dir"]),
                    int(resume["step"]) if resume.get("step") is not None else None,
                    meta if isinstance(meta, dict) else None,
                )
            with self._lock:
                self._welcome = msg
                self._welcomed_conn = self._conn
                self._refused_since = None
                # Resume information is fixed by the first welcome: a
                # reconnect mid-run must not change where this run started.
                if self._resume_from_welcome is None:
                    self._resume_from_welcome = parsed
                self._cond.notify_all()
            version = msg.get("version")
            if version not in (None, PROTOCOL_VERSION):
                log.warning("spotagent: agent speaks protocol version %r, this client %d", version, PROTOCOL_VERSION)
            self._welcomed.set()
        elif t == "checkpoint":
            if self._update_request(msg):
                return
            with self._lock:
                conn = self._conn
            req = CheckpointRequest(
                self,
                conn,
                id=str(msg.get("id") or ""),
                dir=str(msg.get("dir") or ""),
                reason=str(msg.get("reason") or ""),
                deadline=parse_time(msg.get("deadline")),
            )
            with self._lock:
                self._seq += 1
                req._seq = self._seq
                self._requests.append(req)
                if req.reason in ("interruption", "shutdown"):
                    self._urgent = req
                self._cond.notify_all()
        elif t == "stop":
            deadline = parse_time(msg.get("deadline"))
            with self._lock:
                self._should_stop = True
                self._stop_reason = str(msg.get("reason") or "") or None
                self._stop_deadline = deadline
                self._cond.notify_all()
            log.info("spotagent: stop requested (%s)", msg.get("reason"))
        elif t == "committed":
            cid = str(msg.get("id") or "")
            with self._lock:
                step = msg.get("step")
                if not isinstance(step, int) or isinstance(step, bool):
                    step = self._done_steps.get(cid)
                c = Committed(cid, str(msg.get("uri") or ""), step)
                self._committed[cid] = c
                _trim(self._committed, 256)
                self._last_committed = c
                self._cond.notify_all()
        elif t == "upload_failed":
            cid = str(msg.get("id") or "")
            err = str(msg.get("error") or "")
            log.warning("spotagent: checkpoint %s: upload failed: %s", cid, err)
            with self._lock:
                self._failed_uploads[cid] = err
                _trim(self._failed_uploads, 256)
                self._cond.notify_all()
        elif t == "error":
            eid = str(msg.get("id") or "")
            with self._lock:
                before_welcome = self._welcomed_conn != self._conn
            if before_welcome and not eid:
                self._hello_refused(msg)
                return
            log.warning("spotagent: agent reported an error: %s", msg.get("error"))
            if eid:
                with self._lock:
                    self._errors[eid] = str(msg.get("error") or "")
                    _trim(self._errors, 256)
                    self._cond.notify_all()
        else:
            log.debug("spotagent: unknown message type %r ignored", t)


_live = set()  # type: set
_live_lock = threading.Lock()


@atexit.register
def _close_all() -> None:
    # A trainer that exits without close() still gets its last done/failed
    # delivered (bounded wait): the background threads are daemons.
    with _live_lock:
        agents = list(_live)
    for a in agents:
        a.close(timeout=1.0)


def connect(
    path: Optional[str] = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    run_id: Optional[str] = None,
    welcome_timeout: Optional[float] = None,
    progress_interval: float = 1.0,
    handle_sigterm: Optional[bool] = None,
    process_group: Any = None,
    sync_every: Optional[int] = None,
    allow_unprotected: Optional[bool] = None,
) -> Agent:
    """Connect to the local agent.

    ``path`` defaults to ``$SPOTAGENT_SOCKET``; when neither is set the agent
    is a no-op (``poll`` always returns None) so the script runs bare.
    ``rank``/``world_size`` default to torchrun's ``$RANK``/``$WORLD_SIZE``.
    Waits at most ``welcome_timeout`` seconds (default $SPOTAGENT_WELCOME_TIMEOUT or 2) for the agent's ``welcome`` so
    that the resume information is ready; never raises because the agent is
    unreachable -- it keeps retrying in the background.
    ``handle_sigterm`` (default $SPOTAGENT_HANDLE_SIGTERM=1) turns SIGTERM
    into a final checkpoint, for trainers beside a sidecar or node agent.

    In a torch.distributed job (detected when poll first sees an initialised
    process group of more than one rank, or ``process_group``) the ranks
    agree on every request in ``poll`` every ``sync_every`` calls (default
    $SPOTAGENT_SYNC_EVERY, else 1); every rank must call poll once per step.
    ``sync_every=0`` turns the agreement off (a job that polls on some ranks
    only: each rank then behaves as a single trainer).
    ``rank``/``world_size`` then default to the default group's.

    Raises :class:`AgentRefused` when the agent refuses this trainer for
    good (a node agent's answer to a bad run id; a socket of another uid),
    unless ``allow_unprotected`` (default $SPOTAGENT_ALLOW_UNPROTECTED=1):
    training on would checkpoint nothing. A refusal that comes later is
    raised by the next ``poll``.
    """
    if path is None:
        path = os.environ.get(ENV_SOCKET) or None
    if welcome_timeout is None:
        # A node agent restores a run when its first trainer says hello:
        # give it time with SPOTAGENT_WELCOME_TIMEOUT (seconds).
        welcome_timeout = _env_float("SPOTAGENT_WELCOME_TIMEOUT", 2.0)
    dist_rank, dist_world = _dist.env_ranks()
    if rank is None:
        rank = dist_rank if dist_rank is not None else _env_int("RANK")
    if world_size is None:
        world_size = dist_world if dist_world is not None else _env_int("WORLD_SIZE")
    agent = Agent(path, rank=rank, world_size=world_size, run_id=run_id, progress_interval=progress_interval,
                  process_group=process_group, sync_every=sync_every, allow_unprotected=allow_unprotected)
    # A process group initialised already: switch the agreement on here,
    # where every rank comes by once (on NCCL this creates the gloo group).
    agent._sync.detect()
    if handle_sigterm is None:
        handle_sigterm = os.environ.get("SPOTAGENT_HANDLE_SIGTERM", "") in ("1", "true", "yes")
    if handle_sigterm:
        agent.handle_sigterm()
    if path and welcome_timeout > 0:
        end = time.monotonic() + welcome_timeout
        agent._attempted.wait(welcome_timeout)
        if agent.connected:
            with agent._cond:
                agent._cond.wait_for(lambda: agent._welcomed.is_set() or agent._refused,
                                     max(0.0, end - time.monotonic()))
        if agent._refusal is not None:
            err = agent._refusal
            agent.close(timeout=0.1)
            raise err
        if not agent._welcomed.is_set() and not agent._refused:
            log.warning("spotagent: no welcome from %s yet; using the environment for resume information", path)
    return agent


# ---------------------------------------------------------------- helpers


def _stderr(msg: str) -> None:
    try:
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _expected_agent_uids(env: Mapping[str, str]) -> Optional[Tuple[int, ...]]:
    """The uids an agent may run as: $SPOTAGENT_AGENT_UID when set (spotagent
    run sets it for its trainer), else this process's own uid or root."""
    raw = (env.get(ENV_AGENT_UID) or "").strip()
    if raw:
        try:
            return (int(raw),)
        except ValueError:
            log.warning("spotagent: $%s=%r is not a uid; expecting the agent as this user or root", ENV_AGENT_UID, raw)
    return tuple(sorted({os.getuid(), os.geteuid(), 0}))


def _check_peer(sock: socket.socket, uids: Optional[Tuple[int, ...]]) -> Optional[str]:
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


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        log.warning("spotagent: ignoring %s=%r: not a number", name, os.environ.get(name))
        return default

_TIME_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:?\d{2})?$"
)


def parse_time(value: Any) -> Optional[datetime.datetime]:
    """Parse an RFC 3339 time as Go marshals it (nanoseconds, ``Z``) into a
    timezone-aware datetime; None for null, empty or unparseable input."""
    if not value or not isinstance(value, str):
        return None
    m = _TIME_RE.match(value.strip())
    if not m:
        log.warning("spotagent: unparseable time %r ignored", value)
        return None
    date, clock, frac, tz = m.groups()
    micro = int((frac or "0")[:6].ljust(6, "0"))
    try:
        dt = datetime.datetime.strptime(date + "T" + clock, "%Y-%m-%dT%H:%M:%S").replace(microsecond=micro)
    except ValueError:
        log.warning("spotagent: unparseable time %r ignored", value)
        return None
    offset = datetime.timedelta(0)
    if tz and tz not in ("Z", "z"):
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        offset = sign * datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    return dt.replace(tzinfo=datetime.timezone(offset)).astimezone(datetime.timezone.utc)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _format_time(t: datetime.datetime) -> str:
    """RFC 3339 in UTC with milliseconds, as Go's time.Time unmarshals it."""
    return t.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _encode(msg: Mapping[str, Any]) -> bytes:
    return (json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def _meta(metadata: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError("spotagent: metadata must be a mapping, not %s" % type(metadata).__name__)
    return dict(metadata)


def _trim(d: "OrderedDict[Any, Any]", n: int) -> None:
    while len(d) > n:
        d.popitem(last=False)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _env_int(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    value = (os.environ if env is None else env).get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        log.warning("spotagent: $%s=%r is not an integer; ignored", name, value)
        return None


def _first_int(env: Mapping[str, str], *names: str) -> Optional[int]:
    for name in names:
        v = _env_int(name, env)
        if v is not None:
            return v
    return None


def _resume_from_env(env: Mapping[str, str]) -> Tuple[Optional[str], Optional[int], Optional[Dict[str, Any]]]:
    rdir = env.get(ENV_RESUME_DIR) or None
    if not rdir:
        return (None, None, None)
    step = _env_int(ENV_RESUME_STEP, env)
    meta = None  # type: Optional[Dict[str, Any]]
    manifest = env.get(ENV_RESUME_MANIFEST)
    if manifest and os.path.isfile(manifest):
        try:
            with open(manifest, "rb") as f:
                doc = json.loads(f.read().decode("utf-8"))
            if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
                meta = doc["metadata"]
            if step is None and isinstance(doc, dict) and isinstance(doc.get("step"), int):
                step = doc["step"]
        except (OSError, ValueError) as e:
            log.warning("spotagent: cannot read $%s=%s: %s", ENV_RESUME_MANIFEST, manifest, e)
    return (rdir, step, meta)
