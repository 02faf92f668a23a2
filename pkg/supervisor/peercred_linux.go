package supervisor

import (
	"fmt"
	"net"
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
