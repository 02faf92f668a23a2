#!/usr/bin/env python3
"""torchrun for Debian's python3-torch: 1.13 under Python 3.11 (bookworm),
and 2.x built without libuv (unstable).

On a normal PyTorch install, run `torchrun`; this file is only the
workaround for Debian's builds, with the same arguments torchrun takes. It
runs the real `torch.distributed.run.main()`: the real elastic agent,
rendezvous (c10d, static), restarts, signal handling and exit codes.

torch 1.13 (bookworm): `torchrun` dies at start under Python 3.11 with

    AttributeError: 'NoneType' object has no attribute 'get'   (in to_map)

`Std.from_str` finds the enum member for "0" (and "3") by iterating the
IntFlag `Std`, and from Python 3.11 on iterating a flag yields only its
single-bit members (OUT, ERR), so `--redirects 0`, torchrun's default,
becomes None. This wrapper parses the value with `Std(int(v))` instead.

torch 2.x without libuv (Debian unstable's 2.14): the TCPStore that the
static rendezvous (`--master-addr`/`--master-port`) and the c10d rendezvous
create asks for libuv, torch's default TCPStore backend since 2.4, and
fails with `use_libuv was requested but PyTorch was built without libuv
support`. `USE_LIBUV=0` reaches only the stores made from a URL or by
torch.distributed.elastic.utils (the workers' `env://` stores). This
wrapper sets USE_LIBUV=0 for the workers and makes the launcher's own
stores with use_libuv=False (the older, non-libuv TCPStore server), only
when this torch has no libuv.

    python3 python/examples/torchrun.py --nnodes 2 --node_rank K \\
        --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29500 \\
        python/examples/train_ddp.py

The integration tests and `make bench` launch ranks with it
(docs/distributed.md, "torchrun on Debian"; docs/frameworks.md).
"""

import os
import re
import sys
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import api
from torch.distributed.run import main


def _from_str(cls: Any, vm: str) -> Any:
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError("%s does not match: <%s> or <%s>" % (vm, api._VALUE_REGEX, api._MAPPING_REGEX))


def _has_libuv() -> bool:
    """Whether this torch's TCPStore has its libuv backend (a listening
    store on a free port, asked for libuv)."""
    try:
        s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    except TypeError:  # torch < 2.2: no use_libuv argument, no libuv default
        return True
    except RuntimeError as e:
        if "libuv" in str(e):
            return False
        raise
    del s
    return True


def _without_libuv() -> None:
    os.environ["USE_LIBUV"] = "0"  # the workers' env:// stores
    real = dist.TCPStore

    def store(*args: Any, **kw: Any) -> Any:
        kw["use_libuv"] = False
        return real(*args, **kw)

    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous, static_tcp_rendezvous

    static_tcp_rendezvous.TCPStore = store  # type: ignore[misc, assignment]
    c10d_rendezvous_backend.TCPStore = store  # type: ignore[misc, assignment]

    def server(self: Any, master_addr: str, master_port: int) -> Any:
        return store(host_name=master_addr, port=master_port, is_master=True, multi_tenant=True)

    dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server = server  # type: ignore[method-assign]


if hasattr(api, "_VALUE_REGEX") and getattr(api.Std, "from_str", None) is not None:
    try:
        broken = api.Std.from_str("0") is None
    except Exception:
        broken = True
    if broken:
        api.Std.from_str = classmethod(_from_str)  # type: ignore[assignment]

if os.environ.get("USE_LIBUV") == "0" or not _has_libuv():
    _without_libuv()

if __name__ == "__main__":
    sys.exit(main())
