package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// TestUpload: every file lands under its base name with its bytes, the
// total counted; a missing file is an error naming it.
func TestUpload(t *testing.T) {
	src := t.TempDir()
	var names []string
	for i, n := range []int{1 << 20, 3, 0} {
		p := filepath.Join(src, "f"+string(rune('0'+i)))
		os.WriteFile(p, bytes.Repeat([]byte{byte(i + 1)}, n), 0o600)
		names = append(names, p)
	}
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	total, err := upload(ctx, st, names)
	if err != nil || total != 1<<20+3 {
		t.Fatalf("upload: %d bytes, %v; want %d", total, err, 1<<20+3)
	}
	rc, err := st.Get(ctx, "f1", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(b, []byte{2, 2, 2}) {
		t.Fatalf("f1 in the store: %v", b)
	}
	if _, err := upload(ctx, st, []string{filepath.Join(src, "missing")}); err == nil {
		t.Fatal("a missing file: want an error")
	}
}
