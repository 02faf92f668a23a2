package nodemode

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/peertier"
	"github.com/spotagent/spotagent/pkg/supervisor"
)

// TestNode_PeerTierOneListener (#38 item 4): with the peer tier on, every
// hosted node of a multi-node job serves its local copies on the node
// agent's one TCP listener: both parts' records name the same port, and a
// request there reaches the run's own server, which refuses a bad
// signature with the answer a run the node agent does not host gets (503:
// nothing tells hosted runs apart before authentication, #46).
func TestNode_PeerTierOneListener(t *testing.T) {
	n := startNode(t, nil, func(c *Config) {
		c.Run.LocalKeep = 1
		c.Run.PeerTier = supervisor.PeerTierConfig{Enabled: true, Listen: "127.0.0.1:0", Advertise: []string{"127.0.0.1"}}
	})
	pods, _ := n.jobPods(t)
	var ports []string
	for k := range pods {
		var rec peertier.Record
		b, err := os.ReadFile(filepath.Join(filepath.Dir(n.sock), "runs", "job", "peers", fmt.Sprintf("node-%d.json", k)))
		if err != nil {
			t.Fatalf("node-%d's peer record: %v", k, err)
		}
		if err := json.Unmarshal(b, &rec); err != nil || len(rec.Addrs) == 0 {
			t.Fatalf("node-%d's peer record %s: %v", k, b, err)
		}
		_, port, _ := strings.Cut(rec.Addrs[0], ":")
		ports = append(ports, port)
	}
	if ports[0] != ports[1] {
		t.Fatalf("the two nodes serve on ports %v, want the node agent's one", ports)
	}
	get := func(run string) int {
		q := url.Values{"c": {"000000000001-abc"}, "f": {"rank-0.pt"}, "s": {"1"}, "e": {strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)},
			"mac": {"00"}, "r": {run}, "n": {"node-0"}}
		resp, err := http.Get("http://127.0.0.1:" + ports[0] + "/spotagent/peer/v1/file?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("job"); got != http.StatusServiceUnavailable {
		t.Fatalf("a bad signature for run job: status %d, want 503, as for a run not hosted", got)
	}
	if got := get("other"); got != http.StatusServiceUnavailable {
		t.Fatalf("a run not hosted: status %d, want 503 (its pod may be starting: the asker waits for its record)", got)
	}

	// A clean stop: both nodes commit the stop's checkpoint.
	n.stopJob(t, pods)
}
