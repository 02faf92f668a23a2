"""Trainer-side client for the spotagent protocol v1.

One JSON object per line over a Unix stream socket (see docs/protocol.md and
pkg/supervisor/protocol.go). Everything that touches the socket runs on
background threads: the training loop only ever takes a lock for a moment, so
a slow, stuck or missing agent can never stall training.

``Agent`` holds the trainer's view of the run (resume, requests, commits,
stop) and the public API. Each concern beside it has its own module:

  * _state.py: the trainer's view of the run (what the agent said, the
    requests, the commits, the stop), under one lock;
  * _transport.py: the connection (connect with backoff, peer check, hello,
    reader and writer threads, a refused hello);
  * _inbox.py: what the agent says, applied to the state;
  * request.py: ``CheckpointRequest`` and the background writes;
  * _signals.py: SIGTERM in the trainer;
  * dist.py: the agreement between the ranks of a torch.distributed job.

Each of them takes the state (and the few callables it needs), never the
``Agent``: the modules import one way, and this one last.
"""

import atexit
import datetime
import os
import sys
import threading
import time
from typing import Any, Dict, Mapping, Optional, Set

from . import dist as _dist
from ._common import (
    DEFAULT_SYNC_EVERY,
    ENV_ALLOW_UNPROTECTED,
    ENV_CHECKPOINT_DIR,
    ENV_RESUME,
    ENV_RUN_ID,
    ENV_SOCKET,
    EXIT_FENCED,
    EXIT_INTERRUPTED,
    MAX_LINE,
    MAX_METADATA,
    PROTOCOL_VERSION,
    STOP_FENCED,
    env_float,
    env_int,
    exit_code_for_stop,
    first_int,
    log,
    parse_time,
    resume_from_env,
    stderr,
)
from ._inbox import Inbox
from ._signals import Sigterm
from ._state import Resume, RestoreFailed, State
from ._transport import AgentRefused, Transport, refusal_is_permanent
from .request import CheckpointRequest, Committed, UploadFailed

__all__ = [
    "Agent",
    "AgentRefused",
    "CheckpointRequest",
    "Committed",
    "RestoreFailed",
    "UploadFailed",
    "connect",
    "parse_time",
    "refusal_is_permanent",
    "EXIT_FENCED",
    "EXIT_INTERRUPTED",
    "MAX_LINE",
    "MAX_METADATA",
    "PROTOCOL_VERSION",
]


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
        # The agent restores while this trainer starts (protocol 2): the
        # environment says so before any welcome.
        restore_pending = bool(path) and (env.get(ENV_RESUME) or "").strip() == "pending"
        self._state = state = State(path, rank, run_id or env.get(ENV_RUN_ID) or None,
                                    env.get(ENV_CHECKPOINT_DIR) or None, resume_from_env(env), restore_pending,
                                    progress_interval)
        self.rank = rank
        self.world_size = world_size
        # torchrun's view of the node, sent in hello when known.
        self.local_rank = env_int("LOCAL_RANK", env)
        self.local_world_size = env_int("LOCAL_WORLD_SIZE", env)
        self.node_rank = first_int(env, "GROUP_RANK", "NODE_RANK")
        self.nodes = first_int(env, "GROUP_WORLD_SIZE", "NNODES")
        # Sent in hello: a node agent (one per machine) picks the run's
        # store from it; an agent that wraps the trainer ignores it.
        self._hello_run_id = run_id or env.get(ENV_RUN_ID) or None

        if sync_every is None:
            sync_every = env_int("SPOTAGENT_SYNC_EVERY", env)
            if sync_every is None:
                sync_every = DEFAULT_SYNC_EVERY
        self._sigterm = Sigterm(state)
        # The agreement between the ranks of a torch.distributed job: off
        # (exactly the single-trainer behaviour) until poll sees an
        # initialised process group of more than one rank.
        exits = _dist.Exits(self._peer_lost, lambda: self._write_exit_file(1),
                            lambda: self.close(timeout=1.0, finished=False))
        self._job = _dist.Agreement(state, self._sigterm, exits, process_group, sync_every)
        self._inbox = Inbox(state)
        self._transport = Transport(state, self._hello, self._inbox.dispatch, self._forget, env,
                                    bool(allow_unprotected))
        state.wire = self._transport
        if path:
            self._transport.start()
            with _live_lock:
                _live.add(self)

    # ------------------------------------------------------------------ API

    @property
    def path(self) -> Optional[str]:
        """The agent's socket; None for the no-op agent (or once refused)."""
        return self._state.path

    @property
    def progress_interval(self) -> float:
        """Seconds between two ``progress`` messages at most."""
        return self._state.progress_interval

    @progress_interval.setter
    def progress_interval(self, value: float) -> None:
        self._state.progress_interval = value

    @property
    def enabled(self) -> bool:
        """False for the no-op agent (no SPOTAGENT_SOCKET)."""
        return bool(self._state.path)

    @property
    def connected(self) -> bool:
        with self._state.lock:
            return self._transport.connected

    @property
    def run_id(self) -> Optional[str]:
        return self._state.run_id

    @property
    def checkpoint_dir(self) -> Optional[str]:
        return self._state.checkpoint_dir

    def _resume(self) -> Resume:
        return self._state.resume()

    @property
    def resume_dir(self) -> Optional[str]:
        """Directory of the restored checkpoint, or None for a fresh start.
        While the agent still restores, blocks until it has (see
        :meth:`wait_restored`)."""
        return self._resume()[0]

    @property
    def resume_step(self) -> Optional[int]:
        """The step reported in ``done`` for the restored checkpoint, or
        None. Blocks while the agent still restores, as ``resume_dir``."""
        return self._resume()[1]

    @property
    def resume_metadata(self) -> Optional[Dict[str, Any]]:
        """The metadata reported in ``done`` for the restored checkpoint, or
        None. Blocks while the agent still restores, as ``resume_dir``."""
        return self._resume()[2]

    @property
    def restore_pending(self) -> bool:
        """True while the agent restores beside this trainer's start: the
        ``resume_*`` properties would block. Never blocks."""
        with self._state.lock:
            return self._state.restore_pending

    def wait_restored(self, timeout: Optional[float] = None) -> bool:
        """Block until the resume information is final: the agent restored
        the run's checkpoint (``resume_dir`` is complete on disk), or said
        there is none. An agent that restores while the trainer starts
        (``spotagent run``'s default) says so; otherwise, and without an
        agent, this returns True at once. False when ``timeout`` (seconds)
        passed first. Raises :class:`RestoreFailed` when the restore failed
        or was cancelled, or the agent went away before it ended: the
        trainer must not start fresh then."""
        return self._state.wait_restored(timeout)

    @property
    def should_stop(self) -> bool:
        """True once the agent sent ``stop``: finish any checkpoint, then exit.

        In a torch.distributed job it changes only at an agreement in
        ``poll``, on every rank at the same call: a rank stops when any rank's
        agent said ``stop`` (or SIGTERM stopped it), never on its own."""
        if self._job.sync.active:
            with self._state.lock:
                return self._job.stopped
        return self._state.local_stop()

    @property
    def exit_code(self) -> int:
        """What the trainer should exit with, by why it stopped (the same
        table as the agent's, docs/protocol.md "Exit codes"):

        * :data:`EXIT_INTERRUPTED` (75) once it was stopped for an
          interruption or a shutdown (``stop`` from the agent, or SIGTERM),
          so that the orchestrator runs it again and it resumes; also once a
          collective of a distributed job failed because a peer is gone
          (:attr:`peer_lost`): the job is restarted as a whole from its last
          committed checkpoint; and for a ``stop`` whose reason this client
          does not know (a stop never means finished);
        * :data:`EXIT_FENCED` (76) once it was stopped because a newer
          session of the run fenced this one: not finished, never 0, so a
          Kubernetes Job is not marked Succeeded. In a distributed job only
          the ranks whose own agent was fenced exit 76; the job's other
          ranks stop with it and exit 75 (run again, with the newer copy);
        * 0 otherwise: not stopped (finished its work).

        End the training script with ``sys.exit(agent.exit_code)``."""
        if self._state.peer_loss is not None:
            return EXIT_INTERRUPTED
        if not self.should_stop:
            return 0
        reason = self.stop_reason
        if reason == STOP_FENCED and self._job.sync.active:
            with self._state.lock:
                own = self._state.stop_reason
            if own != STOP_FENCED:
                # Another node's copy was fenced: this node's ranks stop with
                # the job, and the job is run again with the newer copy.
                return EXIT_INTERRUPTED
        return exit_code_for_stop(reason)

    @property
    def peer_lost(self) -> Optional[str]:
        """The error of the collective that failed because a peer of the
        job is gone (``spotagent.dist.is_peer_loss``), or None."""
        with self._state.lock:
            return self._state.peer_loss

    @property
    def stop_reason(self) -> Optional[str]:
        with self._state.lock:
            if self._job.sync.active:
                return self._job.stop_reason
            return self._state.stop_reason

    @property
    def stop_deadline(self) -> Optional[datetime.datetime]:
        with self._state.lock:
            return self._state.stop_deadline

    @property
    def last_committed(self) -> Optional[Committed]:
        """The newest ``committed`` message received, or None."""
        with self._state.lock:
            return self._state.last_committed

    @property
    def join_timeout(self) -> float:
        """Longest wait in poll for the agent's answer to a join
        ($SPOTAGENT_JOIN_TIMEOUT, 10 s)."""
        return self._job.join_timeout

    @join_timeout.setter
    def join_timeout(self, value: float) -> None:
        self._job.join_timeout = value

    @property
    def sigterm_wait(self) -> float:
        """Longest wait for the commit of a SIGTERM checkpoint
        ($SPOTAGENT_SIGTERM_WAIT, 60 s)."""
        return self._sigterm.wait

    @sigterm_wait.setter
    def sigterm_wait(self, value: float) -> None:
        self._sigterm.wait = value

    @property
    def allow_unprotected(self) -> bool:
        """Train on without an agent after a permanent refusal (else raise)."""
        return self._transport.allow_unprotected

    def handle_sigterm(self) -> bool:
        """Turn SIGTERM into a final checkpoint: the next ``poll`` returns a
        request with reason ``shutdown``; its ``done`` waits until the agent
        has committed it, then ``should_stop`` is set. Use it where the
        trainer, not the agent, gets SIGTERM first: a Kubernetes sidecar or
        node agent. (Under ``spotagent run`` the agent gets the signal and asks
        for the checkpoint itself.) Only from the main thread; returns False
        when the handler could not be installed."""
        return self._sigterm.install()

    def poll(self, step: Optional[int] = None) -> Optional[CheckpointRequest]:
        """Never blocks. Reports progress (at most every ``progress_interval``
        seconds) and returns the oldest pending checkpoint request, or None.

        In a torch.distributed job (an initialised process group of more than
        one rank, see dist.py) every rank must call poll once per step: every
        ``sync_every``-th call runs one small all_reduce that agrees on the
        job's request, and poll returns it on every rank at that same call
        (or None on a rank whose agent cannot take part). A rank whose own
        agent did not ask sends ``join`` and waits for the agent's answer
        (at most ``join_timeout`` seconds, never past the deadline).

        Raises :class:`AgentRefused` once the agent refused this trainer
        for good (see :func:`connect`)."""
        self._transport.raise_refusal()
        with self._state.lock:
            if self._state.restore_error is not None:
                raise RestoreFailed(self._state.restore_error)
        if self._job.sync.active or self._job.sync.detect():
            return self._job.poll(step)
        if self._sigterm.take() and not self._sigterm.fold():
            return self._job.offer_sigterm(step, self.world_size) or self._sigterm.request(step)
        self._state.start_background()
        if not self.path:
            return None
        with self._state.lock:
            self._state.report_progress(step)
            while self._state.requests:
                req = self._state.requests.popleft()
                if req._conn == self._transport.conn and self._transport.connected:
                    return self._state.hand_out(req)
                log.info("spotagent: dropping checkpoint %s: its connection was lost", req.id)
        return None

    def checkpoint_done(self, step: int, dir: str, metadata: Optional[Mapping[str, Any]] = None) -> None:
        """Report a checkpoint the trainer took on its own (not requested):
        ``done`` with an empty id and the directory it wrote. Queued until a
        connection exists; a no-op without an agent."""
        self._state.checkpoint_done(step, dir, metadata)

    def wait_committed(self, id: str, timeout: Optional[float] = None) -> Optional[Committed]:
        """Block until the checkpoint ``id`` is committed; None on timeout or
        without an agent. Raises :class:`UploadFailed` if the agent reports
        ``upload_failed`` for it."""
        if not self.path:
            return None
        end = None if timeout is None else time.monotonic() + timeout
        with self._state.lock:
            while True:
                if id in self._state.committed:
                    return self._state.committed[id]
                if id in self._state.failed_uploads:
                    raise UploadFailed(id, self._state.failed_uploads[id])
                if self._state.closed.is_set():
                    return None
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._state.cond.wait(left)

    def wait_welcome(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the agent's ``welcome``."""
        return self._state.welcomed.wait(timeout) if self.path else False

    def close(self, timeout: float = 2.0, finished: bool = True) -> None:
        """Stop the background threads (bounded by ``timeout``); queued
        messages are flushed first if the agent is reading. A background save
        still writing (``write_async``, ``spotagent.torch.save``) is waited
        for first, until its request's deadline if that is later: its
        ``done`` must reach the agent.

        Unless a stop is in effect (or ``finished`` is False, as when leaving
        a ``with`` block on an exception), it tells the agent the trainer
        finished its work (``bye``): a sidecar stopped afterwards (the
        kubelet always stops it) then records no interruption."""
        if self._state.closed.is_set():
            return
        exc = sys.exc_info()[1]
        if isinstance(exc, Exception) and self._job.sync.active:
            # Called while an exception propagates (a `finally:`): this rank
            # did not finish. A peer loss makes it exit 75; anything else is
            # its own crash, which a local peer's 75 written later must not
            # hide (the exit file's first answer stands).
            finished = False
            if _dist.is_peer_loss(exc):
                self._peer_lost(exc)
            else:
                self._write_exit_file(1)
        if finished and self.path and not self._state.local_stop() and self._state.peer_loss is None:
            bye = {"type": "bye"}  # type: Dict[str, Any]
            if self._state.last_step is not None:
                bye["step"] = self._state.last_step
            self._state.send(bye, conn=None)
        self._forget()
        self._write_exit_file()
        end = time.monotonic() + timeout
        with self._state.lock:
            bg = self._state.background
        if bg is not None:
            left = bg.time_left()
            wait = timeout if left is None else max(timeout, left)
            bg.wait(wait)
            end = max(end, time.monotonic() + 0.5)
        if self.path:
            # Give the writer a moment to flush what is queued.
            self._transport.flush(end)
        self._state.closed.set()
        with self._state.lock:
            self._state.cond.notify_all()
        self._transport.wake()
        self._transport.join(end)

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(finished=exc[0] is None)

    def __repr__(self) -> str:
        if not self.path:
            return "Agent(no-op)"
        return "Agent(path=%r, connected=%r, run_id=%r)" % (self.path, self.connected, self.run_id)

    # ------------------------------------------------------------ internals

    # The state's lock, condition and a few of its fields under the names
    # the tests wait on (read-only).

    @property
    def _lock(self) -> Any:
        return self._state.lock

    @property
    def _cond(self) -> threading.Condition:
        return self._state.cond

    @property
    def _closed(self) -> threading.Event:
        return self._state.closed

    @property
    def _requests(self) -> Any:
        return self._state.requests

    @property
    def _errors(self) -> Dict[str, str]:
        return self._state.errors

    @property
    def _welcome(self) -> Optional[Dict[str, Any]]:
        return self._state.welcome

    @property
    def _should_stop(self) -> bool:
        return self._state.should_stop

    @property
    def _conn(self) -> int:
        """Generation of the current connection (0: none yet)."""
        return self._transport.conn

    @property
    def _sync(self) -> _dist.Sync:
        """The collective (dist.Sync); tests and bench/ swap or inspect it."""
        return self._job.sync

    @_sync.setter
    def _sync(self, value: Any) -> None:
        self._job.sync = value

    def _hello(self) -> Dict[str, Any]:
        hello = {"type": "hello", "pid": os.getpid(), "version": PROTOCOL_VERSION}  # type: Dict[str, Any]
        if self.rank is not None:
            hello["rank"] = self.rank
        if self.world_size is not None:
            hello["world_size"] = self.world_size
        for key, v in (("local_rank", self.local_rank), ("local_world_size", self.local_world_size),
                       ("node_rank", self.node_rank), ("nodes", self.nodes)):
            if v is not None:
                hello[key] = v
        if self._hello_run_id:
            hello["run_id"] = self._hello_run_id
        return hello

    def _write_exit_file(self, code: Optional[int] = None) -> None:
        """Writes the exit code to ``$SPOTAGENT_EXIT_FILE`` when it is not 0
        (``75`` when stopped for an interruption or shutdown, or when a peer
        of the job is gone; ``76`` when fenced): a launcher that hides its
        workers' exit codes (torchrun exits 1 when a worker exits 75 or 76)
        can be wrapped by a shell that exits with what the file says
        (deploy/kubernetes/multinode-job.yaml), and ``spotagent run`` reads
        it too. ``code`` 1: this rank crashed (an exception of its own, in
        a distributed job).

        The first rank of the node to write it decides (the file is created
        exclusively): a rank that crashed writes 1 before its sockets close,
        and the 75 of the local ranks that then lose it as a peer does not
        replace it."""
        path = os.environ.get("SPOTAGENT_EXIT_FILE")
        if code is None:
            code = self.exit_code
            if code == 0:
                return
        if not path:
            return
        # Written whole beside it, then linked into place: the link fails
        # if the file exists (the first rank's answer stands), and a reader
        # (the agent, a wrapper shell) never sees it empty. The temp file is
        # this process's own: created exclusively, never through a symlink
        # planted at its name, and only it is removed.
        tmp = "%s.%d.tmp" % (path, os.getpid())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            stderr("spotagent: could not write %s: %s" % (path, e))
            return
        try:
            with os.fdopen(fd, "w") as f:
                f.write("%d\n" % code)
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError as e:
            stderr("spotagent: could not write %s: %s" % (path, e))
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _peer_lost(self, exc: BaseException) -> None:
        """A collective failed because a peer of the job is gone: exit_code
        becomes 75, and the exit file says so."""
        with self._state.lock:
            first = self._state.peer_loss is None
            if first:
                self._state.peer_loss = str(exc).strip() or type(exc).__name__
                self._state.cond.notify_all()
        if first:
            log.warning("spotagent: a peer of this job is gone (%s): this rank exits %d", self._state.peer_loss,
                        EXIT_INTERRUPTED)
        self._write_exit_file(EXIT_INTERRUPTED)

    def _forget(self) -> None:
        """No longer closed at exit (closed, or refused)."""
        with _live_lock:
            _live.discard(self)


_live = set()  # type: Set[Agent]
_live_lock = threading.Lock()


@atexit.register
def _close_all() -> None:
    # A trainer that exits without close() still gets its last done/failed
    # delivered (bounded wait): the background threads are daemons.
    with _live_lock:
        agents = list(_live)
    for a in agents:
        a.close(timeout=1.0)


# What spotagent puts in a trainer's environment beside the socket: seen
# without the socket, the trainer was meant to be protected and is not.
_AGENT_ENV = ("SPOTAGENT_RUN_ID", "SPOTAGENT_CHECKPOINT_DIR")


def _warn_unprotected() -> None:
    """Say on stderr (always, whatever logging is set up) that the agent's
    environment is here without its socket: every checkpoint request would
    be lost, and the client a silent no-op."""
    seen = [k for k in _AGENT_ENV if os.environ.get(k)]
    if not seen:
        return
    sys.stderr.write(
        "spotagent: WARNING: %s set but %s is not: this trainer cannot reach its agent and "
        "nothing will be checkpointed. Keep %s in the trainer's environment (spotagent run sets it; "
        "in Kubernetes set it in the trainer container and mount the volume that holds the socket).\n"
        % (" and ".join(seen), ENV_SOCKET, ENV_SOCKET)
    )
    sys.stderr.flush()


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
    $SPOTAGENT_SYNC_EVERY, else -1: auto, every k calls with k agreed at
    each agreement from the measured step and collective times, so that the
    agreement costs at most 0.5 % of a step while a request waits at most
    1 s); every rank must call poll once per step. ``sync_every=0`` turns
    the agreement off (a job that polls on some ranks only: each rank then
    behaves as a single trainer).
    ``rank``/``world_size`` then default to the default group's.

    Raises :class:`AgentRefused` when the agent refuses this trainer for
    good (a node agent's answer to a bad run id; a socket of another uid),
    unless ``allow_unprotected`` (default $SPOTAGENT_ALLOW_UNPROTECTED=1):
    training on would checkpoint nothing. A refusal that comes later is
    raised by the next ``poll``.
    """
    if path is None:
        path = os.environ.get(ENV_SOCKET) or None
    if not path:
        _warn_unprotected()
    if welcome_timeout is None:
        # A node agent restores a run when its first trainer says hello:
        # give it time with SPOTAGENT_WELCOME_TIMEOUT (seconds).
        welcome_timeout = env_float("SPOTAGENT_WELCOME_TIMEOUT", 2.0)
    dist_rank, dist_world = _dist.env_ranks()
    if rank is None:
        rank = dist_rank if dist_rank is not None else env_int("RANK")
    if world_size is None:
        world_size = dist_world if dist_world is not None else env_int("WORLD_SIZE")
    agent = Agent(path, rank=rank, world_size=world_size, run_id=run_id, progress_interval=progress_interval,
                  process_group=process_group, sync_every=sync_every, allow_unprotected=allow_unprotected)
    # A process group initialised already: switch the agreement on here,
    # where every rank comes by once (on NCCL this creates the gloo group).
    if agent._sync.detect():
        agent._job.install_excepthook()
    if handle_sigterm is None:
        handle_sigterm = os.environ.get("SPOTAGENT_HANDLE_SIGTERM", "") in ("1", "true", "yes")
    if handle_sigterm:
        agent.handle_sigterm()
    if path and welcome_timeout > 0:
        end = time.monotonic() + welcome_timeout
        tr = agent._transport
        tr.attempted.wait(welcome_timeout)
        welcomed = agent._state.welcomed
        if agent.connected:
            with agent._cond:
                agent._cond.wait_for(lambda: welcomed.is_set() or tr.refused, max(0.0, end - time.monotonic()))
        tr.raise_refusal()
        if not welcomed.is_set() and not tr.refused:
            log.warning("spotagent: no welcome from %s yet; using the environment for resume information", path)
    return agent
