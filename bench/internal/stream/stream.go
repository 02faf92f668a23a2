// Package stream measures byte streams the way spotbench compares them:
// read CopyBufSize at a time into nothing (Discard); Loopback is one TCP
// stream's rate on this machine, the bound of a transfer over loopback.
package stream

import (
	"fmt"
	"io"
	"net"
	"time"
)

// Loopback is one TCP stream's rate on loopback, MiB/s: n bytes from
// memory to a reader that discards them.
func Loopback(n int64) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 1<<20)
		for left := n; left > 0; left -= int64(len(buf)) {
			if _, err := c.Write(buf[:min(left, int64(len(buf)))]); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	t0 := time.Now()
	got, err := io.CopyBuffer(Discard{}, io.LimitReader(c, n), make([]byte, CopyBufSize))
	if err != nil || got != n {
		return 0, fmt.Errorf("loopback stream: %d of %d bytes: %v", got, n, err)
	}
	return float64(n) / (1 << 20) / time.Since(t0).Seconds(), nil
}

// Streams are read the same way: CopyBufSize at a time, into nothing
// (io.Discard would read 8 KiB at a time through its own buffers).
const CopyBufSize = 1 << 20

// Discard is a writer that keeps nothing, for io.CopyBuffer.
type Discard struct{}

// Write discards p.
func (Discard) Write(p []byte) (int, error) { return len(p), nil }
