package protocol

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
)

// peerCredentials identify the process at the other end of a connection.
type peerCredentials struct {
	UID int
	PID int
}

// peerCred reads SO_PEERCRED: the peer's credentials at connect time.
func peerCred(c *net.UnixConn) (peerCredentials, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return peerCredentials{}, fmt.Errorf("peer credentials: %w", err)
	}
	var (
		cred *syscall.Ucred
		gerr error
	)
	err = rc.Control(func(fd uintptr) {
		cred, gerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if err == nil {
		err = gerr
	}
	if err != nil {
		return peerCredentials{}, fmt.Errorf("peer credentials: %w", err)
	}
	return peerCredentials{UID: int(cred.Uid), PID: int(cred.Pid)}, nil
}

// fileOwner is the uid owning the file fi describes.
func fileOwner(fi os.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return -1, false
	}
	return int(st.Uid), true
}

// fdLimit is the soft limit on open files (0: unknown).
func fdLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0
	}
	return int(rl.Cur)
}

// peerIdentity names who is behind a connection, for binding node-mode
// run ids: "pod:<uid>" when the peer's cgroup is a Kubernetes pod's, else
// "uid:<uid>". The pid is only visible when the agent shares the peer's
// pid namespace (hostPID for a DaemonSet); otherwise it is 0 and the uid
// is all there is.
func peerIdentity(cred peerCredentials) string {
	if cred.PID > 0 {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(cred.PID) + "/cgroup"); err == nil {
			if pod := podFromCgroup(string(b)); pod != "" {
				return "pod:" + pod
			}
		}
	}
	return "uid:" + strconv.Itoa(cred.UID)
}
