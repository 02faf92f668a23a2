package peerjob

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/bench/internal/proc"
)

// StopSurvivors takes the machines of the agents left running away: their
// ranks' connections closed, every agent SIGKILLed, and (torchrun) its
// ranks gone.
func (j *Job) StopSurvivors() {
	for _, r := range j.ranks {
		r.C.Close()
	}
	for _, a := range j.survivors {
		a.Kill()
	}
	j.ranks, j.survivors = nil, nil
	j.reap()
}

func (j *Job) sock(k int) string { return filepath.Join(j.Work, fmt.Sprintf("n%d.sock", k)) }

// startAgent starts node k's agent (name: its log's): a sidecar, or
// (Torchrun) `spotagent run` around node k's torchrun, its rendezvous on
// port.
func (j *Job) startAgent(ckpt string, k int, m Mode, name string, port int) (*proc.Agent, error) {
	os.Remove(j.sock(k)) // a killed agent's socket: a rank dials the new agent's only
	cmd := "sidecar"
	if j.Torchrun != nil {
		cmd = "run"
	}
	args := []string{cmd, "--store", j.URI, "--run-id", RunID, "--checkpoint-dir", ckpt,
		"--socket", j.sock(k), "--cloud", "none", "--log-format", "json",
		"--node-rank", strconv.Itoa(k), "--interval", "1h"}
	if name == "seed" {
		args[len(args)-1] = "300ms" // the seeding job asks for its checkpoint at once
	}
	if m.Peer {
		args = append(args, "--peer-restore", "--peer-listen", "127.0.0.1:0", "--peer-advertise", "127.0.0.1")
	}
	if m.Replicas {
		args = append(args, "--replicas", "1")
	}
	if j.Torchrun != nil {
		args = append(args, j.Torchrun.command(j.Shape, k, port)...)
	}
	return proc.StartAgent(j.Bin, args, j.Env, filepath.Join(j.Work, fmt.Sprintf("agent-%d-%s.log", k, name)))
}

// command is what follows `spotagent run`'s flags for node k: `--` and
// node k's torchrun of job sh, its rendezvous on port.
func (t *Torchrun) command(sh Shape, k, port int) []string {
	return []string{"--", t.Python, t.Launcher, "--nnodes", strconv.Itoa(sh.Nodes), "--node_rank", strconv.Itoa(k),
		"--nproc_per_node", strconv.Itoa(sh.Ranks), "--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(port),
		"--monitor_interval", "1", t.Trainer}
}

// reap waits until the ranks of the killed agents are gone (each agent's
// guard kills its trainer's process group), SIGKILLing any left after 30 s
// (and then waiting no more: a zombie answers signal 0 too).
func (j *Job) reap() {
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range j.pids {
		for syscall.Kill(pid, 0) == nil {
			if time.Now().After(deadline) {
				syscall.Kill(pid, syscall.SIGKILL)
				break
			}
			time.Sleep(20 * time.Millisecond) // a process's exit: no event to wait on
		}
	}
	j.pids = nil
}
