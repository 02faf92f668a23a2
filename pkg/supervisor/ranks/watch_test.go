package ranks

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// TestPeerCrashed_BesideTheLoop (issue 35 item 2): the lookup for another
// node's crash record ends with its context, settle or not (the agent's
// end cancels it), and finds another node's record of this session's
// time, never this node's own.
func TestPeerCrashed_BesideTheLoop(t *testing.T) {
	st, err := file.New(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := peerCrashed(ctx, st, "node-0", time.Now(), time.Now().Add(time.Hour)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled lookup: %v, want context.Canceled", err)
	}
	since := time.Now()
	put := func(key string) {
		t.Helper()
		if err := st.Put(t.Context(), key, strings.NewReader("{}"), 2, cloud.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put(CrashDir + "node-0-s1.json") // this node's own
	if key, err := peerCrashed(t.Context(), st, "node-0", since, time.Now()); err != nil || key != "" {
		t.Fatalf("own record only: %q, %v; want none", key, err)
	}
	put(CrashDir + "node-1-s2.json")
	if key, err := peerCrashed(t.Context(), st, "node-0", since, time.Now()); err != nil || key != CrashDir+"node-1-s2.json" {
		t.Fatalf("another node's record: %q, %v", key, err)
	}
}
