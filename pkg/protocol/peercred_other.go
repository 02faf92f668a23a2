//go:build !linux

package protocol

import (
	"errors"
	"net"
	"os"
	"strconv"
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

// fileOwner is unknown off Linux: a private socket dir is then refused.
func fileOwner(os.FileInfo) (int, bool) { return -1, false }

func fdLimit() int { return 0 }

func peerIdentity(cred peerCredentials) string { return "uid:" + strconv.Itoa(cred.UID) }
