# The overlap section's trainer (bench/cmd/spotbench/overlap.go): argv
# MODE BOOT. MODE "sleep": connects, boots in BOOT s (a sleep: a boot
# that takes no CPU from the restore), reads its resume step and checks the
# restored step file. MODE "torch": a real boot (import torch, connect,
# build a model of about 128 MiB), then loads the restored files as a
# real trainer does (model.pt into the model, each optim-*.pt with
# torch.load). Either way it then runs one step and prints the wall-clock
# time of each stage ("bench: t NAME SECONDS") and, at its first step,
# the CPU ticks of itself, of its parent (the agent) and of the machine
# ("bench: cpu ...") so that the bench sees who used the CPU meanwhile.
import os, sys, time

T0 = time.time()


def ticks(pid):
    with open("/proc/%s/stat" % pid) as f:
        s = f.read()
    f = s[s.rindex(")") + 2:].split()
    return int(f[11]) + int(f[12])


def machine():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)  # busy (all but idle, iowait), total


def mark(name, at=None):
    # the time, and this process's CPU ticks so far: the trainer's CPU by stage
    print("bench: t %s %.6f %d" % (name, time.time() if at is None else at, ticks("self")), flush=True)


mark("py_start", T0)
mode, boot = sys.argv[1], float(sys.argv[2])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
if mode == "torch":
    import torch
    from torch import nn
    mark("imported")
import spotagent

agent = spotagent.connect()
mark("connected")
if mode == "torch":
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)])  # 33.6 M parameters, 128 MiB
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
else:
    time.sleep(boot)
mark("booted")
step = agent.resume_step
mark("resumed")
if step is not None:
    import json
    d = agent.resume_dir
    with open(os.path.join(d, "step.json")) as f:
        assert json.load(f)["step"] == step, "restored step file disagrees"
    if mode == "torch":
        model.load_state_dict(torch.load(os.path.join(d, "model.pt"), map_location="cpu"))
        state = {}
        for n in sorted(os.listdir(d)):
            if n.startswith("optim-"):
                state.update(torch.load(os.path.join(d, n), map_location="cpu"))
        assert state, "no optimizer state restored"
mark("loaded")
if mode == "torch":
    x = torch.randn(8, 2048)
    model(x).sum().backward()
    opt.step()
agent.poll((step or 0) + 1)
at = time.time()
me, parent, (busy, total) = ticks("self"), ticks(os.getppid()), machine()
mark("first_step", at)
print("bench: first_step %.6f resumed %d" % (at, -1 if step is None else step), flush=True)
print("bench: cpu trainer %d agent %d agent_pid %d busy %d total %d" % (me, parent, os.getppid(), busy, total), flush=True)
agent.close()
