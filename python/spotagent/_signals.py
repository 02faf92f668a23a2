"""SIGTERM in the trainer (``handle_sigterm``): where the trainer, not the
agent, gets the signal first (a Kubernetes sidecar or node agent), it becomes
a final ``shutdown`` checkpoint, or joins the agent's stop sequence already
running. In a distributed job dist.py offers it to the job instead."""

import datetime
import os
import signal
import threading
import time
from typing import Any, Mapping, Optional, Union

from ._common import DEFAULT_SIGTERM_GRACE, SIGTERM_MARGIN, env_float, log, utcnow
from ._state import State
from .request import CheckpointRequest


class Sigterm(object):
    """One process's SIGTERM: set by the handler, taken by ``poll``."""

    def __init__(self, state: State) -> None:
        self._state = state
        self.pending = False  # set by the handler
        self.at = None  # type: Optional[float]  # time.time() of the first SIGTERM
        self.handled = False  # poll took it
        #: Longest wait for the commit of a SIGTERM checkpoint ($SPOTAGENT_SIGTERM_WAIT).
        self.wait = env_float("SPOTAGENT_SIGTERM_WAIT", 60.0)
        #: From the signal to the end of the grace ($SPOTAGENT_SIGTERM_GRACE).
        self.grace = env_float("SPOTAGENT_SIGTERM_GRACE", DEFAULT_SIGTERM_GRACE)

    def install(self) -> bool:
        """The signal handler (see Agent.handle_sigterm)."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("spotagent: handle_sigterm() must be called from the main thread")
            return False

        def on_sigterm(signum: int, frame: Any) -> None:
            if not self.pending:
                self.at = time.time()
            self.pending = True

        signal.signal(signal.SIGTERM, on_sigterm)
        return True

    def take(self) -> bool:
        """True once, at the first poll after a SIGTERM."""
        if self.pending and not self.handled:
            self.handled = True
            return True
        return False

    def fold(self) -> bool:
        """A SIGTERM while the agent's interruption (or shutdown) checkpoint
        is in flight or committed -- a node drain on the same spot notice --
        joins that stop sequence instead of asking for a second checkpoint:
        the agent sends ``stop`` once it commits (or at its deadline). If no
        stop comes by the request's deadline (plus a little), stop anyway."""
        state = self._state
        with state.lock:
            if state.should_stop:
                return True
            urgent = state.urgent
            if urgent is None:
                return False
            self.fold_by(urgent.deadline)
        log.info("spotagent: SIGTERM during the %s checkpoint %s: no second checkpoint, stopping with it",
                 urgent.reason, urgent.id)
        return True

    def fold_by(self, deadline: Optional[datetime.datetime]) -> None:
        """Stop 5 s after deadline (at most ``wait`` from now) unless the
        agent's ``stop`` comes first."""
        left = None if deadline is None else (deadline - utcnow()).total_seconds()
        wait = self.wait if left is None else min(max(left, 0.0) + 5.0, self.wait)
        # State.local_stop stops by then whatever comes.
        self._state.fold_until = time.monotonic() + wait

    def request(self, step: Optional[int]) -> Optional[CheckpointRequest]:
        """The single-process SIGTERM checkpoint (None: just stop)."""
        state = self._state
        log.info("spotagent: SIGTERM: taking a final checkpoint")
        ckdir = state.checkpoint_dir
        if not state.path or not ckdir or step is None:
            state.stop("shutdown")
            return None
        d = os.path.join(ckdir, "sigterm-%d-%d" % (int(step), os.getpid()))
        return SigtermRequest(state, d, self.wait, self.deadline())

    def deadline(self) -> datetime.datetime:
        """The deadline of a checkpoint this process asks for on SIGTERM,
        computed as the agent computes its own on SIGTERM (agent_notice.go
        beginStop): the grace (25 s) from the signal, less a margin for the
        upload, but at least half the grace. A stop deadline the agent
        already sent is kept if it is earlier."""
        at = self.at if self.at is not None else time.time()
        grace = max(self.grace, 0.0)
        left = max(grace - SIGTERM_MARGIN, grace / 2)
        deadline = datetime.datetime.fromtimestamp(at, datetime.timezone.utc) + datetime.timedelta(seconds=left)
        now = utcnow()
        if deadline <= now:
            # The signal was handled late (a long step): best effort, as
            # the agent does with a notice seen late (lateNoticeGrace).
            deadline = now + datetime.timedelta(seconds=min(10.0, max(grace / 2, 1.0)))
        with self._state.lock:
            told = self._state.stop_deadline
        if told is not None and now < told < deadline:
            deadline = told
        return deadline


class SigtermRequest(CheckpointRequest):
    """The checkpoint a trainer takes because it got SIGTERM (a Kubernetes
    pod deletion reaches the trainer container before its sidecar). ``done``
    reports it as an unsolicited checkpoint, waits until the agent has
    committed it (at most ``wait`` seconds), then sets ``should_stop``."""

    def __init__(self, state: State, dir: str, wait: float, deadline: Optional[datetime.datetime]) -> None:
        CheckpointRequest.__init__(self, state, -1, id="", dir=dir, reason="shutdown", deadline=deadline)
        self._state = state
        self._wait = wait

    def done(self, step: int, metadata: Optional[Mapping[str, Any]] = None) -> None:
        if not self._claim("done"):
            return
        state = self._state
        self._join_writes()  # background writes: the files must be complete
        self._finished.set()
        if self._write_errors:
            self._answered = False
            self.fail("; ".join(self._write_errors))
            return
        with state.lock:
            before = set(state.committed)
            refusals = state.done_refusals
        state.checkpoint_done(step, self.dir, metadata)
        end = time.monotonic() + self._wait
        with state.lock:
            while True:
                new = [c for k, c in state.committed.items() if k not in before and c.step == int(step)]
                refused = state.done_refusals != refusals
                left = end - time.monotonic()
                if new or refused or left <= 0 or state.closed.is_set():
                    break
                state.cond.wait(left)
            urgent = state.urgent
            if refused and not new and urgent is not None and urgent in state.requests:
                # The agent's own interruption checkpoint was asked while this
                # one was saved (its notice came meanwhile) and is refused as
                # "in progress": stopping now would leave that request
                # unanswered and nothing committed. Folded into it, as a
                # SIGTERM during it is: the next poll hands it out, the
                # agent's stop ends the run (or fold_until does).
                to_deadline = None if urgent.deadline is None else (urgent.deadline - utcnow()).total_seconds()
                wait = self._wait if to_deadline is None else min(max(to_deadline, 0.0) + 5.0, self._wait)
                state.fold_until = time.monotonic() + wait
                log.warning("spotagent: SIGTERM checkpoint at step %d not taken (%s): answering the agent's %s checkpoint %s instead",
                            step, state.done_refusal, urgent.reason, urgent.id)
                return
            if refused and not new:
                # The agent will not commit it (a part of a multi-node job
                # commits only what every rank saves together): waiting the
                # rest of the grace would only delay the exit.
                log.warning("spotagent: SIGTERM checkpoint at step %d refused by the agent, not committed: %s",
                            step, state.done_refusal)
            elif not new:
                log.warning("spotagent: SIGTERM checkpoint at step %d not confirmed within %.0fs", step, self._wait)
        state.stop("shutdown")

    def fail(self, error: Union[str, BaseException]) -> None:
        if self._claim("fail"):
            self._state.stop("shutdown")
