package peernet

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/localtier"
	"github.com/spotagent/spotagent/pkg/checkpoint/peertier"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/liveness"
)

// Child is `spotbench peernet serve DIR` (node 0: the peer tier's server
// and the TCP listener; prints the listener's address) or `spotbench
// peernet recv DIR TCPADDR` (node 1: one transfer per mode read from
// stdin; prints its MiB/s). Both end when stdin closes. An error is
// printed as one line "error: ...".
func Child(args []string) int {
	var err error
	switch {
	case len(args) == 2 && args[0] == "serve":
		err = serve(args[1])
	case len(args) == 3 && args[0] == "recv":
		err = recv(args[1], args[2])
	default:
		err = fmt.Errorf("usage: spotbench peernet serve DIR | recv DIR TCPADDR")
	}
	if err != nil {
		fmt.Printf("error: %v\n", err)
		return 1
	}
	return 0
}

func readManifest(dir string) (*checkpoint.Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, err
	}
	var m checkpoint.Manifest
	return &m, json.Unmarshal(b, &m)
}

func serve(dir string) error {
	ctx := context.Background()
	m, err := readManifest(dir)
	if err != nil {
		return err
	}
	st, err := file.New(filepath.Join(dir, "store"))
	if err != nil {
		return err
	}
	parent, err := os.OpenRoot(filepath.Join(dir, "root"))
	if err != nil {
		return err
	}
	defer parent.Close()
	tier, err := localtier.Open(parent, "tier", localtier.Options{})
	if err != nil {
		return err
	}
	if err := tier.Keep(ctx, "req", m, "node-0", true); err != nil {
		return err
	}
	node, err := peertier.Start(ctx, peertier.Config{Store: st, RunID: runID, Node: "node-0", Session: "s0",
		Listen: addr0 + ":0", Advertise: []string{addr0}, Local: tier})
	if err != nil {
		return err
	}
	defer node.Close()
	ln, err := net.Listen("tcp", addr0+":0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				rc, err := tier.Open(ctx, m, m.Files[0]) // the kept copy the peer server sends
				if err != nil {
					return
				}
				defer rc.Close()
				io.Copy(c, rc) // *net.TCPConn's ReadFrom of an *os.File: sendfile(2)
			}()
		}
	}()
	fmt.Println(ln.Addr())
	io.Copy(io.Discard, os.Stdin) // until the parent closes it
	return nil
}

// discard is io.Discard without its ReadFrom (which reads through a small
// buffer of its own): the modes into nothing read through the same 1 MiB.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func recv(dir, tcpAddr string) error {
	ctx := context.Background()
	m, err := readManifest(dir)
	if err != nil {
		return err
	}
	st, err := file.New(filepath.Join(dir, "store"))
	if err != nil {
		return err
	}
	token, err := liveness.Token(ctx, st)
	if err != nil {
		return err
	}
	cl := peertier.NewClient(st, runID, "node-1", token, 0, nil)
	f := m.Files[1] // node 1's file: a replica of node 0's
	buf := make([]byte, 1<<20)
	out := filepath.Join(dir, "out.bin")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		mode := sc.Text()
		t0 := time.Now()
		var w *os.File
		if mode == "peer-file" || mode == "tcp-file" {
			if w, err = os.Create(out); err != nil {
				return err
			}
		}
		switch mode {
		case "peer-file", "peer-null":
			err = peerGet(ctx, cl, m, f, w, buf)
		case "tcp-file", "tcp-null":
			err = tcpGet(tcpAddr, f.Size, w, buf)
		default:
			err = fmt.Errorf("unknown mode %q", mode)
		}
		if w != nil {
			if cerr := w.Close(); err == nil {
				err = cerr
			}
		}
		took := time.Since(t0)
		if w != nil {
			os.Remove(out)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		fmt.Printf("%.3f\n", float64(f.Size)/(1<<20)/took.Seconds())
	}
	return sc.Err()
}

// peerGet is one peer transfer: into w through CopyVerified (restore's
// path), or, w nil, into nothing, checking only the byte count.
func peerGet(ctx context.Context, cl *peertier.Client, m *checkpoint.Manifest, f checkpoint.File, w *os.File, buf []byte) error {
	rc, err := cl.Open(ctx, m, f)
	if err != nil {
		return err
	}
	defer rc.Close()
	if w != nil {
		return checkpoint.CopyVerified(w, rc, f, &checkpoint.Progress{})
	}
	n, err := io.CopyBuffer(discard{}, rc, buf)
	if err == nil && n != f.Size {
		err = fmt.Errorf("%d of %d bytes", n, f.Size)
	}
	return err
}

// tcpGet is one plain TCP stream: a new connection, size bytes read
// through buf into w's own writes (not os.File's ReadFrom, which would
// splice) or into nothing.
func tcpGet(addr string, size int64, w *os.File, buf []byte) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	var dst io.Writer = discard{}
	if w != nil {
		dst = struct{ io.Writer }{w}
	}
	n, err := io.CopyBuffer(dst, io.LimitReader(c, size), buf)
	if err == nil && n != size {
		err = fmt.Errorf("%d of %d bytes", n, size)
	}
	return err
}
