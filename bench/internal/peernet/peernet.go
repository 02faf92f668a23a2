// Package peernet is spotbench's "peernet" section (issue 38's figure: a
// peer transfer ≥ 0.9 × one TCP stream between the same two hosts; local
// verification at disk or CRC32C speed, ≥ 1 GB/s per core).
//
// Two network namespaces joined by a veth pair stand for the two hosts.
// In the first, a child process (`spotbench peernet serve`) keeps a file
// in a real local tier (localtier, hard-linked from a request directory
// as a commit leaves it) and serves it with the real peer tier server
// (peertier.Start, its record and the job's secret in a file store both
// namespaces read), and beside it a plain TCP listener that sends the
// same file with sendfile(2) on each connection. In the second, a child
// (`spotbench peernet recv`) runs one transfer per command it is given:
//
//   - peer-file: peertier's Client asks node 0 for the file (signed, HTTP)
//     and checkpoint.CopyVerified writes it into a new file, verified by
//     size and BLAKE3 digest, as restore does;
//   - tcp-file: one TCP connection, the bytes written into a new file
//     through the same 1 MiB buffer, unverified;
//   - peer-null and tcp-null: the same, read into nothing.
//
// The parent (in the root namespace) alternates the modes, in reverse
// order every other round, and reads each child's CPU time (/proc/PID/stat) around each
// transfer. The local verification figure is the parent's: the kept
// copy read through the local tier and checked by its BLAKE3 digest into nothing,
// on one goroutine.
package peernet

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/bench/internal/report"
	"github.com/spotagent/spotagent/bench/internal/stats"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/localtier"
)

// Options of the section.
type Options struct {
	Self   string // the spotbench binary: the children run `Self peernet serve|recv`
	Work   string // scratch directory (the file, the tier, the store, the output)
	MiB    int    // the file's size
	Rounds int    // rounds of every mode (at least 5)
}

// Modes, in the order each round runs them.
var Modes = []string{"tcp-file", "peer-file", "tcp-null", "peer-null"}

// The addresses of the veth pair's ends: node 0 (server), node 1 (client).
const (
	addr0 = "10.239.0.1"
	addr1 = "10.239.0.2"
	runID = "bench-peernet"
)

// Result is one run of the section.
type Result struct {
	Rate      map[string][]float64 // MiB/s per transfer, by mode
	ServerCPU map[string][]float64 // CPU-s per GiB of the serving child
	ClientCPU map[string][]float64 // CPU-s per GiB of the receiving child
	Verify    []float64            // local verification, MB/s (wall)
	VerifyCPU []float64            // local verification, MB per CPU-second
	Copy      []float64            // local restore of the file (verified into a new file), MB/s (wall)
	CopyCPU   []float64            // the same, MB per CPU-second
}

// Bench runs the section and adds it to r. Without root or iproute2's ip
// it adds the section saying why it was skipped, and no error.
func Bench(r *report.Report, o Options) error {
	title := fmt.Sprintf("Peer transfer between two network namespaces (%d MiB)", o.MiB)
	if why := unavailable(); why != "" {
		r.Add(title, "Skipped: "+why+".\n")
		fmt.Fprintf(os.Stderr, "   peernet: skipped: %s\n", why)
		return nil
	}
	o.Rounds = max(o.Rounds, 5)
	res, err := Run(o)
	var ne noNetns
	if errors.As(err, &ne) {
		r.Add(title, fmt.Sprintf("Skipped: the network namespaces could not be made (%v).\n", ne.err))
		fmt.Fprintf(os.Stderr, "   peernet: skipped: %v\n", ne.err)
		return nil
	}
	if err != nil {
		return err
	}
	write(r, title, o, res)
	return nil
}

// unavailable says why the namespaces cannot be made here ("": they can).
func unavailable() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root (ip netns add); run `make bench` as root for this figure"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "iproute2's ip is not on PATH"
	}
	return ""
}

// noNetns: root, yet the namespaces or the veth pair could not be made
// (a container without CAP_SYS_ADMIN, no veth module): the section skips.
type noNetns struct{ err error }

func (e noNetns) Error() string { return e.err.Error() }

// pair is the two namespaces and their veth pair.
type pair struct{ ns [2]string }

func newPair() (*pair, error) {
	id := strconv.Itoa(os.Getpid() % 100000)
	p := &pair{ns: [2]string{"spbpn0-" + id, "spbpn1-" + id}}
	dev := [2]string{"spbpn" + id + "a", "spbpn" + id + "b"}
	addr := [2]string{addr0, addr1}
	steps := [][]string{{"netns", "add", p.ns[0]}, {"netns", "add", p.ns[1]},
		{"link", "add", dev[0], "netns", p.ns[0], "type", "veth", "peer", "name", dev[1], "netns", p.ns[1]}}
	for k := range 2 {
		steps = append(steps, []string{"-n", p.ns[k], "addr", "add", addr[k] + "/24", "dev", dev[k]},
			[]string{"-n", p.ns[k], "link", "set", dev[k], "up"}, []string{"-n", p.ns[k], "link", "set", "lo", "up"})
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			p.close()
			return nil, noNetns{fmt.Errorf("ip %s: %w: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))}
		}
	}
	return p, nil
}

func (p *pair) close() {
	for _, ns := range p.ns {
		exec.Command("ip", "netns", "del", ns).Run() // takes the veth pair with it
	}
}

// child is a `spotbench peernet` process in a namespace, driven line by
// line through its stdin and stdout.
type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func start(ns, self string, args ...string) (*child, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, self, "peernet"}, args...)...)
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true")
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil { // ip netns exec execs the command: the pid is the child's
		return nil, err
	}
	return &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}, nil
}

// line reads the child's next line; a line "error: ..." is its error.
func (c *child) line() (string, error) {
	if !c.out.Scan() {
		return "", fmt.Errorf("%s ended: %v", strings.Join(c.cmd.Args[3:], " "), c.out.Err())
	}
	s := c.out.Text()
	if e, ok := strings.CutPrefix(s, "error: "); ok {
		return "", errors.New(e)
	}
	return s, nil
}

func (c *child) stop() {
	c.in.Close() // the child exits when its stdin closes
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}

// cpu is the child's CPU seconds so far, user and system (/proc/PID/stat,
// in clock ticks of 1/100 s).
func (c *child) cpu() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3 (state): utime and stime are fields 14, 15
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", c.cmd.Process.Pid, len(f))
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	s, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (u + s) / 100, nil
}

// Run measures, without writing the report.
func Run(o Options) (*Result, error) {
	p, err := newPair()
	if err != nil {
		return nil, err
	}
	defer p.close()
	dir := filepath.Join(o.Work, "peernet")
	if err := os.MkdirAll(filepath.Join(dir, "root", "req"), 0o700); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	size := int64(o.MiB) << 20
	m, err := makeFile(filepath.Join(dir, "root", "req", "w.bin"), size)
	if err != nil {
		return nil, err
	}
	mj, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), mj, 0o600); err != nil {
		return nil, err
	}
	srv, err := start(p.ns[0], o.Self, "serve", dir)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	tcpAddr, err := srv.line()
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	cl, err := start(p.ns[1], o.Self, "recv", dir, tcpAddr)
	if err != nil {
		return nil, err
	}
	defer cl.stop()
	res := &Result{Rate: map[string][]float64{}, ServerCPU: map[string][]float64{}, ClientCPU: map[string][]float64{}}
	gib := float64(size) / (1 << 30)
	for round := -1; round < o.Rounds; round++ { // round -1 warms up: connects, reads the record
		order := slices.Clone(Modes)
		if round%2 != 0 {
			slices.Reverse(order) // ABBA: no mode always runs after the same one
		}
		for _, mode := range order {
			s0, err1 := srv.cpu()
			c0, err2 := cl.cpu()
			if _, err := fmt.Fprintln(cl.in, mode); err != nil {
				return nil, err
			}
			got, err := cl.line()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", mode, err)
			}
			s1, err3 := srv.cpu()
			c1, err4 := cl.cpu()
			if err := errors.Join(err1, err2, err3, err4); err != nil {
				return nil, err
			}
			rate, err := strconv.ParseFloat(got, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", mode, got, err)
			}
			if round < 0 {
				continue
			}
			res.Rate[mode] = append(res.Rate[mode], rate)
			res.ServerCPU[mode] = append(res.ServerCPU[mode], (s1-s0)/gib)
			res.ClientCPU[mode] = append(res.ClientCPU[mode], (c1-c0)/gib)
		}
		fmt.Fprintf(os.Stderr, "   peernet: round %d done\n", round+1)
	}
	if err := verifyLocal(dir, m, o.Rounds, res); err != nil {
		return nil, fmt.Errorf("local verification: %w", err)
	}
	return res, nil
}

// makeFile writes size random bytes to name and returns the manifest of
// a 2-node checkpoint whose parts both hold that file (data-parallel
// replicas): node 1 asks node 0 for it.
func makeFile(name string, size int64) (*checkpoint.Manifest, error) {
	w, err := os.Create(name)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	h := checkpoint.NewSums()
	buf := make([]byte, 4<<20)
	for left := size; left > 0; left -= int64(len(buf)) {
		b := buf[:min(int64(len(buf)), left)]
		rand.Read(b)
		h.Write(b)
		if _, err := w.Write(b); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	crc, dig := h.CRC32C(), h.Digest()
	m := &checkpoint.Manifest{Step: 1, ID: "c1", Parts: []checkpoint.PartInfo{{Node: "node-0"}, {Node: "node-1"}}}
	for _, part := range []string{"node-0", "node-1"} {
		m.Files = append(m.Files, checkpoint.File{Path: "w.bin", Key: part + "/w.bin", Size: size, CRC32C: crc, BLAKE3: dig, Part: part})
	}
	return m, nil
}

// verifyLocal reads node 0's kept copy through the local tier and checks
// its size and BLAKE3 digest (checkpoint.CopyDigestVerified into nothing), rounds
// times, on one goroutine: MB/s of wall clock and per CPU-second.
func verifyLocal(dir string, m *checkpoint.Manifest, rounds int, res *Result) error {
	parent, err := os.OpenRoot(filepath.Join(dir, "root"))
	if err != nil {
		return err
	}
	defer parent.Close()
	tier, err := localtier.Open(parent, "tier", localtier.Options{})
	if err != nil {
		return err
	}
	f := m.Files[0]
	out := filepath.Join(dir, "restored.bin")
	once := func(toFile bool) (wall, perCPU float64, err error) {
		c0 := selfCPU()
		t0 := time.Now()
		rc, err := tier.Open(context.Background(), m, f)
		if err != nil {
			return 0, 0, err
		}
		defer rc.Close()
		var w io.Writer = io.Discard
		if toFile {
			fw, err := os.Create(out)
			if err != nil {
				return 0, 0, err
			}
			defer os.Remove(out)
			defer fw.Close()
			w = fw
		}
		if err := checkpoint.CopyDigestVerified(w, rc, f, nil); err != nil {
			return 0, 0, err
		}
		if c, ok := w.(io.Closer); ok {
			if err := c.Close(); err != nil {
				return 0, 0, err
			}
		}
		mb := float64(f.Size) / 1e6
		return mb / time.Since(t0).Seconds(), mb / max(selfCPU()-c0, 0.01), nil
	}
	for i := range rounds + 1 {
		v, vc, err := once(false)
		if err != nil {
			return err
		}
		c, cc, err := once(true)
		if err != nil {
			return err
		}
		if i > 0 { // the first warms up
			res.Verify, res.VerifyCPU = append(res.Verify, v), append(res.VerifyCPU, vc)
			res.Copy, res.CopyCPU = append(res.Copy, c), append(res.CopyCPU, cc)
		}
	}
	return nil
}

func selfCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func write(r *report.Report, title string, o Options, res *Result) {
	var b strings.Builder
	fmt.Fprintf(&b, "Issue 38's figure between two \"hosts\": two network namespaces joined by a veth pair (MTU 1500) on this machine. "+
		"In one, `spotbench peernet serve` keeps a %d MiB file in a real local tier (hard-linked, as a commit leaves it) and serves it with the real peer tier server "+
		"(peertier.Start: signed HTTP, sendfile(2)), and beside it a plain TCP listener that sends the same file with sendfile(2). "+
		"In the other, `spotbench peernet recv` runs one transfer at a time: *peer-file* is the peer tier's client writing the file through `checkpoint.CopyVerified` "+
		"(size and BLAKE3 digest verified, as restore does); *tcp-file* is one TCP connection written into a new file through the same 1 MiB buffer, unverified; "+
		"*-null* read into nothing. The source file is in the page cache; the new files are on the work directory's file system (%s), written to the page cache "+
		"(no fsync) and removed after each transfer. %d rounds of the 4 modes alternating (the order reversed every other round), after one warm-up round; medians (min–max). "+
		"CPU: each child's user + system seconds (/proc/PID/stat) over the transfer, per GiB.\n\n", o.MiB, fsOf(o.Work), o.Rounds)
	b.WriteString("| mode | MiB/s | server CPU-s/GiB | client CPU-s/GiB |\n| --- | --- | --- | --- |\n")
	for _, m := range Modes {
		fmt.Fprintf(&b, "| %s | %s | %.2f | %.2f |\n", m, medRange(res.Rate[m], "%.0f"), stats.Median(res.ServerCPU[m]), stats.Median(res.ClientCPU[m]))
	}
	file := stats.Median(res.Rate["peer-file"]) / stats.Median(res.Rate["tcp-file"])
	null := stats.Median(res.Rate["peer-null"]) / stats.Median(res.Rate["tcp-null"])
	perCore := stats.Median(res.VerifyCPU) / 1e3
	fmt.Fprintf(&b, "\nRatios of the medians: peer-file ÷ tcp-file %.2f, peer-null ÷ tcp-null %.2f.\n\n", file, null)
	fmt.Fprintf(&b, "Local verification: node 0's kept copy read through the local tier (page cache) and checked by size and BLAKE3 digest (`checkpoint.CopyDigestVerified`), "+
		"one goroutine, %d runs after a warm-up: into nothing %s MB/s, %.2f GB per CPU-second; into a new file (a local restore) %s MB/s, %.2f GB per CPU-second.\n",
		len(res.Verify), medRange(res.Verify, "%.0f"), perCore, medRange(res.Copy, "%.0f"), stats.Median(res.CopyCPU)/1e3)
	r.Add(title, b.String())
	r.Command(fmt.Sprintf("spotbench -only peernet -peernet-mib %d   # root: ip netns add, a veth pair", o.MiB))
	r.Target(report.Target{Name: fmt.Sprintf("peer transfer into a verified file ÷ one TCP stream into a file, two network namespaces, %d MiB", o.MiB),
		Want: "≥ 0.9", Got: fmt.Sprintf("%.2f (into nothing: %.2f)", file, null), Met: file >= 0.9, Margin: fmt.Sprintf("%+.2f", file-0.9)})
	restore := stats.Median(res.CopyCPU) / 1e3
	r.Target(report.Target{Name: "local verification (BLAKE3 digest of the kept copy), per core", Want: "≥ 1 GB/s",
		Got: fmt.Sprintf("%.2f GB/s (written into a new file: %.2f)", perCore, restore), Met: min(perCore, restore) >= 1, Margin: fmt.Sprintf("%+.2f GB/s", min(perCore, restore)-1)})
}

func medRange(v []float64, f string) string {
	lo, hi := stats.MinMax(v)
	return fmt.Sprintf(f+" ("+f+"–"+f+")", stats.Median(v), lo, hi)
}

// fsOf names the file system dir is on (from /proc/mounts), for the report.
func fsOf(dir string) string {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return "unknown"
	}
	best, typ := "", "unknown"
	abs, _ := filepath.Abs(dir)
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		if (abs == f[1] || strings.HasPrefix(abs, strings.TrimSuffix(f[1], "/")+"/")) && len(f[1]) > len(best) {
			best, typ = f[1], f[2]
		}
	}
	return typ + " at " + best
}
