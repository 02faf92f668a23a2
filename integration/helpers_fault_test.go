package integration

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
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

// cpuTime is the user+system CPU time a process has used so far.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("cpu time of %d: %v", pid, err)
	}
	// Fields after the command name, which is in parentheses and may
	// contain spaces: state is field 3, utime 14, stime 15.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stt, _ := strconv.ParseInt(f[12], 10, 64)
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ut+stt) * time.Second / hz
}

// killGroup SIGKILLs a process group (a trainer the killed agent left).
func killGroup(pid int) { syscall.Kill(-pid, syscall.SIGKILL) }

// readJournal reads journal.json straight from a store.
func readJournal(t *testing.T, st cloud.Store) *journal.Journal {
	t.Helper()
	j, err := journal.Read(context.Background(), st, "")
	if err != nil {
		t.Fatal(err)
	}
	return j
}
