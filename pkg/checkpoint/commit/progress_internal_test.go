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
	data := make([]byte, 30)
	u.Scanned(data)
	h := checkpoint.NewCRC32C()
	h.Write(data)
	u.Sent(30, h.Sum32())
	if got := p.Done(); got != 30 {
		t.Fatalf("after Sent: %d bytes, want 30", got)
	}
	if n, _, _, err := u.result(); err != nil || n != 30 {
		t.Fatalf("result %d bytes (%v), want 30", n, err)
	}
}
