"""Non-blocking checkpoint saves for PyTorch (and anything picklable).

    import spotagent, spotagent.torch
    req = agent.poll(step)
    if req:
        spotagent.torch.save(req, model.state_dict(), "model.pt")
        spotagent.torch.save(req, optimizer.state_dict(), "optim.pt")
        req.done(step, metadata={"epoch": epoch})   # returns at once
    # training goes on while the files are written, fsynced and uploaded

``save`` copies every tensor to CPU memory in the caller -- the only part
that blocks training; large CPU tensors are copied in chunks by a few
threads, GPU tensors into pinned memory -- then writes the copy with ``torch.save`` in a
background thread and tells the agent (``saved``), which uploads it at once,
then fsyncs it. ``done`` goes to the agent when the last file of the
request is written and fsynced. The files of one request are written one at
a time, in the order of the ``save`` calls.

Memory: the staged copy is one more copy of the state in CPU RAM while it
is written. A request's first ``save`` waits while an earlier request's
files are still being written, so there is never more than one staged copy
(and its buffers are reused by the next checkpoint of the same shapes).
Use a plain blocking ``torch.save`` when the machine has no CPU RAM for a
second copy of the state.

torch is imported only when a tensor is met or a file is written: without
torch installed, ``save`` stages with ``copy.deepcopy`` and writes with
pickle.
"""

import copy
import os
import pickle
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from .request import CheckpointRequest

__all__ = ["save", "stage", "forget_buffers"]

_ATOMS = (type(None), bool, int, float, complex, str, bytes)

# Staging buffers kept for reuse: writing into a tensor allocated last time
# costs a memcpy, a fresh one also page faults (several times slower). Only
# the last request's buffers are kept (one staged copy), per agent; a save
# takes those of the same file name, else those of the save at the same
# position in the last request (a trainer that names files by step).
# Only ever used once the previous request's writes are over
# (CheckpointRequest.write_async waits for them).
Reuse = Dict[Tuple[Any, ...], Any]


class _Kept(object):
    def __init__(self) -> None:
        self.req = None  # type: Any  # the request filling cur
        self.prev = {}  # type: Dict[str, Reuse]  # the request before's, not yet taken
        self.prev_order = []  # type: List[str]
        self.cur = {}  # type: Dict[str, Reuse]
        self.cur_order = []  # type: List[str]


_kept = {}  # type: Dict[int, _Kept]  # by id(agent)
_buffers_lock = threading.Lock()


def _reuse_for(agent: Any, req: Any, name: str) -> Reuse:
    with _buffers_lock:
        k = _kept.setdefault(id(agent), _Kept())
        if k.req is not req:
            # A new request: the last one's buffers are the candidates;
            # anything older not taken by the last one is let go.
            k.prev, k.prev_order = k.cur, k.cur_order
            k.cur, k.cur_order, k.req = {}, [], req
        slot = len(k.cur_order)
        r = k.prev.pop(name, None)
        if r is None and slot < len(k.prev_order):
            r = k.prev.pop(k.prev_order[slot], None)
        if r is None:
            r = {}
        k.cur[name] = r
        k.cur_order.append(name)
        return r


def _torch() -> Any:
    return sys.modules.get("torch")


def stage(obj: Any, reuse: Optional[Dict[Tuple[Any, ...], Any]] = None) -> Any:
    """A copy of obj that later in-place updates of obj (an optimizer step)
    cannot reach: tensors are copied to CPU memory (into the same-shaped
    tensor from ``reuse``, else a new one: pinned for a GPU tensor), dicts,
    lists and tuples are rebuilt, immutable atoms shared, anything else
    deep-copied. Tensors shared within obj stay shared in the copy."""
    torch = _torch()
    memo = {}  # type: Dict[int, Any]
    syncs = set()  # type: Set[Any]  # GPUs with copies in flight
    fresh = {}  # type: Dict[Tuple[Any, ...], Any]

    def walk(x: Any, path: Tuple[Any, ...]) -> Any:
        if isinstance(x, _ATOMS):
            return x
        if torch is not None and isinstance(x, torch.Tensor):
            if id(x) in memo:
                return memo[id(x)]
            y = _copy_tensor(torch, x, None if reuse is None else reuse.get(path), syncs)
            memo[id(x)] = y
            fresh[path] = y
            return y
        if isinstance(x, dict):
            out = type(x)() if type(x) is not dict else {}  # type: Any
            for k, v in x.items():
                out[k] = walk(v, path + (k,))
            meta = getattr(x, "_metadata", None)  # a module state_dict's versions
            if meta is not None:
                out._metadata = copy.deepcopy(meta)
            return out
        if isinstance(x, list):
            return [walk(v, path + (i,)) for i, v in enumerate(x)]
        if isinstance(x, tuple) and type(x) is tuple:
            return tuple(walk(v, path + (i,)) for i, v in enumerate(x))
        return copy.deepcopy(x)

    out = walk(obj, ())
    for dev in syncs:
        # The copies were queued on the device's current stream, behind the
        # step that produced the tensors: wait for that stream only. A
        # device-wide synchronize would also wait for other streams' work
        # (NCCL's, a data prefetcher's) and count it as staging time.
        torch.cuda.current_stream(dev).synchronize()
    if reuse is not None:
        reuse.clear()
        reuse.update(fresh)
    return out


def _copy_tensor(torch: Any, t: Any, buf: Any, syncs: Set[Any]) -> Any:
    t = t.detach()
    if t.layout != torch.strided or t.is_quantized:
        # copy=True: a CPU tensor is copied too, never aliased.
        return t.to("cpu", copy=True)
    if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or not (buf.stride() == t.stride() or buf.is_contiguous()):
        buf = _empty_like(torch, t)
    if t.is_cuda and buf.is_pinned():
        # From the GPU into pinned memory: asynchronous DMA, waited for
        # once every tensor is queued (stage).
        buf.copy_(t, non_blocking=True)
        syncs.add(t.device)
    else:
        _copy_into(buf, t)
    return buf


def _empty_like(torch: Any, t: Any) -> Any:
    """A CPU tensor for t's copy: pinned (page-locked) for a contiguous GPU
    tensor, so that the copy is DMA; else with t's strides when t is dense
    (``empty_like``), contiguous otherwise."""
    if t.is_cuda and t.is_contiguous():
        try:
            return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        except RuntimeError:  # no page-locked memory to be had
            pass
    return torch.empty_like(t, device="cpu")


# Large CPU copies are split across a few threads: torch's copy_ releases
# the GIL, so on a machine with idle cores (training waits for staging
# anyway) the memcpy, and the page faults of a first checkpoint's fresh
# buffers, run in parallel.
_CHUNK = 16 << 20  # bytes per thread, at least
_pool = None  # type: Any
_pool_lock = threading.Lock()


def _workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _copy_into(buf: Any, t: Any) -> None:
    n = buf.numel()
    nbytes = n * buf.element_size()
    parts = min(_workers(), nbytes // _CHUNK)
    if parts < 2 or t.device.type != "cpu" or not (buf.is_contiguous() and t.is_contiguous()):
        buf.copy_(t)
        return
    global _pool
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(_workers() - 1, thread_name_prefix="spotagent-stage")
        pool = _pool
    dst, src = buf.view(-1), t.view(-1)
    step = (n + parts - 1) // parts
    futs = [pool.submit(dst[i : i + step].copy_, src[i : i + step]) for i in range(step, n, step)]
    dst[:step].copy_(src[:step])  # the caller's share
    for f in futs:
        f.result()


def save(req: CheckpointRequest, obj: Any, name: str, reuse_buffers: bool = True) -> None:
    """Stage obj now and write it to ``req.dir/name`` in the background (see
    the module doc). Returns once obj is staged; the time that took is
    reported to the agent as the checkpoint's blocking cost. Call
    ``req.done(step, metadata)`` after the request's last ``save``; check
    ``req.wait()`` or ``agent.close()`` (which waits) before exiting."""
    if str(name) in req._saved_names:  # before staging: its buffers are being written
        raise ValueError("spotagent: %s written twice for checkpoint %s" % (name, req.id))
    t0 = time.monotonic()
    host = req._host
    # Waits for an earlier request's writes: their buffers are the ones reused.
    host.await_background(req)
    reuse = _reuse_for(host, req, str(name)) if reuse_buffers else None
    staged = stage(obj, reuse)
    req._blocked += time.monotonic() - t0

    def write(f: Any) -> None:
        torch = _torch()
        if torch is not None:
            torch.save(staged, f)
        else:
            pickle.dump(staged, f, protocol=pickle.HIGHEST_PROTOCOL)

    req.write_async(name, write)


def forget_buffers() -> None:
    """Drop the staging buffers kept for reuse (frees their memory)."""
    with _buffers_lock:
        _kept.clear()
