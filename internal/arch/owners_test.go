package main

import (
	"strings"
	"testing"
)

// TestOwnership measures a small module whose package b writes into
// package a's fields: two writes into an owner (a type with methods), one
// into a value, none counted for a config struct or a composite literal;
// one interface over 8 methods; b has no tests.
func TestOwnership(t *testing.T) {
	o, err := measureOwnership("testdata/owners")
	if err != nil {
		t.Fatal(err)
	}
	if o.allWrites != 3 || o.ownerWrites != 2 || o.writes["b → a.Owner.X"] != 2 || o.writes["b → a.Value.Y"] != 1 {
		t.Errorf("writes %v: %d in all, %d into owners; want 3 and 2", o.writes, o.allWrites, o.ownerWrites)
	}
	if strings.Join(o.bigIfaces, ",") != "a.Wide 9" {
		t.Errorf("big interfaces %v, want a.Wide 9", o.bigIfaces)
	}
	if strings.Join(o.untested, ",") != "b" {
		t.Errorf("untested %v, want b", o.untested)
	}
}
