package gcs

import (
	"bytes"
	"hash/crc32"
	"io"
	"net/http"
	"testing"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testsrv/gcstest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
)

// A file goes in one request with its CRC32C, which the server checks:
// a wrong one leaves no object.
func TestPutFile_OneRequest(t *testing.T) {
	_, bucket := gcstest.NewServer(t)
	st, err := New(t.Context(), bucket, "files", Options{ChunkSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	data, src := cloudtest.RandomFile(t, 3<<20+5) // several chunks: the chunked path would take 13 requests
	if err := st.Put(t.Context(), "obj", src, src.Size, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if want := crc32.Checksum(data, castagnoli); !src.Reported || src.N != src.Size || src.CRC != want {
		t.Fatalf("Sent(%d, %08x) called %v, want %d, %08x", src.N, src.CRC, src.Reported, src.Size, want)
	}
	// The bytes read to checksum it, each once, in order (cloud.ScannedSource).
	if !bytes.Equal(src.Scans, data) {
		t.Fatalf("Scanned saw %d bytes, equal to the file %v", len(src.Scans), bytes.Equal(src.Scans, data))
	}
	// Progress as the body went (#41 item 5): several reports, adding up to
	// at least the file (a resent request counts again).
	var sum int64
	for _, n := range src.Reports {
		sum += n
	}
	if len(src.Reports) < 2 || sum < src.Size {
		t.Fatalf("progress reports %d adding to %d, want several adding to at least %d", len(src.Reports), sum, src.Size)
	}
	readBack(t, st, "obj", data)
	// The server checks the CRC32C sent with the request.
	o, _ := st.object("bad")
	if err := st.putOnce(t.Context(), o, bytes.NewReader(data), crc32.Checksum(data, castagnoli)^1); err == nil {
		t.Fatal("a wrong CRC32C was accepted")
	}
	if _, err := st.Stat(t.Context(), "bad"); err == nil {
		t.Fatal("an object with a wrong CRC32C was created")
	}
}

// A single-request upload survives several connection resets in a row (a
// spot machine's network flapping): five resets mid-body, then the file
// goes. Three attempts, as before, failed a checkpoint file on the third
// reset; S3's uploads have ten.
func TestPutFile_SurvivesResetsInARow(t *testing.T) {
	host, bucket := gcstest.NewServer(t)
	proxy := faultproxy.New(t, "http://"+host)
	t.Setenv("STORAGE_EMULATOR_HOST", proxy.Host)
	st, err := New(t.Context(), bucket, "files", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	proxy.Set(faultproxy.Fault{Mode: faultproxy.ResetRequest, Count: 5, After: 64 << 10,
		Match: func(r *http.Request) bool { return r.Method == http.MethodPost }})
	data, src := cloudtest.RandomFile(t, 1<<20)
	if err := st.Put(t.Context(), "obj", src, src.Size, cloud.PutOptions{}); err != nil {
		t.Fatalf("put through 5 resets: %v", err)
	}
	if got := proxy.Stats().Faults; got != 5 {
		t.Fatalf("%d resets injected, want 5", got)
	}
	readBack(t, st, "obj", data)
}

// readBack fails the test unless key holds data.
func readBack(t *testing.T, st *Store, key string, data []byte) {
	t.Helper()
	r, err := st.Get(t.Context(), key, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), equal %v", len(got), err, bytes.Equal(got, data))
	}
}
