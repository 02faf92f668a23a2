"""A checkpoint request as the trainer sees it (``CheckpointRequest``), and
what the agent answers about it (``Committed``, ``UploadFailed``)."""

import contextlib
import datetime
import errno
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Set, Union, cast

from ._common import check_step, fsync_dir, log, metadata_dict

__all__ = ["CheckpointRequest", "Committed", "UploadFailed"]


class Host(Protocol):
    """What a request needs of the client (``_state.State`` has it): the
    lock and condition its writers share with the rest of the client, a way
    to queue its answer, and the one-staged-copy rule of background writes."""

    @property
    def lock(self) -> "threading.RLock":
        ...

    @property
    def cond(self) -> threading.Condition:
        ...

    def send(self, msg: Dict[str, Any], conn: Optional[int], step: Optional[int] = None) -> None:
        ...

    def await_background(self, req: "CheckpointRequest") -> None:
        ...


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
        host: Union[Host, Any],
        conn: int,
        id: str,
        dir: str,
        reason: str,
        deadline: Optional[datetime.datetime],
    ) -> None:
        # The client's state, or an Agent (its state): a request made by
        # hand, as tests do, gets the agent it names.
        self._host = cast(Host, getattr(host, "_state", host))
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
        self._saved_names = set()  # type: Set[str]
        self._running = 0
        self._queued = 0  # background writes submitted
        self._turn = 0  # the one whose turn it is to write (submission order)
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
        step = check_step(step)  # ValueError here, in the caller: the agent would refuse it
        msg = {"type": "done", "id": self.id, "step": step, "metadata": metadata_dict(metadata)}
        if not self._claim("done"):
            return
        with self._host.lock:
            background = bool(self._writes)
        if not background:
            self._host.send(msg, conn=self._conn, step=int(step))
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
                    fsync_dir(self.dir)
                except OSError as e:
                    errors.append("fsync %s: %s" % (self.dir, e))
            if errors:
                log.warning("spotagent: checkpoint %s not saved: %s", self.id, "; ".join(errors))
                self._host.send({"type": "failed", "id": self.id, "error": "; ".join(errors)}, conn=self._conn)
            else:
                self._host.send(msg, conn=self._conn, step=msg["step"])
        finally:
            self._finished.set()
            with self._host.lock:
                self._host.cond.notify_all()

    def saved(self, name: str) -> None:
        """Tell the agent that the file ``name`` (relative to ``dir``, or an
        absolute path inside it) is complete (written; the agent reads it
        from the page cache, so it need not be fsynced yet) and will not
        change: the agent uploads it at once instead of at ``done``. Optional; a
        file changed after ``saved`` is uploaded again at ``done``."""
        if not self.id or self._finished.is_set():
            return
        msg = {"type": "saved", "id": self.id, "path": str(name)}  # type: Dict[str, Any]
        if self._step_hint is not None:
            msg["step"] = self._step_hint
        self._host.send(msg, conn=self._conn)

    def write_async(self, name: str, write: Callable[[Any], None]) -> None:
        """Write the file ``name`` (relative to ``dir``) in a background
        thread: ``write(f)`` gets the open binary file; it is then flushed,
        reported ``saved`` and fsynced. Files of one request are written one
        at a time, in the order of these calls (the first is uploading while
        the next is written), started once the caller is done staging:
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
        self._host.await_background(self)
        with self._host.lock:
            if rel in self._saved_names:
                raise ValueError("spotagent: %s written twice for checkpoint %s" % (rel, self.id))
            self._saved_names.add(rel)
            self._running += 1
            turn = self._queued
            self._queued += 1
        self._blocked += time.monotonic() - t0
        t = threading.Thread(target=self._write, args=(rel, write, turn), name="spotagent-write", daemon=True)
        with self._host.lock:
            self._writes.append(t)
            self._unstarted.append(t)

    def _start_writes(self) -> None:
        """Start the queued writers. They wait until the caller is done
        staging (its done(), its next poll(), or a wait): started at once,
        a writer's CPU and disk would slow the staging of the next file,
        which is the part training waits for."""
        with self._host.lock:
            ts, self._unstarted = self._unstarted, []
        for t in ts:
            t.start()

    def _write(self, rel: str, write: Callable[[Any], None], turn: int) -> None:
        path = os.path.join(self.dir, rel)
        try:
            # One file at a time, in the order they were submitted: the
            # first is then complete (and uploading) after its own write
            # rather than at the end of all of them, and the writes leave
            # the other cores to the upload. The turn passes on whatever
            # happens here.
            with self._write_turn(turn):
                parent = os.path.dirname(path)
                if parent:
                    os.makedirs(parent, exist_ok=True)
                f = open(path, "wb")
                try:
                    write(f)
                    f.flush()
                except BaseException:
                    f.close()
                    raise
            with f:
                # The bytes are in the page cache, where the agent reads
                # them: it is told now, and uploads while the fsync (the
                # local copy's durability, which done still reports) runs
                # beside the next file's write.
                self.saved(rel)
                os.fsync(f.fileno())
        except Exception as e:  # reported as failed at done
            log.warning("spotagent: writing %s for checkpoint %s failed: %s", path, self.id, e)
            with self._host.lock:
                self._write_errors.append("%s: %s" % (rel, e))
        finally:
            with self._host.lock:
                self._running -= 1
                self._host.cond.notify_all()

    @contextlib.contextmanager
    def _write_turn(self, turn: int) -> Iterator[None]:
        with self._host.lock:
            while self._turn != turn:
                self._host.cond.wait()
        try:
            yield
        finally:
            with self._host.lock:
                self._turn += 1
                self._host.cond.notify_all()

    def _join_writes(self, timeout: Optional[float] = None) -> bool:
        self._start_writes()
        end = None if timeout is None else time.monotonic() + timeout
        with self._host.lock:
            while self._running > 0:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._host.cond.wait(left)
        return True

    @property
    def writing(self) -> bool:
        """True while background writes of this request are running."""
        with self._host.lock:
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

    def fail(self, error: Union[str, BaseException]) -> None:
        """Report that this checkpoint could not be written. Pass the
        exception itself: an ``OSError``'s errno goes first by name
        (``ENOSPC: [Errno 28] No space left on device``), so that the agent
        names the cause and what to do about it."""
        text = str(error)
        if isinstance(error, OSError) and error.errno in errno.errorcode:
            text = "%s: %s" % (errno.errorcode[error.errno], text)
        if self._claim("fail"):
            self._host.send({"type": "failed", "id": self.id, "error": text}, conn=self._conn)
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

