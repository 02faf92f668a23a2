"""Agreement between the ranks of a torch.distributed job (protocol v1, #15).

Every rank's ``poll`` contributes its pending request to ONE all_reduce(MAX)
of an int64 CPU tensor of two elements, every ``sync_every`` calls:

    [ urgency << 48 | int(id, 16),  -deadline_ms ]     (nothing: [0, -2**62])

so every rank learns the job's request -- the highest urgency (ties: the
highest id) with the earliest deadline -- at the same call, and saves the same
step. Urgency 5 is "stop": a rank whose agent said ``stop`` contributes it and
every rank's ``should_stop`` turns true at that same call.

``Agreement`` runs it in ``poll``: this rank's contribution, the collective,
then the agreed request handed out (or joined at this rank's agent, which
answers ``join`` with its own directory for it), or the job's stop.

A lost peer (#25): a collective that fails because another rank's process or
machine is gone (``is_peer_loss``: gloo's "Connection reset/closed by peer",
"Timed out waiting", NCCL's aborted communicator) ends this rank with
:data:`EXIT_INTERRUPTED` (75) and 75 in ``$SPOTAGENT_EXIT_FILE``: the job is
to be restarted as a whole from its last committed checkpoint, which is not
a crash of its own. In the agreement this raises :class:`PeerLost`; in the
user's own collective (DDP's all-reduce) the exception hook the client
installs in a distributed job (``install_excepthook``) exits 75 for it. Any
other exception stays a crash (exit 1, and 1 in the exit file).

torch is imported only when it is already loaded (``sys.modules``) or when the
caller hands over a process group: the client stays standard-library only.
"""

import datetime
import math
import os
import sys
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from ._common import (DEFAULT_JOIN_TIMEOUT, EXIT_INTERRUPTED, env_float, format_time, log, stderr, trim, utcnow,
                      valid_step)
from ._signals import Sigterm
from ._state import State
from .request import CheckpointRequest

#: Urgency of a request, by reason; the collective keeps the highest.
URGENCY = {"periodic": 1, "manual": 2, "shutdown": 3, "interruption": 4}
REASONS = {v: k for k, v in URGENCY.items()}
#: A fenced session's last checkpoint is as urgent as an interruption's.
URGENCY["fenced"] = URGENCY["interruption"]
#: A rank whose agent (or SIGTERM) stops it: every rank stops at this sync.
STOP = 5
#: Low bits of a STOP contribution: why (the highest wins, so exit codes
#: agree on every rank: fenced's 76 over interruption's and shutdown's 75).
STOP_CODES = {"shutdown": 1, "interruption": 2, "fenced": 3}
STOP_REASONS = {v: k for k, v in STOP_CODES.items()}

ID_BITS = 48
ID_MASK = (1 << ID_BITS) - 1
#: The second element when there is no deadline (-deadline_ms is never this low).
NO_DEADLINE = -(1 << 62)
NOTHING = (0, NO_DEADLINE)

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

#: What gloo's transport says when a peer's connection ends or never
#: answers: the peer's process died (its sockets closed: "closed"/"reset"),
#: or its machine stopped answering ("Timed out waiting ...", after the
#: process group's timeout). Only together with gloo's own location
#: ("gloo/transport/" in the message): a user's RuntimeError about some
#: other connection is no peer loss.
_GLOO_PEER = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "Timed out waiting", "Read error", "Write error")
#: What NCCL (torch's ProcessGroupNCCL) says when a peer is gone.
_NCCL_PEER = ("NCCL communicator was aborted", "remote process exited or there was a network error",
              "Watchdog caught collective operation timeout")


def is_peer_loss(exc: BaseException) -> bool:
    """True when exc (or an exception it was raised from) is a collective's
    failure because another rank of the job is gone: its process died or
    its machine stopped answering (gloo's transport errors, NCCL's aborted
    communicator). Such a rank exits 75 ("run the job again"), not 1."""
    e = exc  # type: Optional[BaseException]
    for _ in range(8):  # the chain of __cause__/__context__, bounded
        if e is None:
            return False
        if isinstance(e, PeerLost):
            return True
        if isinstance(e, RuntimeError):  # torch 2's DistBackendError is one too
            text = str(e)
            if "gloo/transport/" in text and any(p in text for p in _GLOO_PEER):
                return True
            if any(p in text for p in _NCCL_PEER):
                return True
        e = e.__cause__ or e.__context__
    return False


class PeerLost(RuntimeError):
    """The agreement's collective failed because a peer of the job is gone
    (see :func:`is_peer_loss`). Let it propagate: the rank then exits 75
    and the job is restarted from its last committed checkpoint."""


def parse_id(id: str) -> Optional[int]:
    """A request id as the agent makes them (12 lowercase hex digits), or None."""
    if len(id) != 12:
        return None
    try:
        v = int(id, 16)
    except ValueError:
        return None
    if v < 0 or "%012x" % v != id:
        return None
    return v


def format_id(v: int) -> str:
    return "%012x" % (v & ID_MASK)


def encode(urgency: int, id: int, deadline: Optional[datetime.datetime]) -> Tuple[int, int]:
    d = NO_DEADLINE
    if deadline is not None:
        d = -int((deadline - _EPOCH) // datetime.timedelta(milliseconds=1))
    return ((urgency << ID_BITS) | (id & ID_MASK), d)


def decode(agreed: Tuple[int, int]) -> Tuple[int, int, Optional[datetime.datetime]]:
    """(urgency, id, deadline) of an all_reduce result."""
    v, d = agreed
    deadline = None
    if d > NO_DEADLINE:
        deadline = _EPOCH + datetime.timedelta(milliseconds=-d)
    return (v >> ID_BITS, v & ID_MASK, deadline)


#: sync_every's default: agree every k polls, k chosen at each agreement
#: from measured times (Sync.propose), the same k on every rank.
AUTO = -1
#: auto: the share of a training step the agreement may cost at most.
MAX_OVERHEAD = 0.005
#: auto: how long a request may wait for the next agreement at most (s).
MAX_LATENCY = 1.0
#: auto: the most polls between two agreements.
MAX_K = 1000


class Sync(object):
    """The collective of one process. ``detect`` finds the process group
    lazily (``connect`` may run before ``init_process_group``); once it sees
    an initialised group of more than one rank, the agreement is on for good.
    On a non-gloo group (NCCL) it creates a gloo group over the same ranks
    there -- itself a collective, reached by every rank at the same call --
    so the agreement never touches the GPU."""

    def __init__(self, process_group: Any = None, every: int = AUTO) -> None:
        self.every = int(every)  # 0: the agreement is off; < 0: auto
        self.k = 1 if self.every < 0 else self.every  # polls between agreements
        self.calls = 0  # polls since the agreement was switched on
        self.agreements = 0  # collectives run
        self._since = 0  # polls since the last agreement (auto)
        self._last_poll = None  # type: Optional[float]
        self.step_s = None  # type: Optional[float]  # EWMA of the time between polls
        self.coll_s = None  # type: Optional[float]  # EWMA of one collective
        self.active = False
        self._user_group = process_group
        self._group = None  # type: Any  # the gloo group the all_reduce runs on
        self._dist = None  # type: Any
        self._torch = None  # type: Any
        self.rank = None  # type: Optional[int]
        self.world_size = None  # type: Optional[int]

    def detect(self) -> bool:
        if self.active:
            return True
        if self.every == 0:
            return False
        dist = self._dist
        if dist is None:
            if self._user_group is not None:
                import torch.distributed as dist  # the caller handed us a group
            else:
                dist = sys.modules.get("torch.distributed")
                if dist is None:
                    return False
        try:
            if not dist.is_available() or not dist.is_initialized():
                return False
        except Exception:  # a half-imported torch
            return False
        self._dist = dist
        pg = self._user_group if self._user_group is not None else dist.group.WORLD
        world = dist.get_world_size(pg)
        if world <= 1:
            return False
        group = pg
        if dist.get_backend(pg) != "gloo":
            # NCCL, or torch 2's per-device backends ("cpu:gloo,cuda:nccl"):
            # the agreement runs on a gloo group over the same ranks.
            ranks = None
            if self._user_group is not None:
                ranks = group_ranks(dist, pg)
            group = dist.new_group(ranks=ranks, backend="gloo")
        self._torch = sys.modules["torch"]
        self._group = group
        self.rank = dist.get_rank()
        self.world_size = world
        self.active = True
        return True

    def due(self) -> bool:
        """Count one poll; True when this one runs the collective."""
        now = time.monotonic()
        if self._last_poll is not None:
            self.step_s = _ewma(self.step_s, now - self._last_poll)
        self._last_poll = now
        self.calls += 1
        if self.every > 0:
            return (self.calls - 1) % self.every == 0
        self._since += 1
        if self._since >= self.k:
            self._since = 0
            return True
        return False

    def propose(self) -> int:
        """This rank's k for the next interval (auto): the fewest polls
        between agreements that keep one collective within MAX_OVERHEAD of
        the steps it covers, but never so many that a request waits longer
        than MAX_LATENCY for the next agreement. The job takes the smallest
        rank's proposal, agreed in the same all_reduce."""
        if self.every > 0:
            return self.every
        step, coll = self.step_s, self.coll_s
        if step is None or coll is None or step <= 0:
            return 1
        by_cost = int(math.ceil(coll / (MAX_OVERHEAD * step)))
        by_latency = max(1, int(math.floor(MAX_LATENCY / step + 1e-9)))
        return max(1, min(by_cost, by_latency, MAX_K))

    def agree(self, mine: Tuple[int, int], resumed: Optional[int] = None, agent: bool = True) -> Tuple[int, int]:
        """The job's (MAX) entry. The first agreement also checks, in the
        same all_reduce, that every rank with an agent resumed from the same
        step (None: started fresh): the nodes restore their parts on their
        own, and a rank on another step would hang or corrupt the job."""
        first = self.agreements == 0
        self.agreements += 1
        vals = list(mine) + [-self.propose()]  # MAX of -k: the smallest k
        if first:
            r = -1 if resumed is None else int(resumed)
            vals += [r, -r] if agent else [-(1 << 62), -(1 << 62)]  # no agent: no say
        t = self._torch.tensor(vals, dtype=self._torch.int64)
        t0 = time.monotonic()
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self._group)
        self.coll_s = _ewma(self.coll_s, time.monotonic() - t0)
        out = t.tolist()
        if self.every < 0:
            self.k = max(1, -out[2])
        if first and out[3] != -(1 << 62) and out[3] != -out[4]:
            hi, lo = out[3], -out[4]
            raise RuntimeError(
                "spotagent: the ranks of this job resumed from different checkpoints "
                "(steps %s to %s; -1: none): a node restored an older one (see its agent's log)"
                % (lo, hi))
        return (out[0], out[1])


def group_ranks(dist: Any, pg: Any) -> List[int]:
    """The global ranks of process group pg, sorted. torch >= 2.0 says so
    in public (``get_process_group_ranks``); 1.13 only in a private map of
    distributed_c10d (``_pg_group_ranks``: group -> {global: group rank}),
    which later releases moved and renamed."""
    public = getattr(dist, "get_process_group_ranks", None)
    if public is not None:
        return sorted(int(r) for r in public(pg))
    return sorted(int(r) for r in dist.distributed_c10d._pg_group_ranks[pg].keys())


def _ewma(prev: Optional[float], x: float, alpha: float = 0.2) -> float:
    return x if prev is None else prev + alpha * (x - prev)


def env_ranks() -> Tuple[Optional[int], Optional[int]]:
    """(rank, world_size) of an initialised default process group, if torch
    is loaded; (None, None) otherwise."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return (None, None)
    try:
        if dist.is_available() and dist.is_initialized():
            return (dist.get_rank(), dist.get_world_size())
    except Exception:
        pass
    return (None, None)


class Exits(object):
    """How this rank ends, as the client decides it (its exit code and
    ``$SPOTAGENT_EXIT_FILE``): what the agreement and the exception hook
    call on a lost peer or a crash."""

    def __init__(self, peer_lost: Callable[[BaseException], None], crashed: Callable[[], None],
                 close: Callable[[], None]) -> None:
        #: A peer of the job is gone: exit code 75, and 75 in the exit file.
        self.peer_lost = peer_lost
        #: This rank crashed (an exception of its own): 1 in the exit file.
        self.crashed = crashed
        #: Close the client without a ``bye`` (bounded).
        self.close = close


class Agreement(object):
    """The job's agreement as one rank's ``poll`` runs it: this rank's
    contribution (its agent's most urgent request, a SIGTERM, or a stop),
    the collective, and acting on the result: hand out the agreed request,
    ``join`` it at this rank's agent (bounded wait), or stop with the job."""

    def __init__(self, state: State, sigterm: Sigterm, exits: Exits, process_group: Any = None,
                 every: int = 1) -> None:
        self._state = state
        self._sigterm = sigterm
        self.exits = exits
        self.sync = Sync(process_group, every)
        #: Longest wait in poll for the agent's answer to a join.
        self.join_timeout = env_float("SPOTAGENT_JOIN_TIMEOUT", DEFAULT_JOIN_TIMEOUT)
        self.stopped = False  # should_stop once the agreement is on
        self.stop_reason = None  # type: Optional[str]
        self.sigterm_id = None  # type: Optional[str]  # a SIGTERM checkpoint offered to the job
        self.sigterm_deadline = None  # type: Optional[datetime.datetime]
        self.agreed_ids = OrderedDict()  # type: OrderedDict[str, int]  # id -> step agreed at
        self._warned_join = False

    def install_excepthook(self) -> None:
        """See :func:`install_excepthook` (only with an agent)."""
        if self._state.path:
            install_excepthook(self.exits)

    def poll(self, step: Optional[int]) -> "Optional[CheckpointRequest]":
        a = self._state
        if self._sigterm.take() and not self._sigterm.fold():
            # Offered to the job as a shutdown checkpoint: every rank
            # saves it. It has no agent id yet: make one (the MAX picks
            # one of several). Always with a deadline: join requires one.
            self.sigterm_id = os.urandom(6).hex()
            self.sigterm_deadline = self._sigterm.deadline()
            log.info("spotagent: SIGTERM: asking the job for a final checkpoint (%s, deadline %s)",
                     self.sigterm_id, format_time(self.sigterm_deadline))
        a.start_background()
        a.report_progress(step)
        self.install_excepthook()
        if not self.sync.due():
            return None
        try:
            agreed = self.sync.agree(self.contribution(), a.resume()[1], bool(a.path))
        except Exception as e:
            if not is_peer_loss(e):
                raise
            self.exits.peer_lost(e)
            raise PeerLost("spotagent: a peer of this job is gone (%s): exit %d, the job restarts from its last "
                           "committed checkpoint" % (str(e).strip(), EXIT_INTERRUPTED)) from e
        return self.agreed(agreed, step)

    def contribution(self) -> Tuple[int, int]:
        """This rank's entry in the collective: a stop, else its most urgent
        pending request (a SIGTERM checkpoint counts as shutdown)."""
        a = self._state
        with a.lock:
            if a.local_stop():
                code = STOP_CODES.get(a.stop_reason or "", 0)
                return ((STOP << ID_BITS) | code, NO_DEADLINE)
            best = NOTHING
            if self.sigterm_id is not None:
                best = encode(URGENCY["shutdown"], int(self.sigterm_id, 16), self.sigterm_deadline)
            keep = deque()  # type: Deque[CheckpointRequest]
            for req in a.requests:
                if req._conn != a.wire.conn or not a.wire.connected:
                    log.info("spotagent: dropping checkpoint %s: its connection was lost", req.id)
                    continue
                if req.id in self.agreed_ids:
                    # The answer to a join that came too late: the job
                    # saved at an earlier step; this rank's part is missing.
                    log.warning("spotagent: checkpoint %s arrived after the job saved it; refused", req.id)
                    a.send({"type": "failed", "id": req.id, "error": "rank %s: joined too late" % a.rank},
                            conn=req._conn)
                    continue
                rid = parse_id(req.id)
                if rid is None:
                    log.warning("spotagent: checkpoint id %r is not 12 hex digits; ignored in a distributed job", req.id)
                    continue
                keep.append(req)
                c = encode(URGENCY.get(req.reason, 1), rid, req.deadline)
                if c[0] > best[0]:
                    best = c
            a.requests = keep
            return best

    def agreed(self, agreed: Tuple[int, int], step: Optional[int]) -> "Optional[CheckpointRequest]":
        a = self._state
        urgency, idv, deadline = decode(agreed)
        if urgency == 0:
            return None
        if urgency >= STOP:
            self.sigterm_id = None  # the job stops anyway: no final checkpoint after it
            with a.lock:
                if not self.stopped:
                    self.stopped = True
                    self.stop_reason = STOP_REASONS.get(idv) or a.stop_reason or "stop"
                    a.cond.notify_all()
                    log.info("spotagent: the job stops (%s)", self.stop_reason)
            return None
        rid = format_id(idv)
        reason = REASONS.get(urgency, "periodic")
        sigterm, self.sigterm_id = self.sigterm_id, None
        with a.lock:
            self.agreed_ids[rid] = -1 if step is None else int(step)
            trim(self.agreed_ids, 256)
            if sigterm is not None and sigterm != rid:
                # Another rank's checkpoint, at least as urgent: this rank's
                # SIGTERM stops with it instead of taking a second one.
                self._sigterm.fold_by(deadline)
            for req in a.requests:
                if req.id == rid:
                    a.requests.remove(req)
                    req.deadline = deadline
                    return a.hand_out(req)
        joined = self.join(rid, reason, deadline, step)
        if sigterm == rid:
            if joined is None:
                a.stop("shutdown")
            else:
                mine = joined
                joined._after_done = lambda s: self.stop_after_commit(mine)
        return joined

    def offer_sigterm(self, step: Optional[int], world_size: Optional[int]) -> "Optional[CheckpointRequest]":
        """A single process that said its rank (torchrun with one process
        per node and one node, e.g. a TrainJob of 1 x 1) got SIGTERM: its
        checkpoint is offered to the agent as the job's (``join`` with a
        fresh id), so that an agent committing this node's part of a job
        (``--node-rank``: it refuses a checkpoint taken on one rank's own)
        asks for it and commits it. An agent of a whole checkpoint refuses
        a join from a world of one at once: None, and the process takes
        its own SIGTERM checkpoint as before. Only a world of one: ranks of
        a larger world without the agreement (``sync_every=0``) are single
        trainers, and their joins, each with an id of its own, would
        supersede one another at the agent."""
        a = self._state
        if a.rank is None or world_size != 1 or not a.path:
            return None
        rid = os.urandom(6).hex()
        joined = self.join(rid, "shutdown", self._sigterm.deadline(), step, quiet=True)
        if joined is None:
            return None
        req = joined
        log.info("spotagent: SIGTERM: the agent asked for the final checkpoint as the job's (%s)", req.id)
        req._after_done = lambda s: self.stop_after_commit(req)
        return req

    def join(self, rid: str, reason: str, deadline: Optional[datetime.datetime],
             step: Optional[int], quiet: bool = False) -> "Optional[CheckpointRequest]":
        """Ask this rank's agent for its directory for the job's checkpoint
        rid; bounded wait for its ``checkpoint``. None if it cannot answer
        (said, unless quiet)."""
        a = self._state
        if not a.path:
            if not quiet:
                self.join_failed(rid, "no agent")
            return None
        if deadline is None:
            # Every contribution carries a deadline (the agent's requests,
            # a SIGTERM's); should none, the join still needs one.
            deadline = self._sigterm.deadline()
        timeout = min(self.join_timeout, (deadline - utcnow()).total_seconds())
        if timeout <= 0:
            if not quiet:
                self.join_failed(rid, "its deadline has passed")
            return None
        msg = {"type": "join", "id": rid, "reason": reason, "deadline": format_time(deadline)}  # type: Dict[str, Any]
        n = valid_step(step)  # one the agent would refuse stays out (poll warned)
        if n is not None:
            msg["step"] = n

        def held() -> "Optional[CheckpointRequest]":
            for r in a.requests:
                if r.id == rid and r._conn == a.wire.conn:
                    return r
            return None

        with a.lock:
            if held() is None:  # another local rank's join may have brought it
                a.send(msg, conn=None)
            found = [None]  # type: List[Optional[CheckpointRequest]]

            def ready() -> bool:
                found[0] = held()
                return found[0] is not None or rid in a.errors or a.closed.is_set()

            a.cond.wait_for(ready, timeout)
            req = found[0]
            if req is None:
                why = a.errors.get(rid)
                if not quiet:
                    self.join_failed(rid, "agent: %s" % why if why is not None else "no answer within %.1fs" % timeout)
                return None
            # The agent abandoned what it had pending for this connection
            # when the job's checkpoint reached it: those were sent before it.
            got = req
            stale = [r for r in a.requests if r is not got and r._seq < got._seq]
            a.requests = deque(r for r in a.requests if r is not got and r._seq >= got._seq)
            req.reason = reason
            req.deadline = deadline
        for r in stale:
            log.info("spotagent: checkpoint %s superseded by the job's checkpoint %s", r.id, rid)
        return a.hand_out(req)

    def join_failed(self, rid: str, why: str) -> None:
        text = "spotagent: rank %s takes no part in the job's checkpoint %s (%s); that checkpoint will be incomplete" % (
            self._state.rank, rid, why)
        log.warning("%s", text)
        if not self._warned_join:
            self._warned_join = True
            stderr(text)

    def stop_after_commit(self, req: "CheckpointRequest") -> None:
        """After this rank's SIGTERM checkpoint: wait (bounded) until the
        agent committed it, then ask the job to stop at the next agreement."""
        a = self._state
        wait = self._sigterm.wait
        end = time.monotonic() + wait
        with a.lock:
            while req.id not in a.committed and req.id not in a.failed_uploads and not a.closed.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    log.warning("spotagent: SIGTERM checkpoint %s not confirmed within %.0fs", req.id, wait)
                    break
                a.cond.wait(left)
        a.stop("shutdown")


#: The exits of the distributed jobs' clients the exception hook speaks for.
_hooked = []  # type: List[Exits]
_prev_hook = None  # type: Any


def install_excepthook(exits: Exits) -> None:
    """Once per process, in a distributed job with an agent: an uncaught
    exception that is a peer loss (is_peer_loss: DDP's all-reduce failed
    because another node vanished) ends the process with 75 after the
    usual traceback, and writes 75 to $SPOTAGENT_EXIT_FILE; any other
    uncaught exception writes 1 there (a crash of this rank, which a local
    peer's later 75 must not hide) and exits 1 as Python does.
    SPOTAGENT_PEER_LOSS_EXIT=0 leaves sys.excepthook alone."""
    global _prev_hook
    if exits in _hooked:
        return
    if os.environ.get("SPOTAGENT_PEER_LOSS_EXIT", "1").strip().lower() in ("0", "false", "no"):
        return
    _hooked.append(exits)
    if _prev_hook is None:
        _prev_hook = sys.excepthook
        sys.excepthook = _excepthook


def _excepthook(tp: Any, value: Any, tb: Any) -> None:
    prev = _prev_hook if _prev_hook is not None else sys.__excepthook__
    prev(tp, value, tb)
    if value is None or not _hooked or isinstance(value, KeyboardInterrupt):
        return
    if not is_peer_loss(value):
        for e in _hooked:
            e.crashed()
        return
    for e in _hooked:
        e.peer_lost(value)  # writes 75 to the exit file
        e.close()
    stderr("spotagent: a peer of this job is gone: exiting %d (the job restarts from its last committed checkpoint)"
           % EXIT_INTERRUPTED)
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    # The interpreter would exit 1 after this hook; os._exit skips the
    # atexit handlers left (the agents are closed already).
    os._exit(EXIT_INTERRUPTED)
