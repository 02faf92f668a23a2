"""torch.distributed.checkpoint (DCP) into a checkpoint request, and back
with each rank reading only its own shards.

    import spotagent, spotagent.dcp
    agent = spotagent.connect()
    state = {"model": sharded_model_state, "optim": sharded_optim_state}
    if agent.resume_dir:
        stats = spotagent.dcp.load(agent.resume_dir, state)   # in place
    ...
    req = agent.poll(step)
    if req:
        spotagent.dcp.save(req, state, step)                  # every rank

``save`` writes the state dict with DCP into ``req.dir`` (each rank its
``__<rank>_0.distcp``; the job's rank 0 ``.metadata``) and answers ``done``
on every rank once its files are written. Where torch has
``dcp.async_save`` (torch 2.3 on) and ``async_save`` is left True, the call
returns once the tensors are staged in CPU memory; the files are written
by DCP's background thread on a gloo group of this module's own (so the
save's collectives never meet training's), and ``done`` is sent when they
are. The returned handle's ``wait()`` waits for that.

Several nodes: a node's agent commits only its own ranks' files, and
restores only those (docs/distributed.md, "parts"). DCP's ``.metadata`` is
written by rank 0 alone, so the first rank of every other node writes a
copy of it as ``.metadata.node-<K>`` (a path no other node's part holds);
``load`` reads whichever is there.

``load`` reads the state dict in place with DCP's own planner: a rank reads
exactly the byte ranges of the shards its state dict holds (a DTensor or
ShardedTensor sharded as when saved: its own file only); a plain tensor is
read whole by every rank that holds it. ``LoadStats`` reports the bytes and
files this rank read.

torch is imported when these functions are called: this module is standard
library at import.
"""

import glob
import importlib
import os
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Set

__all__ = ["save", "load", "SaveHandle", "LoadStats", "METADATA", "metadata_copy_name"]

#: DCP's metadata file (written by the coordinator, rank 0).
METADATA = ".metadata"


def metadata_copy_name(node: int) -> str:
    """The name of node K's copy of the metadata."""
    return "%s.node-%d" % (METADATA, node)


def _env_int(name: str) -> Optional[int]:
    v = os.environ.get(name)
    try:
        return int(v) if v else None
    except ValueError:
        return None


def _node() -> int:
    for name in ("GROUP_RANK", "NODE_RANK"):
        v = _env_int(name)
        if v is not None:
            return v
    return 0


def _local_rank() -> int:
    v = _env_int("LOCAL_RANK")
    return 0 if v is None else v


_groups = {}  # type: Dict[Any, Any]
_groups_lock = threading.Lock()


def _gloo_group(dist: Any, group: Any) -> Any:
    """A gloo group over the ranks of group (the world when None), made once:
    every rank calls this at the same save (new_group is collective)."""
    with _groups_lock:
        key = id(group) if group is not None else None
        g = _groups.get(key)
        if g is None:
            ranks = None if group is None else dist.get_process_group_ranks(group)
            g = dist.new_group(ranks=ranks, backend="gloo")
            _groups[key] = g
        return g


class SaveHandle(object):
    """A DCP save into a request: ``wait()`` until this rank's files are
    written and ``done`` sent (or the request failed); ``error`` says why
    it failed."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error = None  # type: Optional[BaseException]
        #: Seconds the caller was blocked (staging, or the whole save).
        self.blocked = 0.0

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._done.wait(timeout)

    def _finish(self, error: Optional[BaseException] = None) -> None:
        self.error = error
        self._done.set()


def save(req: Any, state_dict: Mapping[str, Any], step: int, metadata: Optional[Mapping[str, Any]] = None,
         async_save: bool = True, process_group: Any = None) -> SaveHandle:
    """Writes state_dict with DCP into ``req.dir`` and answers the request
    with ``done(step, metadata)`` (``fail`` if the save raised). Every rank
    of the job calls it at the same step (the step poll returned the
    request at). See the module doc for async and several nodes."""
    dist = importlib.import_module("torch.distributed")
    dcp = importlib.import_module("torch.distributed.checkpoint")

    handle = SaveHandle()
    t0 = time.monotonic()
    distributed = dist.is_available() and dist.is_initialized()
    pg = _gloo_group(dist, process_group) if distributed else None
    writer = dcp.FileSystemWriter(req.dir)
    node, first = _node(), _local_rank() == 0

    def after(error: Optional[BaseException]) -> None:
        if error is None and distributed:
            try:
                _share_metadata(dist, pg, req.dir, node, first)
            except Exception as e:
                error = e
        if error is not None:
            req.fail("dcp save: %s" % error)
        else:
            req.done(step, metadata=metadata)
        handle._finish(error)

    if async_save and hasattr(dcp, "async_save") and distributed:
        try:
            fut = dcp.async_save(dict(state_dict), storage_writer=writer, process_group=pg)
        except Exception as e:
            handle.blocked = time.monotonic() - t0
            after(e)
            return handle
        handle.blocked = time.monotonic() - t0

        def wait() -> None:
            try:
                fut.result()
            except Exception as e:
                after(e)
                return
            after(None)

        threading.Thread(target=wait, name="spotagent-dcp-save", daemon=True).start()
        return handle
    try:
        dcp.save(dict(state_dict), storage_writer=writer, process_group=pg)
    except Exception as e:
        handle.blocked = time.monotonic() - t0
        after(e)
        return handle
    handle.blocked = time.monotonic() - t0
    after(None)
    return handle


def _share_metadata(dist: Any, pg: Any, dir: str, node: int, first: bool) -> None:
    """Rank 0's .metadata to the first rank of every other node, which
    writes it as .metadata.node-<K> (fsynced) into its own request dir."""
    blob = [None]  # type: List[Any]
    if dist.get_rank() == 0:
        with open(os.path.join(dir, METADATA), "rb") as f:
            blob[0] = f.read()
    src = dist.get_process_group_ranks(pg)[0] if pg is not None else 0
    dist.broadcast_object_list(blob, src=src, group=pg)
    if node == 0 or not first:
        return
    path = os.path.join(dir, metadata_copy_name(node))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(blob[0])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class LoadStats(object):
    """What one rank's ``load`` read: ``bytes`` (the shards' byte ranges),
    ``files`` (relative names), ``seconds``."""

    def __init__(self) -> None:
        self.bytes = 0
        self.files = set()  # type: Set[str]
        self.seconds = 0.0

    def __repr__(self) -> str:
        return "LoadStats(bytes=%d, files=%s, seconds=%.3f)" % (self.bytes, sorted(self.files), self.seconds)


def find_metadata(dir: str) -> Optional[str]:
    """The metadata file in a restored directory: DCP's own, else a node's copy."""
    p = os.path.join(dir, METADATA)
    if os.path.isfile(p):
        return p
    copies = sorted(glob.glob(os.path.join(glob.escape(dir), METADATA + ".node-*")))
    return copies[0] if copies else None


def load(dir: str, state_dict: Dict[str, Any], process_group: Any = None) -> LoadStats:
    """Reads a DCP checkpoint in ``dir`` (the agent's ``resume_dir``) into
    state_dict in place; every rank of the job calls it. Returns what this
    rank read."""
    import pickle

    found = find_metadata(dir)
    if found is None:
        raise FileNotFoundError("spotagent.dcp: no %s (or a node's copy) in %s" % (METADATA, dir))
    meta_path = found  # type: str
    dcp = importlib.import_module("torch.distributed.checkpoint")
    stats = LoadStats()
    base = dcp.FileSystemReader

    class Reader(base):  # type: ignore[misc, valid-type]
        def read_metadata(self) -> Any:
            with open(meta_path, "rb") as f:
                md = pickle.load(f)
            if getattr(md, "storage_meta", None) is not None:
                md.storage_meta.load_id = self.load_id
            return md

        def read_data(self, plan: Any, planner: Any) -> Any:
            seen = set()  # type: Set[Any]
            for item in plan.items:
                sd = self.storage_data[item.storage_index]
                key = (sd.relative_path, sd.offset, sd.length)
                if key not in seen:
                    seen.add(key)
                    stats.bytes += int(sd.length)
                    stats.files.add(str(sd.relative_path))
            return super().read_data(plan, planner)

    t0 = time.monotonic()
    dcp.load(state_dict, storage_reader=Reader(dir), process_group=process_group)
    stats.seconds = time.monotonic() - t0
    return stats
