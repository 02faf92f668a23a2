package localdirs

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// TestDirs_OpenTier: the local tier is the Dirs' own: opened under the
// area, and off (its earlier copies deleted) when nothing is to be kept.
func TestDirs_OpenTier(t *testing.T) {
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	d, err := Open(nil, ckpt, "r", false, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Tier() != nil {
		t.Fatal("a tier before OpenTier")
	}
	d.OpenTier(2, 0, zap.NewNop())
	if d.Tier() == nil {
		t.Fatal("OpenTier(2): no tier")
	}
	if _, err := os.Stat(filepath.Join(d.AreaPath, TierSub)); err != nil {
		t.Fatalf("the tier is not under the area: %v", err)
	}
	d2, err := Open(nil, ckpt, "r", false, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	d2.OpenTier(0, 0, zap.NewNop())
	if d2.Tier() != nil {
		t.Fatal("OpenTier(0): a tier")
	}
	if _, err := os.Stat(filepath.Join(d2.AreaPath, TierSub)); !os.IsNotExist(err) {
		t.Fatalf("keep 0: the earlier tier's copies are left (%v)", err)
	}
}

// TestPeerTierConfigReachesTheTier: every field of the agent's peer tier
// configuration reaches the tier's own (--peer-wait's among them: the
// end-to-end test that read it back from the wait's log line was cut in
// #49; cmd/spotagent TestPeerTierFlags maps the flags to this one).
func TestPeerTierConfigReachesTheTier(t *testing.T) {
	c := PeerTierConfig{Enabled: true, Listen: ":7000", Advertise: []string{"10.0.0.1"}, Stall: 3 * time.Second,
		PeerWait: 2 * time.Minute, Replicas: 1, Machine: checkpoint.Machine{InstanceID: "i-1"}}
	got := c.tierConfig(nil, "run", "node-1", "s1", nil)
	if got.RunID != "run" || got.Node != "node-1" || got.Session != "s1" || got.Listen != ":7000" || !slices.Equal(got.Advertise, c.Advertise) ||
		got.Stall != 3*time.Second || got.PeerWait != 2*time.Minute || got.Replicas != 1 || got.Machine.InstanceID != "i-1" {
		t.Fatalf("peertier.Config %+v from %+v", got, c)
	}
	c.PeerWait = -1 // --peer-wait 0s: none
	if got := c.tierConfig(nil, "run", "node-1", "s1", nil); got.PeerWait != -1 {
		t.Fatalf("PeerWait %v, want -1 (no wait)", got.PeerWait)
	}
}
