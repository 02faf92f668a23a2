package peertier

import (
	"context"
	"crypto/rand"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// dirTier serves the files of one directory: the server's side of a
// transfer as a local tier's kept copy is (an *os.File).
type dirTier struct{ dir, held string }

func (d dirTier) Name() string   { return checkpoint.FromLocal }
func (d dirTier) Held() []string { return []string{d.held} }
func (d dirTier) Open(_ context.Context, _ *checkpoint.Manifest, f checkpoint.File) (io.ReadCloser, error) {
	return os.Open(filepath.Join(d.dir, f.Path))
}

// BenchmarkTransfer is one peer transfer against one plain TCP stream on
// the same loopback, in the same run, alternating (make bench's "Restore
// from a peer" measures it between agents; this is the tier alone):
//
//   - tcp: the file's bytes from memory over one connection, read 1 MiB at
//     a time into nothing: what the link carries;
//   - peer: the peer tier's client asking a node for the file (signed,
//     HTTP, sent with sendfile), read 1 MiB at a time into nothing;
//   - tcp-sendfile: the same stream sent from the file with sendfile(2),
//     as the peer server sends: on loopback it costs both ends more CPU
//     than a send from memory (the receiver copies from page-cache
//     pages), so it is the fair baseline there;
//   - tcp-file: the sendfile stream written to a new file, 1 MiB a write,
//     unverified;
//   - peer-file: the peer transfer written to a new file and verified by
//     CRC32C as restore does (checkpoint.CopyVerified).
//
// It reports the medians of 5 rounds per iteration: MiB/s, and the
// process's CPU (both ends, user + system) per GiB, which a shared
// machine disturbs far less than the rates; peer/tcp and
// peer/tcp-sendfile and peer-file/tcp-file are the rates' ratios. Between two hosts, a mode
// keeps up with a link of L GiB/s while each end's share of its cpu-s/GiB
// stays under 1/L per core it has.
// PEER_BENCH_MIB sets the file's size (default 256).
func BenchmarkTransfer(b *testing.B) {
	size := int64(256)
	if s, err := strconv.ParseInt(os.Getenv("PEER_BENCH_MIB"), 10, 64); err == nil && s > 0 {
		size = s
	}
	size <<= 20
	dir := b.TempDir()
	content := make([]byte, size)
	rand.Read(content)
	if err := os.WriteFile(filepath.Join(dir, "w.bin"), content, 0o600); err != nil {
		b.Fatal(err)
	}
	crc := fmt.Sprintf("%08x", crc32.Checksum(content, crc32.MakeTable(crc32.Castagnoli)))
	m := &checkpoint.Manifest{Step: 1, ID: "c1", Parts: []checkpoint.PartInfo{{Node: "node-0"}, {Node: "node-1"}}}
	for _, part := range []string{"node-0", "node-1"} {
		m.Files = append(m.Files, checkpoint.File{Path: "w.bin", Key: part + "/w.bin", Size: size, CRC32C: crc, Part: part})
	}
	f := m.Files[1]
	src := filepath.Join(dir, "w.bin")
	st := storesim.New()
	p0, err := Start(context.Background(), Config{Store: st, RunID: "run", Node: "node-0", Listen: "127.0.0.1:0",
		Advertise: []string{"127.0.0.1"}, Local: dirTier{dir: dir, held: folder(m)}})
	if err != nil {
		b.Fatal(err)
	}
	defer p0.Close()
	cl := NewClient(st, "run", "node-1", p0.token, 0, nil)
	buf := make([]byte, 1<<20)
	out := filepath.Join(b.TempDir(), "out.bin")
	peer := func(toFile bool) float64 {
		t0 := time.Now()
		rc, err := cl.Open(context.Background(), m, f)
		if err != nil {
			b.Fatal(err)
		}
		defer rc.Close()
		if !toFile {
			if n, err := io.CopyBuffer(discard{}, rc, buf); err != nil || n != size {
				b.Fatalf("peer: %d of %d bytes: %v", n, size, err)
			}
			return rate(size, t0)
		}
		w := openOut(b, out)
		defer w.Close()
		if err := checkpoint.CopyVerified(w, rc, f, &checkpoint.Progress{}); err != nil {
			b.Fatal(err)
		}
		return rate(size, t0)
	}
	peer(false) // the first reads the record and connects
	b.SetBytes(4 * 5 * size)
	b.ResetTimer()
	for range b.N {
		var rates, cpus [5][]float64
		for range 5 {
			for i, run := range []func() float64{
				func() float64 { return tcpStream(b, content, "", nil, buf) },
				func() float64 { return tcpStream(b, content, src, nil, buf) },
				func() float64 { return tcpStream(b, content, src, openOut(b, out), buf) },
				func() float64 { return peer(false) },
				func() float64 { return peer(true) },
			} {
				c0 := cpuTime(b)
				rates[i] = append(rates[i], run())
				cpus[i] = append(cpus[i], (cpuTime(b)-c0)/(float64(size)/(1<<30)))
			}
		}
		for i, name := range []string{"tcp", "tcp-sendfile", "tcp-file", "peer", "peer-file"} {
			b.ReportMetric(median(rates[i]), name+"-MiB/s")
			b.ReportMetric(median(cpus[i]), name+"-cpu-s/GiB")
		}
		b.ReportMetric(median(rates[3])/median(rates[0]), "peer/tcp")
		b.ReportMetric(median(rates[3])/median(rates[1]), "peer/tcp-sendfile")
		b.ReportMetric(median(rates[4])/median(rates[2]), "peer-file/tcp-file")
	}
}

func rate(n int64, t0 time.Time) float64 { return float64(n) / (1 << 20) / time.Since(t0).Seconds() }

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func openOut(b *testing.B, name string) *os.File {
	w, err := os.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// tcpStream sends content over one new loopback connection, 1 MiB a write
// (or, with from, the file from by sendfile), and reads it through buf
// into nothing or, when out is not nil, into out (closed): MiB/s from the
// dial to the last byte.
func tcpStream(b *testing.B, content []byte, from string, out *os.File, buf []byte) float64 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if from != "" {
			f, err := os.Open(from)
			if err != nil {
				return
			}
			defer f.Close()
			io.Copy(c, f) // *net.TCPConn's ReadFrom: sendfile
			return
		}
		for off := 0; off < len(content); off += 1 << 20 {
			if _, err := c.Write(content[off:min(off+1<<20, len(content))]); err != nil {
				return
			}
		}
	}()
	t0 := time.Now()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var w io.Writer = discard{}
	if out != nil {
		defer out.Close()
		w = struct{ io.Writer }{out} // its own writes, not os.File's ReadFrom (splice)
	}
	n, err := io.CopyBuffer(w, io.LimitReader(c, int64(len(content))), buf)
	if err != nil || n != int64(len(content)) {
		b.Fatalf("tcp: %d of %d bytes: %v", n, len(content), err)
	}
	r := rate(n, t0)
	<-done
	return r
}

func median(v []float64) float64 {
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}

// cpuTime is the process's CPU seconds so far, user and system.
func cpuTime(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
