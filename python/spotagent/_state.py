"""The trainer's view of the run (``State``): what the agent said (written by
the Inbox on the connection thread), the requests, the commits, the stop.
One lock and one condition guard it all; every change notifies the
condition. The ``Agent`` (the public API), the ``Inbox``, the requests, the
SIGTERM handling and the job's agreement each take this state, and nothing
of each other: the modules import one way (_common, request, _state, then
the rest, then client).

The connection is reached through the ``Wire`` interface (the Transport has
it): queueing a message never waits on the socket."""

import datetime
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Deque, Dict, Mapping, Optional, Protocol, Tuple

from ._common import MAX_STEP, check_step, log, metadata_dict, stderr, trim, valid_step
from .request import CheckpointRequest, Committed

Resume = Tuple[Optional[str], Optional[int], Optional[Dict[str, Any]]]

#: Seconds between two log lines while a trainer waits for the restore.
RESTORE_LOG_EVERY = 30.0


class RestoreFailed(Exception):
    """The agent's restore did not complete (it failed half-way, was
    cancelled, or the agent went away before it ended). Raised where the
    trainer needs the resume information (``resume_dir``, ``resume_step``,
    ``resume_metadata``, ``wait_restored``) and by ``poll``: a trainer must
    not start fresh over a committed checkpoint. ``error`` says why; the
    agent's log and exit code say it too."""

    def __init__(self, error: str) -> None:
        super().__init__("spotagent: the agent could not restore the run's checkpoint: %s; "
                         "not starting fresh over it" % error)
        self.error = error


class Wire(Protocol):
    """What the state needs of the connection (``_transport.Transport``)."""

    @property
    def conn(self) -> int:
        """Generation of the current connection (0: none yet)."""
        ...

    @property
    def connected(self) -> bool:
        ...

    def send(self, msg: Dict[str, Any], conn: Optional[int]) -> bool:
        """Queue msg (False: dropped, its connection is gone)."""
        ...

    def queue_progress(self, step: int) -> None:
        ...

    def welcomed(self) -> None:
        """A welcome on the current connection (lock held)."""
        ...

    def before_welcome(self) -> bool:
        ...

    def hello_refused(self, msg: Mapping[str, Any]) -> None:
        ...


class _NoWire(object):
    """The wire of a state whose agent has no connection (yet)."""

    conn = 0
    connected = False

    def send(self, msg: Dict[str, Any], conn: Optional[int]) -> bool:
        return False

    def queue_progress(self, step: int) -> None:
        pass

    def welcomed(self) -> None:
        pass

    def before_welcome(self) -> bool:
        return False

    def hello_refused(self, msg: Mapping[str, Any]) -> None:
        pass


class State(object):
    """The trainer's view of the run, under one lock (see the module doc)."""

    def __init__(
        self,
        path: Optional[str],
        rank: Optional[int],
        run_id: Optional[str],
        checkpoint_dir: Optional[str],
        resume: Resume,
        restore_pending: bool,
        progress_interval: float,
    ) -> None:
        #: The agent's socket; None for a no-op agent (or once refused).
        self.path = path
        self.rank = rank
        self.progress_interval = progress_interval
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)  # state changes (welcome, committed, ...)
        self.closed = threading.Event()
        self.welcomed = threading.Event()
        self.wire = _NoWire()  # type: Wire

        # Fallbacks from the environment, used until a welcome arrives.
        self.env_run_id = run_id
        self.env_checkpoint_dir = checkpoint_dir
        self.env_resume = resume
        self.welcome = None  # type: Optional[Dict[str, Any]]
        self.resume_from_welcome = None  # type: Optional[Resume]
        # The agent restores while this trainer starts (protocol 2): the
        # environment says so before any welcome, welcome's restore after.
        # Where to resume from then comes only from the agent (restored),
        # or an error (restore_failed): never a fresh start by default.
        self.restore_pending = restore_pending
        self.restore_error = None  # type: Optional[str]

        # Requests: pending (FIFO), handed out by poll, and the answers.
        self.requests = deque()  # type: Deque[CheckpointRequest]
        self.issued = OrderedDict()  # type: OrderedDict[str, CheckpointRequest]  # returned by poll
        self.seq = 0  # arrival order of requests
        # The newest interruption/shutdown/fenced request from the agent: a
        # SIGTERM that comes while it runs is folded into it (no second
        # checkpoint).
        self.urgent = None  # type: Optional[CheckpointRequest]
        # The newest request with background writes (write_async): a later
        # request's first write waits for it, so at most one staged copy.
        self.background = None  # type: Optional[CheckpointRequest]
        self.committed = OrderedDict()  # type: OrderedDict[str, Committed]
        self.failed_uploads = OrderedDict()  # type: OrderedDict[str, str]
        self.errors = OrderedDict()  # type: OrderedDict[str, str]  # error {id} from the agent
        # Refusals of a checkpoint the trainer took on its own (an error
        # without id about its done): how many, and the newest one's text.
        self.done_refusals = 0
        self.done_refusal = ""
        self.last_committed = None  # type: Optional[Committed]
        self.done_steps = OrderedDict()  # type: OrderedDict[str, int]
        self.last_progress_at = None  # type: Optional[float]
        self.last_step = None  # type: Optional[int]
        self.bad_step_warned = False  # poll got a step the agent would refuse

        # This process's stop: the agent's ``stop``, or SIGTERM.
        self.should_stop = False
        self.stop_reason = None  # type: Optional[str]
        self.stop_deadline = None  # type: Optional[datetime.datetime]
        # monotonic: a folded SIGTERM stops by then whatever comes (_signals)
        self.fold_until = None  # type: Optional[float]
        # A collective failed because a peer of the job is gone (dist.py):
        # the error, and exit_code is 75.
        self.peer_loss = None  # type: Optional[str]

    # ------------------------------------------------------------ the run

    @property
    def run_id(self) -> Optional[str]:
        with self.lock:
            if self.welcome is not None and self.welcome.get("run_id"):
                return str(self.welcome["run_id"])
        return self.env_run_id

    @property
    def checkpoint_dir(self) -> Optional[str]:
        with self.lock:
            if self.welcome is not None and self.welcome.get("checkpoint_dir"):
                return str(self.welcome["checkpoint_dir"])
        return self.env_checkpoint_dir

    def resume(self) -> Resume:
        self.wait_restored()
        with self.lock:
            if self.resume_from_welcome is not None:
                return self.resume_from_welcome
        return self.env_resume

    def wait_restored(self, timeout: Optional[float] = None) -> bool:
        """See Agent.wait_restored."""
        end = None if timeout is None else time.monotonic() + timeout
        next_log = time.monotonic() + RESTORE_LOG_EVERY
        started = time.monotonic()
        with self.lock:
            while True:
                if self.restore_error is not None:
                    raise RestoreFailed(self.restore_error)
                if not self.restore_pending:
                    return True
                if self.closed.is_set() or not self.path:
                    self.restore_error = "the agent went away before the restore ended"
                    raise RestoreFailed(self.restore_error)
                now = time.monotonic()
                if end is not None and now >= end:
                    return False
                if now >= next_log:
                    log.info("spotagent: waiting for the agent's restore (%.0fs so far)", now - started)
                    next_log = now + RESTORE_LOG_EVERY
                left = next_log - now if end is None else min(end, next_log) - now
                self.cond.wait(max(0.0, left))

    # ------------------------------------------------------------ the stop

    def local_stop(self) -> bool:
        """This process's own stop: the agent's ``stop``, or SIGTERM."""
        with self.lock:
            until = self.fold_until
            if not self.should_stop and until is not None and time.monotonic() >= until:
                # A folded SIGTERM whose interruption never ended in a stop
                # (the agent went away, or the notice was withdrawn).
                log.warning("spotagent: no stop after SIGTERM and the interruption checkpoint: stopping")
                self.should_stop = True
                self.stop_reason = "shutdown"
            return self.should_stop

    def stop(self, reason: str) -> None:
        with self.lock:
            self.should_stop = True
            self.stop_reason = reason
            self.cond.notify_all()

    # ------------------------------------------------------------ requests

    def send(self, msg: Dict[str, Any], conn: Optional[int], step: Optional[int] = None) -> None:
        """Queue a message. ``conn`` ties it to one connection (answers to a
        request); None means "whichever connection is next"."""
        with self.lock:
            if self.wire.send(msg, conn) and msg.get("type") == "done" and msg.get("id") and step is not None:
                self.done_steps[msg["id"]] = step
                trim(self.done_steps, 256)

    def checkpoint_done(self, step: int, dir: str, metadata: Optional[Mapping[str, Any]] = None) -> None:
        """``done`` with an empty id: a checkpoint the trainer took on its own."""
        n = check_step(step)
        msg = {"type": "done", "id": "", "step": n, "dir": str(dir), "metadata": metadata_dict(metadata)}
        if self.path:
            self.send(msg, conn=None, step=n)

    def hand_out(self, req: CheckpointRequest) -> CheckpointRequest:
        with self.lock:
            req._step_hint = self.last_step
            self.issued[req.id] = req
            trim(self.issued, 256)
        return req

    def report_progress(self, step: Optional[int]) -> None:
        if step is None:
            return
        n = valid_step(step)
        if n is None:
            # The agent would refuse it (an error every progress_interval):
            # not reported, said once; poll never raises for advisory progress.
            with self.lock:
                first, self.bad_step_warned = not self.bad_step_warned, True
            if first:
                stderr("spotagent: WARNING: poll(step=%r): a step must be an integer 0..%d (the number of completed "
                       "steps); not reported to the agent" % (step, MAX_STEP))
            return
        now = time.monotonic()
        with self.lock:
            self.last_step = n
            if self.wire.connected and (
                self.last_progress_at is None or now - self.last_progress_at >= self.progress_interval
            ):
                self.last_progress_at = now
                self.wire.queue_progress(n)

    def connection_lost(self, conn: int) -> None:
        """Requests of a lost connection cannot be answered on the next."""
        with self.lock:
            dropped = [r.id for r in self.requests if r._conn == conn]
            self.requests = deque(r for r in self.requests if r._conn != conn)
            self.cond.notify_all()
        for rid in dropped:
            log.warning("spotagent: dropping checkpoint %s: connection lost before it was answered", rid)

    def await_background(self, req: CheckpointRequest) -> None:
        """Before req's first background write: wait while an earlier
        request's writes run (one staged copy at a time), then make req the
        current one."""
        with self.lock:
            prev = self.background
            self.background = req
        if prev is not None and prev is not req:
            if prev.writing:
                log.info("spotagent: checkpoint %s waits for checkpoint %s to finish writing", req.id or "(sigterm)", prev.id)
            prev._join_writes()

    def start_background(self) -> None:
        """Start the queued writers of the current background request (the
        caller's staging is over: it is polling again)."""
        bg = self.background
        if bg is not None and bg._unstarted:
            bg._start_writes()
