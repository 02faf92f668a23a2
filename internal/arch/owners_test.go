package main

import (
	"strings"
	"testing"
)

// TestOwnership measures a small module whose package b writes into
// package a's fields: four into owners (two types with unexported state,
// and an owner's field promoted through an
// embedding struct), one into a value (every field exported), none
// for a config struct or a composite literal; one interface over 8
// methods; b has no tests.
func TestOwnership(t *testing.T) {
	o, err := measureOwnership("testdata/owners")
	if err != nil {
		t.Fatal(err)
	}
	if o.allWrites != 5 || o.ownerWrites != 4 || o.writes["b → a.Owner.X"] != 3 || o.writes["b → a.Guarded.W"] != 1 || o.writes["b → a.Value.Y"] != 1 {
		t.Errorf("writes %v: %d in all, %d into owners; want 5 and 4", o.writes, o.allWrites, o.ownerWrites)
	}
	if !o.owned["b → a.Owner.X"] || !o.owned["b → a.Guarded.W"] || o.owned["b → a.Value.Y"] {
		t.Errorf("owner writes %v: want Owner.X and Guarded.W, not Value.Y", o.owned)
	}
	if strings.Join(o.bigIfaces, ",") != "a.Wide 9" {
		t.Errorf("big interfaces %v, want a.Wide 9", o.bigIfaces)
	}
	if strings.Join(o.untested, ",") != "b" {
		t.Errorf("untested %v, want b", o.untested)
	}
}
