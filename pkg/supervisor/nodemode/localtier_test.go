package nodemode

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestNode_LocalTierKeepsEachPart (#38): in node mode each node of a job
// keeps its own part of the shutdown checkpoint (hard links: a stop's
// checkpoint is never copied while the trainer waits), in its run's area.
func TestNode_LocalTierKeepsEachPart(t *testing.T) {
	n := startNode(t, nil, func(c *Config) { c.Run.LocalKeep = 1 })
	pods, _ := n.jobPods(t)
	id := n.stopJob(t, pods)
	for k := range pods {
		part := fmt.Sprintf("node-%d", k)
		kept := filepath.Join(filepath.Dir(n.sock), "ckpt", "job", part, "spotagent-job", "committed", "000000000040-"+id)
		ents, err := os.ReadDir(kept)
		if err != nil || len(ents) != 1 || ents[0].Name() != fmt.Sprintf("rank-%d.pt", k) {
			t.Fatalf("%s keeps %v (%v), want its own rank-%d.pt", part, ents, err, k)
		}
	}
}
