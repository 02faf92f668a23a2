package protocol

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestExitCodes_PythonClientAgrees: the client's constants are these
// (python/spotagent/_common.py): a trainer that exits with its
// EXIT_INTERRUPTED must be what the agent, the exit file and orchestrators
// read as "run me again".
func TestExitCodes_PythonClientAgrees(t *testing.T) {
	b, err := os.ReadFile("../../python/spotagent/_common.py")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"EXIT_INTERRUPTED": ExitInterrupted, "EXIT_FENCED": ExitFenced} {
		m := regexp.MustCompile(`(?m)^` + name + ` = (\d+)$`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("_common.py defines no %s", name)
		}
		if got, _ := strconv.Atoi(string(m[1])); got != want {
			t.Errorf("_common.py: %s = %d, the agent's is %d", name, got, want)
		}
	}
}
