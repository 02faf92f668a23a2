"""Agreement between the ranks of a torch.distributed job (protocol v1, #15).

Every rank's ``poll`` contributes its pending request to ONE all_reduce(MAX)
of an int64 CPU tensor of two elements, every ``sync_every`` calls:

    [ urgency << 48 | int(id, 16),  -deadline_ms ]     (nothing: [0, -2**62])

so every rank learns the job's request -- the highest urgency (ties: the
highest id) with the earliest deadline -- at the same call, and saves the same
step. Urgency 5 is "stop": a rank whose agent said ``stop`` contributes it and
every rank's ``should_stop`` turns true at that same call.

torch is imported only when it is already loaded (``sys.modules``) or when the
caller hands over a process group: the client stays standard-library only.
"""

import datetime
import sys
from typing import Any, Optional, Tuple

#: Urgency of a request, by reason; the collective keeps the highest.
URGENCY = {"periodic": 1, "manual": 2, "shutdown": 3, "interruption": 4}
REASONS = {v: k for k, v in URGENCY.items()}
#: A rank whose agent (or SIGTERM) stops it: every rank stops at this sync.
STOP = 5
#: Low bits of a STOP contribution: why (the highest wins, so exit codes agree).
STOP_CODES = {"shutdown": 1, "interruption": 2}
STOP_REASONS = {v: k for k, v in STOP_CODES.items()}

ID_BITS = 48
ID_MASK = (1 << ID_BITS) - 1
#: The second element when there is no deadline (-deadline_ms is never this low).
NO_DEADLINE = -(1 << 62)
NOTHING = (0, NO_DEADLINE)

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


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


class Sync(object):
    """The collective of one process. ``detect`` finds the process group
    lazily (``connect`` may run before ``init_process_group``); once it sees
    an initialised group of more than one rank, the agreement is on for good.
    On a non-gloo group (NCCL) it creates a gloo group over the same ranks
    there -- itself a collective, reached by every rank at the same call --
    so the agreement never touches the GPU."""

    def __init__(self, process_group: Any = None, every: int = 1) -> None:
        self.every = int(every)  # 0: the agreement is off
        self.calls = 0  # polls since the agreement was switched on
        self.agreements = 0  # collectives run
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
        if self.every <= 0:
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
            ranks = None
            if self._user_group is not None:
                ranks = sorted(dist.distributed_c10d._pg_group_ranks[pg].keys())
            group = dist.new_group(ranks=ranks, backend="gloo")
        self._torch = sys.modules["torch"]
        self._group = group
        self.rank = dist.get_rank()
        self.world_size = world
        self.active = True
        return True

    def due(self) -> bool:
        """Count one poll; True when this one runs the collective."""
        self.calls += 1
        return (self.calls - 1) % self.every == 0

    def agree(self, mine: Tuple[int, int], resumed: Optional[int] = None, agent: bool = True) -> Tuple[int, int]:
        """The job's (MAX) entry. The first agreement also checks, in the
        same all_reduce, that every rank with an agent resumed from the same
        step (None: started fresh): the nodes restore their parts on their
        own, and a rank on another step would hang or corrupt the job."""
        first = self.agreements == 0
        self.agreements += 1
        vals = list(mine)
        if first:
            r = -1 if resumed is None else int(resumed)
            vals += [r, -r] if agent else [-(1 << 62), -(1 << 62)]  # no agent: no say
        t = self._torch.tensor(vals, dtype=self._torch.int64)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self._group)
        out = t.tolist()
        if first and out[2] != -(1 << 62) and out[2] != -out[3]:
            hi, lo = out[2], -out[3]
            raise RuntimeError(
                "spotagent: the ranks of this job resumed from different checkpoints "
                "(steps %s to %s; -1: none): a node restored an older one (see its agent's log)"
                % (lo, hi))
        return (out[0], out[1])


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
