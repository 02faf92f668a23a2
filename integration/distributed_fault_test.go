package integration

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// Issue 15 item 9, with the real binary: two sidecar agents (one per node,
// --node-rank), four ranks played by the test over the real protocol (the
// agreement is the Python client's, tested in python/tests/test_dist.py;
// here the test joins the id the rank-0 node's schedule asks for), and
// SIGKILL of either agent at a random moment of the job-wide commit.

// distTrials is how many seeded kill trials run: 20 in make test, 200
// under make soak (SPOTAGENT_SOAK), SPOTAGENT_DIST_TRIALS overrides.
func distTrials(t *testing.T) int {
	if v := os.Getenv("SPOTAGENT_DIST_TRIALS"); v != "" {
		return atoi(t, v)
	}
	if os.Getenv("SPOTAGENT_SOAK") != "" {
		return 200
	}
	return 20
}

// dialRank connects rank r of a job of world ranks, perNode a node (as
// the real ranks are placed), to its node's agent at sock, and says hello.
// The ranks are trainertest's Trainer: the protocol's Go client, driven by
// the test.
func dialRank(t *testing.T, sock string, r, world, perNode int) *trainertest.Trainer {
	t.Helper()
	tr := trainertest.DialWithin(t, sock, time.Minute)
	tr.HelloRank(r, world, perNode)
	return tr
}

// rankFile is what rank r writes at step: its content names both, so a
// restore can tell a mixed checkpoint.
func rankFile(step int64, r int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("step=%d rank=%d\n", step, r)), (1<<20)/16)
}

// saveJobStep has every rank save step for the request the rank-0 node
// asked for (the other node's ranks join it), answering done; it returns
// the request's id.
func saveJobStep(t *testing.T, ranks []*trainertest.Trainer, step int64) string {
	t.Helper()
	return saveJobStepFiles(t, ranks, step, func(r int) map[string][]byte {
		return map[string][]byte{fmt.Sprintf("rank-%d.bin", r): rankFile(step, r)}
	})
}

// saveJobStepFiles is saveJobStep with the files each rank r writes
// (ranks[r] is rank r).
func saveJobStepFiles(t *testing.T, ranks []*trainertest.Trainer, step int64, files func(r int) map[string][]byte) string {
	t.Helper()
	req, ok := ranks[0].Next(protocol.TypeCheckpoint, time.Minute)
	if !ok {
		t.Fatal("rank 0: no checkpoint request")
	}
	dirs := map[int]string{0: req.Dir}
	for r := 1; r < len(ranks); r++ {
		if r < len(ranks)/2 { // rank 0's node: asked already, unless its hello came after the request
			if m, ok := ranks[r].Next(protocol.TypeCheckpoint, 2*time.Second); ok {
				if m.ID != req.ID {
					t.Fatalf("rank %d: request %+v, want id %s", r, m, req.ID)
				}
				dirs[r] = m.Dir
				continue
			}
			// As the Python client does: it learns the id from the agreement and joins.
		}
		ranks[r].TrySend(protocol.Message{Type: protocol.TypeJoin, ID: req.ID, Reason: req.Reason, Deadline: req.Deadline, Step: &step})
		m, ok := ranks[r].Next(protocol.TypeCheckpoint, time.Minute)
		if !ok || m.ID != req.ID {
			t.Fatalf("rank %d: joined request %+v, want id %s", r, m, req.ID)
		}
		dirs[r] = m.Dir
	}
	for r := range ranks {
		for name, b := range files(r) {
			if err := os.WriteFile(filepath.Join(dirs[r], name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tr := range ranks {
		tr.TrySend(protocol.Message{Type: protocol.TypeDone, ID: req.ID, Step: &step}) // a dead agent is part of the test
	}
	return req.ID
}

// checkRestorable restores whatever restore picks and checks it is one
// step of every rank; it returns that step (-1: nothing committed).
func checkRestorable(t *testing.T, st cloud.Store, world int) int64 {
	t.Helper()
	r, err := restore.Checkpoint(t.Context(), st, t.TempDir(), restore.Options{})
	if errors.Is(err, restore.ErrNoCheckpoint) {
		return -1
	}
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	for rank := 0; rank < world; rank++ {
		b, err := os.ReadFile(filepath.Join(r.Dir, fmt.Sprintf("rank-%d.bin", rank)))
		if err != nil {
			t.Fatalf("restored step %d lacks rank %d: %v", r.Manifest.Step, rank, err)
		}
		if !bytes.Equal(b, rankFile(r.Manifest.Step, rank)) {
			t.Fatalf("restored step %d: rank %d's file is not its step-%d file (a mixed checkpoint)", r.Manifest.Step, rank, r.Manifest.Step)
		}
	}
	return r.Manifest.Step
}

func startJobSidecars(t *testing.T, env []string, uri, dir string) []*proc {
	t.Helper()
	var agents []*proc
	for k := 0; k < 2; k++ {
		agents = append(agents, start(t, env, "sidecar", "--store", uri, "--run-id", "it",
			"--checkpoint-dir", filepath.Join(dir, "n"+strconv.Itoa(k)), "--socket", filepath.Join(dir, "n"+strconv.Itoa(k)+".sock"),
			"--interval", "300ms", "--cloud", "none", "--log-format", "json", "--node-rank", strconv.Itoa(k)))
	}
	return agents
}

// startJobAt10 starts a job of 2 nodes × 2 ranks (sidecars, the test's
// ranks) on uri and commits its step 10.
func startJobAt10(t *testing.T, env []string, uri string) ([]*proc, []*trainertest.Trainer) {
	t.Helper()
	const world, perNode = 4, 2
	dir := testutil.ShortDir(t)
	agents := startJobSidecars(t, env, uri, dir)
	var ranks []*trainertest.Trainer
	for r := 0; r < world; r++ {
		ranks = append(ranks, dialRank(t, filepath.Join(dir, "n"+strconv.Itoa(r/perNode)+".sock"), r, world, perNode))
	}
	saveJobStep(t, ranks, 10)
	for r, tr := range ranks {
		if _, ok := tr.Next(protocol.TypeCommitted, time.Minute); !ok {
			t.Fatalf("rank %d: step 10 not committed", r)
		}
	}
	return agents, ranks
}

func TestDistributed_AgentKilledDuringJobCommit(t *testing.T) {
	parallel(t)
	s3srv, err := s3test.Start("spotagent-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s3srv.Close)
	env := s3Env(s3srv)
	const world = 4
	// The trials are independent (a prefix and agents of their own): they
	// run side by side, each replayable from its seed.
	var mu sync.Mutex
	outcomes := map[int64]int{}
	sem := make(chan struct{}, 4) // trials at once: two -race agents each
	t.Run("trials", func(t *testing.T) {
		for seed := 1; seed <= distTrials(t); seed++ {
			t.Run("seed="+strconv.Itoa(seed), func(t *testing.T) {
				t.Parallel()
				sem <- struct{}{}
				defer func() { <-sem }()
				rng := rand.New(rand.NewPCG(uint64(seed), 15))
				uri := fmt.Sprintf("s3://%s/kill%d", s3srv.Bucket, seed)
				st := openTestStore(t, uri, all.Options{S3Endpoint: s3srv.Endpoint})
				agents, ranks := startJobAt10(t, env, uri)
				victim := rng.IntN(2)
				delay := time.Duration(rng.IntN(250)) * time.Millisecond
				saveJobStep(t, ranks, 20)
				time.Sleep(delay) // the random moment of the kill, not synchronisation
				agents[victim].cmd.Process.Signal(syscall.SIGKILL)
				agents[victim].wait(time.Minute)
				mid := checkRestorable(t, st, world)
				// The survivor finishes the job checkpoint if the victim's part
				// was durable, else it keeps waiting: stop it and look again.
				agents[1-victim].signal(syscall.SIGTERM)
				agents[1-victim].waitEntry("signal received: taking a final checkpoint", time.Minute, nil)
				// A second signal within 1 s of the first is the same shutdown
				// (issue 24 item 9); a deliberate one later stops it at once.
				time.Sleep(1100 * time.Millisecond) // the scenario's gap, not synchronisation
				agents[1-victim].signal(syscall.SIGTERM)
				agents[1-victim].wait(time.Minute)
				end := checkRestorable(t, st, world)
				if mid != 10 && mid != 20 || end != 10 && end != 20 || end < mid {
					t.Fatalf("seed %d (kill node %d after %v): restore gave step %d, then %d; want 10 or 20", seed, victim, delay, mid, end)
				}
				mu.Lock()
				outcomes[end]++
				mu.Unlock()
			})
		}
	})
	t.Logf("kill trials: %v (step: trials restoring it)", outcomes)
}
