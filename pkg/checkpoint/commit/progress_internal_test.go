package commit

import (
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// A store's progress reports move the upload's progress as they come, and
// Sent adds only the rest: the total is the file, counted once (#41 item 5).
func TestUploadReader_ProgressThenSent(t *testing.T) {
	p := &checkpoint.Progress{Total: 30}
	u := newUploadReader(nil, 30, p)
	u.Progress(10)
	u.Progress(10)
	if got := p.Done(); got != 20 {
		t.Fatalf("after two parts: %d bytes, want 20", got)
	}
	u.Sent(30, 0)
	if got := p.Done(); got != 30 {
		t.Fatalf("after Sent: %d bytes, want 30", got)
	}
	if n, _ := u.result(); n != 30 {
		t.Fatalf("result %d bytes, want 30", n)
	}
}
