package azblob_test

import (
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/azuritetest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/azblob"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
)

// newStore returns a store under a fresh prefix of the server's container,
// emptied at the end. The shared key is explicit: the default credential
// chain (which would ask the VM's metadata endpoint) is never built.
func newStore(t *testing.T, srv *azuritetest.Server, opts azblob.Options) *azblob.Store {
	t.Helper()
	if opts.Endpoint == "" {
		opts.Endpoint = srv.Endpoint
	}
	if opts.Credentials == (azblob.Credentials{}) {
		opts.Credentials = azblob.Credentials{AccountKey: azuritetest.Key}
	}
	st, err := azblob.New(t.Context(), azuritetest.Account, azuritetest.Container, cloudtest.Prefix(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cloudtest.Empty(t, st)
		st.Close()
	})
	return st
}

func TestConformance(t *testing.T) {
	srv := azuritetest.New(t)
	// 4 MiB blocks so the 64 MiB object takes 16 staged blocks.
	cloudtest.Run(t, func(t *testing.T) cloud.Store {
		return newStore(t, srv, azblob.Options{BlockSize: 4 << 20, Concurrency: 4})
	})
}

func TestConformanceRealAzure(t *testing.T) {
	uri := cloudtest.CloudEnv(t, "SPOTAGENT_TEST_AZURE_CONTAINER", "real Azure Blob (container@account)")
	cloudtest.Run(t, func(t *testing.T) cloud.Store {
		ctr, account, _ := cut(uri)
		st, err := azblob.New(t.Context(), account, ctr, cloudtest.Prefix(), azblob.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cloudtest.Empty(t, st) })
		return st
	})
}

func cut(s string) (a, b string, ok bool) {
	for i := range s {
		if s[i] == '@' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
