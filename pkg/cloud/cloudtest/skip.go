package cloudtest

import (
	"os"
	"testing"
)

// requireCloudEnv, when set (to anything), makes a test that needs a real
// cloud account fail instead of skipping when its account is not
// configured: a CI job with credentials sets it, so that a missing secret
// cannot pass as a green run.
const requireCloudEnv = "SPOTAGENT_REQUIRE_CLOUD"

// CloudEnv returns the value of env, which names a real cloud's resource
// (a bucket). Unset, the test is skipped visibly with the reason, or
// fails when requireCloudEnv is set.
func CloudEnv(t *testing.T, env, what string) string {
	t.Helper()
	v := os.Getenv(env)
	if v != "" {
		return v
	}
	if os.Getenv(requireCloudEnv) != "" {
		t.Fatalf("%s: %s is unset and %s requires it", what, env, requireCloudEnv)
	}
	t.Skipf("%s: needs a real cloud account (%s is unset)", what, env)
	return ""
}
