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
support`; so does every worker's client of the launcher's store
(`init_process_group` with `env://` under torchrun: the agent-store
client takes no use_libuv and defaults to libuv). `USE_LIBUV=0` reaches
only the stores made from a URL or by torch.distributed.elastic.utils.
Only when this torch has no libuv, this wrapper makes the launcher's stores
with use_libuv=False (the older, non-libuv TCPStore), sets USE_LIBUV=0,
and starts each worker through itself (`torchrun.py --worker SCRIPT ...`,
as `python -u` would run it) so that the worker's stores are made the same
way before the training script runs: the script needs no change.

    python3 python/examples/torchrun.py --nnodes 2 --node_rank K \\
        --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29500 \\
        python/examples/train_ddp.py

The integration tests and `make bench` launch ranks with it
(docs/distributed.md, "torchrun on Debian"; docs/frameworks.md).
"""

import os
import re
import runpy
import sys
from typing import Any, List

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


def _store_without_libuv() -> Any:
    real = dist.TCPStore

    def store(*args: Any, **kw: Any) -> Any:
        kw["use_libuv"] = False
        return real(*args, **kw)

    return store


def _worker(argv: List[str]) -> None:
    """A worker: its rendezvous stores without libuv, then the training
    script (or -m module) as python -u would run it."""
    import torch.distributed.rendezvous  # noqa: F401  (the name is a function: the module is in sys.modules)

    rdzv = sys.modules["torch.distributed.rendezvous"]
    rdzv.TCPStore = _store_without_libuv()  # type: ignore[misc, assignment]
    if argv and argv[0] == "-m":
        sys.argv = [argv[1]] + argv[2:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


def _without_libuv() -> None:
    os.environ["USE_LIBUV"] = "0"  # stores made by torch.distributed.elastic.utils, env:// URLs
    store = _store_without_libuv()
    from torch.distributed import run
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous, static_tcp_rendezvous

    static_tcp_rendezvous.TCPStore = store  # type: ignore[misc, assignment]
    c10d_rendezvous_backend.TCPStore = store  # type: ignore[misc, assignment]

    def server(self: Any, master_addr: str, master_port: int) -> Any:
        return store(host_name=master_addr, port=master_port, is_master=True, multi_tenant=True)

    dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server = server  # type: ignore[method-assign]

    real_config = run.config_from_args

    def config_from_args(args: Any) -> Any:
        config, cmd, cmd_args = real_config(args)
        if isinstance(cmd, str) and cmd_args[:1] == ["-u"]:
            # python -u SCRIPT ... -> python -u torchrun.py --worker SCRIPT ...
            cmd_args = ["-u", os.path.abspath(__file__), "--worker"] + cmd_args[1:]
        return config, cmd, cmd_args

    run.config_from_args = config_from_args


if hasattr(api, "_VALUE_REGEX") and getattr(api.Std, "from_str", None) is not None:
    try:
        broken = api.Std.from_str("0") is None
    except Exception:
        broken = True
    if broken:
        api.Std.from_str = classmethod(_from_str)  # type: ignore[assignment]

if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2:])
        sys.exit(0)
    if not _has_libuv():
        _without_libuv()
    sys.exit(main())
