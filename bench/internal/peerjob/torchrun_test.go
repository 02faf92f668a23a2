package peerjob

import (
	"fmt"
	"os"
	"regexp"
	"testing"
)

// TestParseTrainer: the lines bench/peer_trainer.py prints (its format
// strings' output, copied) parse; others do not.
func TestParseTrainer(t *testing.T) {
	first := "bench: first_step 1795869490.000155 rank 2 resumed 7 started 1795869473.197761 imported 1795869488.986954 pg 1795869489.597917 restored 1795869489.685264 loaded 1795869489.892121"
	got, ok := parseTrainer(first)
	if !ok || got.kind != "first_step" || got.rank != 2 || got.step != 7 {
		t.Fatalf("parseTrainer(first_step) = %+v, %v", got, ok)
	}
	for name, want := range map[string]float64{"first_step": 1795869490.000155, "started": 1795869473.197761, "imported": 1795869488.986954,
		"pg": 1795869489.597917, "restored": 1795869489.685264, "loaded": 1795869489.892121} {
		if got.times[name] != want {
			t.Errorf("%s = %f, want %f", name, got.times[name], want)
		}
	}
	if got, ok := parseTrainer("bench: saved step 12 rank 3"); !ok || got.kind != "saved" || got.step != 12 || got.rank != 3 {
		t.Errorf("saved line: %+v, %v", got, ok)
	}
	if got, ok := parseTrainer("bench: rank 1 pid 4242"); !ok || got.kind != "pid" || got.rank != 1 || got.pid != 4242 {
		t.Errorf("pid line: %+v, %v", got, ok)
	}
	for _, bad := range []string{"rank 1 pid 4242", "bench: saved step x rank 3", "bench: first_step 1 rank 2 resumed 7", `{"msg":"restored checkpoint"}`} {
		if got, ok := parseTrainer(bad); ok {
			t.Errorf("parseTrainer(%q) = %+v, want no line", bad, got)
		}
	}
}

// TestParseTrainer_TrainerFormats: every `bench: ` format string of
// bench/peer_trainer.py, filled in (Python's %d and %.6f are Go's), parses.
func TestParseTrainer_TrainerFormats(t *testing.T) {
	src, err := os.ReadFile("../../peer_trainer.py")
	if err != nil {
		t.Fatal(err)
	}
	formats := regexp.MustCompile(`"(bench: [^"]*)"`).FindAllStringSubmatch(string(src), -1)
	kinds := map[string]bool{}
	for _, f := range formats {
		var args []any
		for _, v := range regexp.MustCompile(`%(\.6f|d)`).FindAllString(f[1], -1) {
			if v == "%d" {
				args = append(args, 3)
			} else {
				args = append(args, 1795869490.5)
			}
		}
		line := fmt.Sprintf(f[1], args...)
		got, ok := parseTrainer(line)
		if !ok {
			t.Errorf("the trainer's %q gives %q, which does not parse", f[1], line)
		}
		kinds[got.kind] = true
	}
	if len(kinds) != 3 {
		t.Errorf("the trainer's formats give kinds %v, want pid, saved and first_step", kinds)
	}
}
