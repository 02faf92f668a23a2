package cloudtest

import (
	"os"
	"testing"
)

// RequireCloudEnv, when set (to anything), makes a test that needs a real
// cloud account fail instead of skipping when its account is not
// configured: a CI job with credentials sets it, so that a missing secret
// cannot pass as a green run.
const RequireCloudEnv = "SPOTAGENT_REQUIRE_CLOUD"

// CloudEnv returns the value of env, which names a real cloud's resource
// (a bucket). Unset, the test is skipped visibly with the reason, or
// fails when RequireCloudEnv is set.
func CloudEnv(t *testing.T, env, what string) string {
	t.Helper()
	v := os.Getenv(env)
	if v != "" {
		return v
	}
	if os.Getenv(RequireCloudEnv) != "" {
		t.Fatalf("%s: %s is unset and %s requires it", what, env, RequireCloudEnv)
	}
	t.Skipf("%s: needs a real cloud account (%s is unset)", what, env)
	return ""
}
