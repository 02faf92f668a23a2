package checkpoint

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDecodeManifest: the streaming decoder reads what json.Unmarshal
// reads, and refuses what it refuses.
func TestDecodeManifest(t *testing.T) {
	good := `{"format":"spotagent.checkpoint/v1","id":"a","step":3,"Files":[{"path":"m","key":"k/m","size":1,"sha256":"x"}],"metadata":{"files":[1]},"epoch":2,"extra":[1,{"b":2}]}`
	var want Manifest
	if err := json.Unmarshal([]byte(good), &want); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeManifest(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(want)
	b, _ := json.Marshal(got)
	if string(a) != string(b) {
		t.Fatalf("streamed %s, want %s", b, a)
	}
	for _, bad := range []string{`[]`, `{"files":{}}`, `{"files":[1]}`, `{"id":"a"} x`, `{"id":`} {
		if _, err := DecodeManifest(strings.NewReader(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
