"""What the agent says (``Inbox``): every message read from the socket
updates the trainer's state (``_state.State``) here, under its lock, on the
connection thread."""

from typing import Any, Dict, Optional, Tuple

from ._common import PROTOCOL_VERSION, URGENT_REASONS, log, parse_time, trim
from ._state import State
from ._transport import refuses_hello
from .request import CheckpointRequest, Committed


class Inbox(object):
    def __init__(self, state: State) -> None:
        self._state = state

    def update_request(self, msg: Dict[str, Any]) -> bool:
        """A ``checkpoint`` for an id this client already holds (pending, or
        returned by poll and not answered yet) updates its reason and
        deadline in place: the agent re-sends a pending periodic request when
        it becomes the interruption checkpoint, and answers a repeated join
        with the same request. True when msg was such a repeat."""
        a = self._state
        cid = str(msg.get("id") or "")
        if not cid:
            return False
        with a.lock:
            req = None  # type: Optional[CheckpointRequest]
            for r in a.requests:
                if r.id == cid and r._conn == a.wire.conn:
                    req = r
                    break
            if req is None:
                issued = a.issued.get(cid)
                if issued is not None and issued._conn == a.wire.conn:
                    req = issued
            if req is None:
                return False
            if not req._answered:
                reason = str(msg.get("reason") or "")
                if reason:
                    req.reason = reason
                if "deadline" in msg:
                    req.deadline = parse_time(msg.get("deadline"))
                if req.reason in URGENT_REASONS:
                    a.urgent = req
                a.cond.notify_all()
        return True

    # The restore's state (lock held). Final once resumed or failed.

    def restore_pending(self) -> None:
        a = self._state
        if a.resume_from_welcome is None and a.restore_error is None:
            a.restore_pending = True

    def restored(self, resume: Any) -> None:
        a = self._state
        if a.resume_from_welcome is not None or a.restore_error is not None:
            return
        parsed = (None, None, None)  # type: Tuple[Optional[str], Optional[int], Optional[Dict[str, Any]]]
        if isinstance(resume, dict) and resume.get("dir"):
            meta = resume.get("metadata")
            parsed = (
                str(resume["dir"]),
                int(resume["step"]) if resume.get("step") is not None else None,
                meta if isinstance(meta, dict) else None,
            )
        a.resume_from_welcome = parsed
        a.restore_pending = False

    def restore_failed(self, error: Any) -> None:
        a = self._state
        if a.resume_from_welcome is not None or a.restore_error is not None:
            return
        a.restore_error = str(error or "restore failed")
        a.restore_pending = False
        log.warning("spotagent: the agent's restore failed: %s", a.restore_error)

    def dispatch(self, msg: Dict[str, Any]) -> None:
        a = self._state
        t = msg["type"]
        if t == "welcome":
            restore = msg.get("restore")
            with a.lock:
                a.welcome = msg
                a.wire.welcomed()
                # Resume information is fixed by the first welcome that has
                # it: a reconnect mid-run must not change where this run
                # started. "pending": a restored or restore_failed follows.
                if restore == "pending":
                    self.restore_pending()
                elif restore == "failed":
                    self.restore_failed(msg.get("error"))
                else:
                    self.restored(msg.get("resume"))
                a.cond.notify_all()
            version = msg.get("version")
            if version is not None and (not isinstance(version, int) or version > PROTOCOL_VERSION or version < 1):
                log.warning("spotagent: agent speaks protocol version %r, this client %d", version, PROTOCOL_VERSION)
            a.welcomed.set()
        elif t == "restored":
            with a.lock:
                self.restored(msg.get("resume"))
                a.cond.notify_all()
        elif t == "restore_failed":
            with a.lock:
                self.restore_failed(msg.get("error"))
                a.cond.notify_all()
        elif t == "checkpoint":
            if self.update_request(msg):
                return
            with a.lock:
                conn = a.wire.conn
            req = CheckpointRequest(
                a,
                conn,
                id=str(msg.get("id") or ""),
                dir=str(msg.get("dir") or ""),
                reason=str(msg.get("reason") or ""),
                deadline=parse_time(msg.get("deadline")),
            )
            with a.lock:
                a.seq += 1
                req._seq = a.seq
                a.requests.append(req)
                if req.reason in URGENT_REASONS:
                    a.urgent = req
                a.cond.notify_all()
        elif t == "stop":
            deadline = parse_time(msg.get("deadline"))
            with a.lock:
                a.should_stop = True
                a.stop_reason = str(msg.get("reason") or "") or None
                a.stop_deadline = deadline
                a.cond.notify_all()
            log.info("spotagent: stop requested (%s)", msg.get("reason"))
        elif t == "committed":
            cid = str(msg.get("id") or "")
            with a.lock:
                step = msg.get("step")
                if not isinstance(step, int) or isinstance(step, bool):
                    step = a.done_steps.get(cid)
                c = Committed(cid, str(msg.get("uri") or ""), step)
                a.committed[cid] = c
                trim(a.committed, 256)
                a.last_committed = c
                a.cond.notify_all()
        elif t == "upload_failed":
            cid = str(msg.get("id") or "")
            err = str(msg.get("error") or "")
            log.warning("spotagent: checkpoint %s: upload failed: %s", cid, err)
            with a.lock:
                a.failed_uploads[cid] = err
                trim(a.failed_uploads, 256)
                a.cond.notify_all()
        elif t == "error":
            eid = str(msg.get("id") or "")
            if not eid and a.wire.before_welcome() and refuses_hello(msg):
                a.wire.hello_refused(msg)
                return
            log.warning("spotagent: agent reported an error: %s", msg.get("error"))
            if eid:
                with a.lock:
                    a.errors[eid] = str(msg.get("error") or "")
                    trim(a.errors, 256)
                    a.cond.notify_all()
            elif str(msg.get("error") or "").startswith("done:"):
                with a.lock:  # an own checkpoint refused: SigtermRequest.done stops waiting
                    a.done_refusals += 1
                    a.done_refusal = str(msg.get("error"))
                    a.cond.notify_all()
        else:
            log.debug("spotagent: unknown message type %r ignored", t)

