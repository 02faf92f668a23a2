package main

import (
	"bytes"
	"io"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// BenchmarkRestoreRead reads a 64 MiB checkpoint file from a file store,
// bare and through the progress counter, to show that counting costs the
// transfer nothing measurable:
//
//	go test -tags disable_grpc_modules -run '^$' -bench RestoreRead -count 5 ./cmd/spotagent/
func BenchmarkRestoreRead(b *testing.B) {
	st, err := file.New(filepath.Join(b.TempDir(), "store"))
	if err != nil {
		b.Fatal(err)
	}
	const key, size = "checkpoints/000000000001-aaaaaaaaaaaa/model.pt", 64 << 20
	if err := st.Put(b.Context(), key, bytes.NewReader(make([]byte, size)), size, cloud.PutOptions{}); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		st   cloud.Store
	}{{"Bare", st}, {"Counted", &countingStore{Store: st}}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(size)
			buf := make([]byte, 256<<10)
			for b.Loop() {
				r, err := bc.st.Get(b.Context(), key, 0, -1)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.CopyBuffer(io.Discard, r, buf); err != nil {
					b.Fatal(err)
				}
				r.Close()
			}
		})
	}
}
