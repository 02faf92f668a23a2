package metrics

import (
	"net/http/httptest"
	"testing"
	"time"
)

func TestMetrics_StoreOps(t *testing.T) {
	m := New()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	m.StoreOp("stat", "error", 10*time.Millisecond)
	m.StoreOp("stat", "ok", 5*time.Millisecond)
	m.StoreOp("put", "precondition", time.Millisecond)
	fams := scrape(t, srv.URL)
	for _, c := range []struct {
		op, result string
		want       float64
	}{{"stat", "error", 1}, {"stat", "ok", 1}, {"put", "precondition", 1}} {
		if got, ok := value(fams, "spotagent_store_operations_total", "op", c.op, "result", c.result); !ok || got != c.want {
			t.Errorf("%s %s=%v (present %v), want %v", c.op, c.result, got, ok, c.want)
		}
	}
	if got, _ := value(fams, "spotagent_store_operation_seconds", "op", "stat"); got != 2 {
		t.Errorf("stat durations observed=%v, want 2", got)
	}
}
