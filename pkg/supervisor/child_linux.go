package supervisor

import "syscall"

// childAttr puts the trainer in its own process group, and has the kernel
// kill it if the agent dies (kill -9, OOM): a trainer left behind would keep
// a GPU busy and reconnect to the next agent beside the trainer that agent
// starts. Pdeathsig follows the thread that started the child; the agent
// never locks goroutines to threads, so Go does not retire that thread.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
