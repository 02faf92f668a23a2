package gcs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/pkg/cloud/gcs"
)

// TestNew_BadCredentialsFileNamed: GOOGLE_APPLICATION_CREDENTIALS naming
// a missing file or one that is no credentials is said with the variable
// and its value, through the real library (which reads the variable first
// and asks no server). ErrNoCredentials, found only after the library
// probed the metadata server, is not tested here: tests never reach it.
func TestNew_BadCredentialsFileNamed(t *testing.T) {
	t.Setenv("STORAGE_EMULATOR_HOST", "") // the library would skip authentication
	os.Unsetenv("STORAGE_EMULATOR_HOST")
	junk := filepath.Join(t.TempDir(), "key.json")
	os.WriteFile(junk, []byte("not json"), 0o600)
	for _, f := range []string{filepath.Join(t.TempDir(), "missing.json"), junk} {
		t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", f)
		_, err := gcs.New(t.Context(), "b", "p", gcs.Options{})
		if err == nil || !strings.Contains(err.Error(), "GOOGLE_APPLICATION_CREDENTIALS="+f+" is no usable credentials file") {
			t.Errorf("credentials file %s: %v", f, err)
		}
	}
}
