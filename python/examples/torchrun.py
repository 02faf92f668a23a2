#!/usr/bin/env python3
"""torchrun for Debian's python3-torch 1.13 under Python 3.11.

On a normal PyTorch install, run `torchrun`; this file is only the
workaround for Debian bookworm's python3-torch (1.13) whose `torchrun`
dies at start under Python 3.11 with

    AttributeError: 'NoneType' object has no attribute 'get'   (in to_map)

`Std.from_str` finds the enum member for "0" (and "3") by iterating the
IntFlag `Std`, and from Python 3.11 on iterating a flag yields only its
single-bit members (OUT, ERR), so `--redirects 0`, torchrun's default,
becomes None. This wrapper parses the value with `Std(int(v))` instead and
then runs the real `torch.distributed.run.main()`: the real elastic agent,
rendezvous (c10d, static), restarts, signal handling and exit codes, with
the same arguments torchrun takes:

    python3 python/examples/torchrun.py --nnodes 2 --node_rank K \\
        --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29500 \\
        python/examples/train_ddp.py

The integration tests and `make bench` launch ranks with it
(docs/distributed.md, "torchrun on Debian").
"""

import re
import sys

from torch.distributed.elastic.multiprocessing import api
from torch.distributed.run import main


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError("%s does not match: <%s> or <%s>" % (vm, api._VALUE_REGEX, api._MAPPING_REGEX))


api.Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    sys.exit(main())
