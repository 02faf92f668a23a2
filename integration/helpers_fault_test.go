package integration

import (
	"context"
	"io/fs"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
)

// leftovers counts what a crashed writer leaves in a store: temp files of
// the file store, incomplete multipart uploads under an S3 store's prefix.
func leftovers(ctx context.Context, st cloud.Store, root string) (int, error) {
	names, err := leftoverNames(ctx, st, root)
	return len(names), err
}

// leftoverNames names them: temp file paths, or "key upload-id".
func leftoverNames(ctx context.Context, st cloud.Store, root string) ([]string, error) {
	switch s := cloudtest.Plain(st).(type) {
	case *s3.Store:
		out, err := s.Client().ListMultipartUploads(ctx, &awss3.ListMultipartUploadsInput{
			Bucket: &root, Prefix: ptr(strings.TrimPrefix(strings.TrimPrefix(s.URI(""), "s3://"+root+"/"), "/")),
		})
		if err != nil {
			if strings.Contains(err.Error(), "NoSuchUpload") {
				return nil, nil // gofakes3, for a bucket without uploads
			}
			return nil, err
		}
		var names []string
		for _, u := range out.Uploads {
			names = append(names, *u.Key+" "+*u.UploadId)
		}
		return names, nil
	default:
		var names []string
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if strings.HasPrefix(d.Name(), ".spotagent-tmp-") {
				names = append(names, p)
			}
			return nil
		})
		return names, err
	}
}

func ptr[T any](v T) *T { return &v }

// killGroup SIGKILLs a process group (a trainer the killed agent left).
func killGroup(pid int) { syscall.Kill(-pid, syscall.SIGKILL) }

// faultStores is an S3 store (in-process) reached through a fault proxy,
// and the same store reached directly (to check what landed).
type faultStores struct {
	proxy  *faultproxy.Proxy
	direct cloud.Store
	uri    string
	env    []string // for a spotagent process: through the proxy
}

func newFaultStores(t *testing.T, prefix string) *faultStores {
	t.Helper()
	srv := startS3(t)
	s := &faultStores{proxy: faultproxy.New(t, srv.Endpoint), uri: "s3://" + srv.Bucket + "/" + prefix}
	s.direct = openTestStore(t, s.uri, all.Options{S3Endpoint: srv.Endpoint})
	s.env = append(srv.Env(), "AWS_ENDPOINT_URL_S3="+s.proxy.URL)
	return s
}

// dataReads records the checkpoint objects read from a faultStores store
// through its proxy: every GET under checkpoints/ but those whose path ends
// in skip (metadata), once start was called. It is a fault that never
// fires: its Match sees every request.
type dataReads struct {
	mu       sync.Mutex
	counting bool
	names    []string // each object's name (its key's last element), in order
}

func (s *faultStores) recordDataReads(skip string) *dataReads {
	d := &dataReads{}
	s.proxy.Set(faultproxy.Fault{Mode: faultproxy.Stall, Stall: time.Minute, Match: func(r *http.Request) bool {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/checkpoints/") && !strings.HasSuffix(r.URL.Path, skip) {
			d.mu.Lock()
			if d.counting {
				d.names = append(d.names, r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:])
			}
			d.mu.Unlock()
		}
		return false
	}})
	return d
}

// start records from now on, forgetting what came before.
func (d *dataReads) start() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counting, d.names = true, nil
}

// read is the names recorded since start, sorted.
func (d *dataReads) read() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Sorted(slices.Values(d.names))
}
