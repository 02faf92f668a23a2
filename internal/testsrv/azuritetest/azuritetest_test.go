package azuritetest

import (
	"os"
	"strings"
	"testing"
)

// The version the tests look for is the one scripts/test-deps.sh installs.
func TestVersionMatchesTestDeps(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/test-deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\nazurite_version="+Version+"\n") {
		t.Fatalf("scripts/test-deps.sh does not install azurite %s (azurite_version=...)", Version)
	}
}
