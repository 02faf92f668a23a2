package localdirs

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
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
