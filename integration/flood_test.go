package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// Issue 46 item 2: a flood at a node's peer port. Unauthenticated
// keep-alive connections used to be held indefinitely: the agent reached
// 20,000 of 20,000 fds, its trainers could not connect and the next
// checkpoint failed; in a 256 MiB cgroup it was OOM-killed and the
// survivors exited 75. Here a job of two real agents (sidecars,
// --peer-restore, the ranks played over the real protocol) keeps
// committing periodic checkpoints while node 0's peer port is flooded
// from 40 loopback addresses; the agent's descriptors and RSS (read from
// /proc) stay within the bound the listener's caps imply. Every loopback
// address is one source now (internal/connlimit.Source), so the flood
// holds its 64, not 512: the whole cap is held in-process
// (peertier TestListenerBounds).

// The flood's bounds: loopback only, at most floodOpen connections open
// in this process at once, floodFor in all.
const (
	floodSources = 40 // 127.0.2.1 ... 127.0.2.40
	floodBatch   = 1000
	floodOpen    = 4 * floodBatch
	floodFor     = 3 * time.Minute
	// What the flood may add to the agent: the listener's cap (512
	// connections) and some slack for the agent's own churn; RSS: 512 ×
	// connMemory (64 KiB, measured 20 KB) is 32 MiB, doubled for the
	// collector's headroom, plus the race detector's (this binary is
	// built with -race: measured 98 and 110 MiB over in all).
	floodFDs = 512 + 64
	floodRSS = 192 << 20
)

// floodJob is the job under the flood: its agents, ranks and node 0's peer address.
type floodJob struct {
	agents     []*proc
	ranks      []*trainertest.Trainer
	sock0      string
	peer       string
	step       int64
	fds0, rss0 int64 // node 0's agent before any flood
}

func startFloodJob(t *testing.T) *floodJob {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: floods the race-built agent with thousands of connections (make test runs it)")
	}
	dir := testutil.ShortDir(t)
	uri := "file://" + filepath.Join(dir, "store")
	j := &floodJob{sock0: filepath.Join(dir, "n0.sock")}
	for k := range 2 {
		j.agents = append(j.agents, peerSidecar(t, nil, uri, dir, filepath.Join(dir, "ckpt"+strconv.Itoa(k)), k, "300ms"))
	}
	e := j.agents[0].waitEntry("peer tier: serving this node's local copies", time.Minute, nil)
	addrs, _ := e["addrs"].([]any)
	if len(addrs) == 0 {
		t.Fatalf("node 0's peer tier names no address: %v", e)
	}
	j.peer = addrs[0].(string)
	for r := range 2 {
		j.ranks = append(j.ranks, dialRank(t, filepath.Join(dir, "n"+strconv.Itoa(r)+".sock"), r, 2, 1))
	}
	j.commit(t)
	j.fds0, j.rss0 = procUsage(j.agents[0].cmd.Process.Pid)
	return j
}

// commit has both ranks save the next periodic checkpoint; both see it committed.
func (j *floodJob) commit(t *testing.T) {
	t.Helper()
	j.step++
	saveJobStep(t, j.ranks, j.step)
	for r, tr := range j.ranks {
		if _, ok := tr.Next(protocol.TypeCommitted, time.Minute); !ok {
			t.Fatalf("rank %d: step %d not committed", r, j.step)
		}
	}
}

// connects checks that a new client of node 0's socket is served (the
// agent has descriptors left for its trainers).
func (j *floodJob) connects(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := protocol.Dial(ctx, j.sock0)
	if err != nil {
		t.Fatalf("a trainer's connection to node 0's agent during the flood: %v", err)
	}
	defer c.Close()
	if err := c.Send(ctx, protocol.Message{Type: "status"}); err != nil {
		t.Fatalf("status: %v", err)
	}
	if m, err := c.Recv(ctx); err != nil || m.Type != protocol.TypeStatus {
		t.Fatalf("status: %+v, %v", m, err)
	}
}

// alive checks that no agent exited (none 75: no survivor was made to restart).
func (j *floodJob) alive(t *testing.T) {
	t.Helper()
	for k, a := range j.agents {
		select {
		case <-a.done:
			t.Fatalf("node %d's agent exited %d during the flood", k, a.code)
		default:
		}
	}
}

// usage samples a process's descriptors and RSS until stopped; it returns the peaks.
type usage struct {
	stop     chan struct{}
	done     chan struct{}
	fds, rss atomic.Int64
}

func sample(pid int) *usage {
	u := &usage{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(u.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			fds, rss := procUsage(pid)
			if fds > u.fds.Load() {
				u.fds.Store(fds)
			}
			if rss > u.rss.Load() {
				u.rss.Store(rss)
			}
			select {
			case <-u.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return u
}

func (u *usage) peaks() (fds, rss int64) {
	close(u.stop)
	<-u.done
	return u.fds.Load(), u.rss.Load()
}

// procUsage reads pid's open descriptors and resident set (bytes).
func procUsage(pid int) (fds, rss int64) {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss = kb << 10
		}
	}
	return int64(len(ents)), rss
}

// raiseNoFile raises this process's soft descriptor limit to the hard
// one, and skips the test when that is under need.
func raiseNoFile(t *testing.T, need uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			t.Fatal(err)
		}
	}
	if rl.Cur < need {
		t.Skipf("RLIMIT_NOFILE %d (hard), want %d for the flood's connections: raise ulimit -n", rl.Cur, need)
	}
}

// flood opens total connections to addr in batches of floodBatch from
// floodSources loopback addresses, keeping at most floodOpen open; each
// does what conn says with it, for at most hold, then it is closed. It
// returns how many connected, and ends by floodFor.
func flood(addr string, total int, hold time.Duration, conn func(c net.Conn, until time.Time)) (connected int64) {
	var n atomic.Int64
	end := time.Now().Add(floodFor)
	sem := make(chan struct{}, floodOpen/floodBatch)
	var wg sync.WaitGroup
	for b := 0; int(n.Load()) < total && time.Now().Before(end); b++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			var bw sync.WaitGroup
			for i := range floodBatch {
				src := fmt.Sprintf("127.0.2.%d", 1+(b*floodBatch+i)%floodSources)
				bw.Go(func() {
					d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 3 * time.Second}
					c, err := d.Dial("tcp", addr)
					if err != nil {
						return // the agent's queue is full: a connection not made
					}
					defer c.Close()
					n.Add(1)
					until := time.Now().Add(hold)
					c.SetDeadline(until)
					conn(c, until)
				})
			}
			bw.Wait()
		})
		// Time to commit between the batches is the test's: the flood goes on.
	}
	wg.Wait()
	return n.Load()
}

// floodAndCommit runs flood beside the job's periodic commits and checks
// the agent's peaks against the bound; it returns the connections made.
func floodAndCommit(t *testing.T, j *floodJob, run func() int64) int64 {
	t.Helper()
	pid := j.agents[0].cmd.Process.Pid
	// Against the agent before any flood: a second flood reuses the heap
	// the first grew, which the runtime keeps a while.
	fds0, rss0 := j.fds0, j.rss0
	u := sample(pid)
	var made atomic.Int64
	done := make(chan struct{})
	go func() { defer close(done); made.Store(run()) }()
	commits := 0
	for flooding := true; flooding; {
		select {
		case <-done:
			flooding = false
		default:
		}
		j.commit(t)
		j.connects(t)
		j.alive(t)
		commits++
	}
	fds, rss := u.peaks()
	t.Logf("flood of %d connections: node 0's agent at most %d fds (%d before the floods) and %d MiB RSS (%d MiB before); %d periodic checkpoints committed meanwhile (last step %d)",
		made.Load(), fds, fds0, rss>>20, rss0>>20, commits, j.step)
	if fds > fds0+floodFDs {
		t.Errorf("%d fds during the flood, want at most %d + %d", fds, fds0, floodFDs)
	}
	if rss > rss0+floodRSS {
		t.Errorf("%d MiB RSS during the flood, want at most %d + %d MiB", rss>>20, rss0>>20, floodRSS>>20)
	}
	if commits < 2 {
		t.Errorf("%d periodic checkpoints committed during the flood, want at least 2", commits)
	}
	// And after it: the job goes on.
	j.commit(t)
	j.alive(t)
	return made.Load()
}

// TestFlood_PeerPort: node 0's peer port flooded twice, one flood after
// the other, while the job keeps committing (one job for both: until #49
// they were two tests, each starting its own).
//   - Unauthenticated: 20,000 connections, half idle, half sending unsigned
//     requests and asking to be kept alive (each answer is followed by
//     another request while the connection lasts).
//   - SlowRequests: connections that send their header a byte every 500 ms
//     (slowloris), 4,000 of them, each for up to 12 s.
//
// Each flood's peaks are bounded over the agent's use before the first.
func TestFlood_PeerPort(t *testing.T) {
	parallelBusy(t)
	raiseNoFile(t, floodOpen+1024)
	j := startFloodJob(t)
	t.Run("Unauthenticated", func(t *testing.T) {
		const total = 20_000
		req := fmt.Sprintf("GET /spotagent/peer/v1/file?n=node-0&t=x&c=000000000001-abc&f=a.bin&s=1&e=%d&mac=00 HTTP/1.1\r\nHost: x\r\n\r\n",
			time.Now().Add(time.Hour).Unix())
		var asked atomic.Int64
		made := floodAndCommit(t, j, func() int64 {
			return flood(j.peer, total, 5*time.Second, func(c net.Conn, until time.Time) {
				if asked.Add(1)%2 == 0 {
					<-time.After(time.Until(until)) // idle: holds the connection, sends nothing
					return
				}
				buf := make([]byte, 4096)
				for time.Now().Before(until) {
					if _, err := c.Write([]byte(req)); err != nil {
						return
					}
					if _, err := c.Read(buf); err != nil {
						return // closed by the agent: only an authenticated request keeps its connection
					}
				}
			})
		})
		if made < total {
			t.Fatalf("%d connections made within %s, want %d", made, floodFor, total)
		}
	})
	t.Run("SlowRequests", func(t *testing.T) {
		const total = 4_000
		line := "GET /spotagent/peer/v1/file?n=node-0&t=x&c=000000000001-abc HTTP/1.1\r\nHost: x\r\nX-Slow: "
		var cut atomic.Int64
		made := floodAndCommit(t, j, func() int64 {
			return flood(j.peer, total, 12*time.Second, func(c net.Conn, until time.Time) {
				for i := 0; time.Now().Before(until); i++ {
					if _, err := c.Write([]byte{line[i%len(line)]}); err != nil {
						cut.Add(1) // the agent closed it: its header took too long
						return
					}
					<-time.After(500 * time.Millisecond) // the drip's pace, not a synchronisation
				}
			})
		})
		if made < total {
			t.Fatalf("%d connections made within %s, want %d", made, floodFor, total)
		}
		t.Logf("%d of %d slow connections cut off by the agent before the client's 12 s", cut.Load(), made)
	})
}
