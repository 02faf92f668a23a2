package faultproxy

import "testing"

// New starts a proxy to target for the test (seed 1) and closes it at the
// end of the test.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := Start(target, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
