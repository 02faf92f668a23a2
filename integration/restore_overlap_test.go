package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
)

// overlapSetup is a store (S3 behind the fault proxy) holding a committed
// checkpoint of step 40 whose model.bin is 1 MiB of random bytes; the
// agent's arguments (the fake trainer's after "--").
type overlapSetup struct {
	fs       *faultStores
	dir      string
	args     []string
	env      []string
	modelSum string
}

func newOverlapSetup(t *testing.T, name string) *overlapSetup {
	t.Helper()
	requirePython(t, false)
	s := &overlapSetup{fs: newFaultStores(t, "s3", "overlap-"+name), dir: testutil.ShortDir(t)}
	src := t.TempDir()
	model := make([]byte, 1<<20)
	for i := range model {
		model[i] = byte(rand.IntN(256))
	}
	sum := sha256.Sum256(model)
	s.modelSum = hex.EncodeToString(sum[:])
	if err := os.WriteFile(filepath.Join(src, "model.bin"), model, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "state.json"), []byte(`{"step": 40}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &commit.Committer{Store: s.fs.direct, RunID: "it"}
	if _, err := c.Commit(t.Context(), commit.Request{Dir: src, ID: "c1", Step: 40, Metadata: json.RawMessage(`{"epoch":4}`)}); err != nil {
		t.Fatal(err)
	}
	s.env = append(s.fs.env, "AWS_EC2_METADATA_DISABLED=true")
	// The trainer says when it booted and whether the restore was still
	// running when it connected, then asks for its resume step (which
	// blocks until the restore ended) and prints what it resumed from,
	// with the sha256 of model.bin; one step, and it finishes.
	s.args = append(append(agentArgs(s.dir, s.fs.uri), "--"), fakeTrainer("--resume-hash", "model.bin", "--steps", "1")...)
	return s
}

// modelGets matches the GETs of the checkpoint's model.bin.
func modelGets(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/model.bin")
}

// lineIndex is the index of the first output line matching re (-1: none).
func (p *proc) lineIndex(re string) int {
	rx := regexp.MustCompile(re)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, l := range p.lines {
		if rx.MatchString(l) {
			return i
		}
	}
	return -1
}

// TestRestoreOverlap_TrainerStartsFirst (issue 30 item 1 (a)): the restore
// is slowed to 256 KiB/s (about 4 s for model.bin). The trainer starts at
// once, connects while the restore runs (restore pending), blocks at
// resume_step, and resumes at step 40 with model.bin byte for byte. With
// the serial start the trainer connected only after "restored checkpoint".
func TestRestoreOverlap_TrainerStartsFirst(t *testing.T) {
	parallel(t)
	s := newOverlapSetup(t, "first")
	s.fs.proxy.Set(faultproxy.Fault{Mode: faultproxy.Slow, Rate: 256 << 10, Match: modelGets})
	p := start(t, s.env, s.args...)
	if code := p.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	got := p.waitLine(`trainer: resumed at step (\d+) sha256 ([0-9a-f]+) metadata (.*)$`, time.Second)
	if got[1] != "40" || got[2] != s.modelSum || got[3] != `{"epoch": 4}` {
		t.Fatalf("resumed at step %s sha256 %s metadata %s, want 40 %s {\"epoch\": 4}", got[1], got[2], got[3], s.modelSum)
	}
	connected, restored := p.lineIndex(`trainer: connected pending=True`), p.lineIndex(`restored checkpoint`)
	if connected < 0 || restored < 0 || connected > restored {
		t.Fatalf("the trainer did not connect while the restore ran (connected at line %d, restored at line %d)", connected, restored)
	}
	if p.lineIndex(`trainer: fresh start`) >= 0 {
		t.Fatal("the trainer started fresh")
	}
}
