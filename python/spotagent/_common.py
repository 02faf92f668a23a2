"""Constants and small helpers shared by the client's modules (no state)."""

import datetime
import json
import logging
import os
import re
import socket
import sys
from collections import OrderedDict
from typing import Any, Dict, Mapping, Optional, Tuple

log = logging.getLogger("spotagent")

#: Longest line either side accepts, newline included (pkg/protocol maxLine).
MAX_LINE = 1 << 20
#: Largest ``done`` metadata the agent accepts (encoded JSON bytes).
MAX_METADATA = 64 << 10
#: Largest step the agent accepts (pkg/protocol MaxStep: 2^53, exact in a
#: float64); steps are 0..MAX_STEP.
MAX_STEP = 1 << 53
#: Protocol version this client speaks (sent in hello). 2: the agent may
#: restore while the trainer starts (welcome ``restore: "pending"``, then
#: ``restored`` or ``restore_failed``).
PROTOCOL_VERSION = 2
#: Exit code meaning "interrupted: the checkpoint is committed (or a best
#: effort was made), run me again" (EX_TEMPFAIL). ``agent.exit_code`` is this
#: after a stop for an interruption or shutdown; ``spotagent run`` exits with
#: it too, and orchestrators restart on it (a Kubernetes Job's
#: podFailurePolicy ignores it, systemd's Restart=on-failure restarts).
#: The same as the agent's protocol.ExitInterrupted (pkg/protocol/exitcodes.go).
EXIT_INTERRUPTED = 75
#: Exit code meaning "fenced: a newer session of this run owns it now; this
#: copy's work is not finished, but running it again here would only be
#: fenced again". Never 0: a Kubernetes Job whose trainer was fenced must not
#: be Succeeded. ``spotagent run`` exits with it too (pkg/supervisor exitFenced).
EXIT_FENCED = 76
#: Stop reasons the agent sends (pkg/protocol Reason*, supervisor reasonFenced).
STOP_INTERRUPTION = "interruption"
STOP_SHUTDOWN = "shutdown"
STOP_FENCED = "fenced"
#: The exit code of each stop reason, the same table as the agent's
#: (docs/protocol.md, "Exit codes"). A stop whose reason is missing or not
#: known is never "finished": it gets EXIT_INTERRUPTED.
STOP_EXIT_CODES = {
    STOP_INTERRUPTION: EXIT_INTERRUPTED,
    STOP_SHUTDOWN: EXIT_INTERRUPTED,
    STOP_FENCED: EXIT_FENCED,
}
#: Reasons of a request the trainer must treat as the last one before a stop.
URGENT_REASONS = (STOP_INTERRUPTION, STOP_SHUTDOWN, STOP_FENCED)


def exit_code_for_stop(reason: Optional[str]) -> int:
    """The exit code of a trainer stopped for ``reason`` (see STOP_EXIT_CODES)."""
    return STOP_EXIT_CODES.get(reason or "", EXIT_INTERRUPTED)

ENV_SOCKET = "SPOTAGENT_SOCKET"
ENV_RUN_ID = "SPOTAGENT_RUN_ID"
ENV_CHECKPOINT_DIR = "SPOTAGENT_CHECKPOINT_DIR"
ENV_RESUME_DIR = "SPOTAGENT_RESUME_DIR"
ENV_RESUME_STEP = "SPOTAGENT_RESUME_STEP"
ENV_RESUME_MANIFEST = "SPOTAGENT_RESUME_MANIFEST"
#: ``pending``: the agent restores while the trainer starts; where to resume
#: from comes over the socket (``restored``), never from the variables above.
ENV_RESUME = "SPOTAGENT_RESUME"
#: The uid the agent runs as; set by ``spotagent run`` for its trainer. When
#: absent the client accepts an agent running as itself or as root.
ENV_AGENT_UID = "SPOTAGENT_AGENT_UID"
#: Set to 1 to train on, without an agent, after the agent refused this
#: trainer for good (connect(allow_unprotected=True) does the same).
ENV_ALLOW_UNPROTECTED = "SPOTAGENT_ALLOW_UNPROTECTED"

#: Outbound messages kept while the agent is not reading (progress is
# coalesced, so these are done/failed messages). Beyond this, the oldest are
# dropped with a warning rather than growing without bound.
MAX_OUTBOUND = 1024
BACKOFF_MIN = 0.1
BACKOFF_MAX = 2.0
#: Polls between two agreements of a torch.distributed job's ranks (see
#: dist.py and README "Distributed jobs"); $SPOTAGENT_SYNC_EVERY overrides.
DEFAULT_SYNC_EVERY = -1  # auto: dist.Sync picks k from measured step and collective times
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


def valid_step(step: Any) -> Optional[int]:
    """step as the int the agent accepts (0..MAX_STEP), or None."""
    try:
        n = int(step)
    except (TypeError, ValueError, OverflowError):
        return None
    return n if 0 <= n <= MAX_STEP else None


def check_step(step: Any) -> int:
    """step as an int the agent accepts; ValueError (in the caller) for
    anything else: the agent would refuse the message with it."""
    n = valid_step(step)
    if n is None:
        raise ValueError("spotagent: step %r out of range (0..%d): report the number of completed steps"
                         % (step, MAX_STEP))
    return n


def stderr(msg: str) -> None:
    try:
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        log.warning("spotagent: ignoring %s=%r: not a number", name, os.environ.get(name))
        return default

TIME_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:?\d{2})?$"
)


def parse_time(value: Any) -> Optional[datetime.datetime]:
    """Parse an RFC 3339 time as Go marshals it (nanoseconds, ``Z``) into a
    timezone-aware datetime; None for null, empty or unparseable input."""
    if not value or not isinstance(value, str):
        return None
    m = TIME_RE.match(value.strip())
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


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def format_time(t: datetime.datetime) -> str:
    """RFC 3339 in UTC with milliseconds, as Go's time.Time unmarshals it."""
    return t.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_line(msg: Mapping[str, Any]) -> bytes:
    return (json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def metadata_dict(metadata: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError("spotagent: metadata must be a mapping, not %s" % type(metadata).__name__)
    return dict(metadata)


def trim(d: "OrderedDict[Any, Any]", n: int) -> None:
    while len(d) > n:
        d.popitem(last=False)


def shutdown_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def env_int(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    value = (os.environ if env is None else env).get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        log.warning("spotagent: $%s=%r is not an integer; ignored", name, value)
        return None


def first_int(env: Mapping[str, str], *names: str) -> Optional[int]:
    for name in names:
        v = env_int(name, env)
        if v is not None:
            return v
    return None


def resume_from_env(env: Mapping[str, str]) -> Tuple[Optional[str], Optional[int], Optional[Dict[str, Any]]]:
    rdir = env.get(ENV_RESUME_DIR) or None
    if not rdir:
        return (None, None, None)
    step = env_int(ENV_RESUME_STEP, env)
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
