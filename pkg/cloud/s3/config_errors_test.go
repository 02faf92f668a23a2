package s3_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
)

// bareAWSEnv leaves the SDK's configuration chain nothing to find: no
// region, no credentials, no shared files, no instance metadata.
func bareAWSEnv(t *testing.T) {
	t.Helper()
	none := filepath.Join(t.TempDir(), "none")
	for k, v := range map[string]string{
		"AWS_REGION": "", "AWS_DEFAULT_REGION": "", "AWS_PROFILE": "", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
		"AWS_SESSION_TOKEN": "", "AWS_WEB_IDENTITY_TOKEN_FILE": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONFIG_FILE": none, "AWS_SHARED_CREDENTIALS_FILE": none,
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_S3": "",
	} {
		t.Setenv(k, v)
	}
}

// TestConfigErrors: the real SDK's configuration failures name what is
// missing and where it is looked for, not the SDK's endpoint rules.
func TestConfigErrors(t *testing.T) {
	t.Run("NoRegion", func(t *testing.T) {
		bareAWSEnv(t)
		_, err := s3.New(t.Context(), "my-bucket", "runs", s3.Options{})
		if !errors.Is(err, s3.ErrNoRegion) {
			t.Fatalf("err=%v, want ErrNoRegion", err)
		}
	})
	t.Run("BadRegion", func(t *testing.T) {
		bareAWSEnv(t)
		endpoint, bucket := s3test.NewServer(t)
		t.Setenv("AWS_ACCESS_KEY_ID", "k")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "s")
		st, err := s3.New(t.Context(), bucket, "runs", s3.Options{Endpoint: endpoint, Region: "bad region"})
		if err == nil {
			err = st.Check(t.Context())
		}
		if !errors.Is(err, s3.ErrBadRegion) {
			t.Fatalf("err=%v, want ErrBadRegion", err)
		}
	})
	t.Run("NoCredentials", func(t *testing.T) {
		endpoint, bucket := s3test.NewServer(t)
		bareAWSEnv(t) // after the server, which sets test credentials
		st, err := s3.New(t.Context(), bucket, "runs", s3.Options{Endpoint: endpoint})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Check(t.Context()); !errors.Is(err, s3.ErrNoCredentials) {
			t.Fatalf("err=%v, want ErrNoCredentials", err)
		}
	})
}
