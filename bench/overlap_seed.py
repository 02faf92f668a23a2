# Seeds the overlap section's checkpoint (bench/cmd/spotbench/overlap.go)
# as bench/overlap_trainer.py's torch mode loads it: argv DIR BYTES STEP.
# DIR gets model.pt (the trainer's model's state_dict, 128 MiB), four
# optim-N.pt (one float32 tensor each, random: together BYTES in all) and
# step.json.
import json, os, sys

import torch
from torch import nn

d, total, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)])  # as the trainer builds it
torch.save(model.state_dict(), os.path.join(d, "model.pt"))
per = max(0, total - os.path.getsize(os.path.join(d, "model.pt"))) // 4 // 4
g = torch.Generator().manual_seed(51)
for i in range(4):
    torch.save({"exp_avg.%d" % i: torch.randn(per, generator=g)}, os.path.join(d, "optim-%d.pt" % i))
with open(os.path.join(d, "step.json"), "w") as f:
    json.dump({"step": step}, f)
