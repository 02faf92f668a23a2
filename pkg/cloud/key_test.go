package cloud_test

import (
	"errors"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// keyCases are the paths of the one key rule: store keys (cloud.ValidKey)
// and the relative paths of a checkpoint's files (checkpoint.SafeRel).
var keyCases = []struct {
	key string
	ok  bool
}{
	{"a", true},
	{"checkpoints/000000000010-a/model.pt", true},
	{"a/.hidden/b..c", true},
	{"", false},
	{"/a", false},
	{"a/", false},
	{"a//b", false},
	{".", false},
	{"..", false},
	{"a/./b", false},
	{"a/../b", false},
	{"../a", false},
	{`a\b`, false},    // a separator on Windows; was accepted as a store key
	{"a\x00b", false}, // a C string ends there; was accepted as a store key
}

func TestValidKey(t *testing.T) {
	for _, c := range keyCases {
		err := cloud.ValidKey(c.key)
		if got := err == nil; got != c.ok {
			t.Errorf("ValidKey(%q)=%v, want ok=%v", c.key, err, c.ok)
		}
		if err != nil && !errors.Is(err, cloud.ErrInvalidKey) {
			t.Errorf("ValidKey(%q)=%v, want ErrInvalidKey", c.key, err)
		}
	}
}

// TestSafeRel_SameRule: a checkpoint path is accepted exactly when it is a
// valid store key.
func TestSafeRel_SameRule(t *testing.T) {
	for _, c := range keyCases {
		err := checkpoint.SafeRel(c.key)
		if got := err == nil; got != c.ok {
			t.Errorf("SafeRel(%q)=%v, want ok=%v", c.key, err, c.ok)
		}
		if err != nil && !errors.Is(err, checkpoint.ErrUnsafePath) {
			t.Errorf("SafeRel(%q)=%v, want ErrUnsafePath", c.key, err)
		}
	}
}
