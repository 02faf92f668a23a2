//go:build !linux

package supervisor

import (
	"errors"
	"net"
)

// peerCredentials identify the process at the other end of a connection.
type peerCredentials struct {
	UID int
	PID int
}

// peerCred is only implemented on Linux; elsewhere every peer is refused
// rather than let in unchecked.
func peerCred(*net.UnixConn) (peerCredentials, error) {
	return peerCredentials{}, errors.New("peer credentials: unsupported on this platform")
}
