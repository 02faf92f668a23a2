package azblob_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/sas"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/service"

	"github.com/spotagent/spotagent/internal/faultproxy"
	"github.com/spotagent/spotagent/internal/testsrv/azuritetest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/azblob"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
)

// check opens a store and returns its access check's error.
func check(t *testing.T, account, container string, opts azblob.Options) error {
	t.Helper()
	st, err := azblob.New(t.Context(), account, container, "p", opts)
	if err != nil {
		return err
	}
	defer st.Close()
	return st.Check(t.Context())
}

func wantErr(t *testing.T, err error, sentinel error, words ...string) {
	t.Helper()
	t.Logf("error: %v", err)
	if !errors.Is(err, sentinel) {
		t.Fatalf("err=%v, want %v", err, sentinel)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("err=%q does not say %q", err, w)
		}
	}
}

func TestBadInput(t *testing.T) {
	srv := azuritetest.New(t)
	key := azblob.Credentials{AccountKey: azuritetest.Key}
	t.Run("MissingContainer", func(t *testing.T) {
		err := check(t, azuritetest.Account, "no-such-container", azblob.Options{Endpoint: srv.Endpoint, Credentials: key})
		wantErr(t, err, cloud.ErrBucketNotFound, `container "no-such-container"`, "shared key of devstoreaccount1")
	})
	t.Run("UnknownAccount", func(t *testing.T) {
		err := check(t, "nosuchaccount", azuritetest.Container, azblob.Options{Endpoint: srv.URL + "/nosuchaccount", Credentials: key})
		t.Logf("error: %v", err)
		if !errors.Is(err, cloud.ErrBucketNotFound) && !errors.Is(err, cloud.ErrAccessDenied) {
			t.Fatalf("err=%v, want bucket not found or access denied", err)
		}
		if !strings.Contains(err.Error(), "nosuchaccount") {
			t.Fatalf("err=%q does not name the account", err)
		}
	})
	t.Run("UnknownAccountHost", func(t *testing.T) {
		// .invalid never resolves (RFC 2606): what a mistyped account
		// name does on Azure, where the account is the host name.
		err := check(t, "nosuchaccount", azuritetest.Container, azblob.Options{Endpoint: "http://nosuchaccount.blob.invalid", Credentials: key})
		wantErr(t, err, cloud.ErrUnreachable, "nosuchaccount")
	})
	t.Run("WrongKey", func(t *testing.T) {
		bad := azblob.Credentials{AccountKey: "d3Jvbmcga2V5IGZvciB0aGUgdGVzdA=="}
		err := check(t, azuritetest.Account, azuritetest.Container, azblob.Options{Endpoint: srv.Endpoint, Credentials: bad})
		wantErr(t, err, cloud.ErrAccessDenied, "shared key of devstoreaccount1")
	})
	t.Run("ExpiredSAS", func(t *testing.T) {
		token := accountSAS(t, time.Now().Add(-time.Hour))
		err := check(t, azuritetest.Account, azuritetest.Container, azblob.Options{Endpoint: srv.Endpoint, Credentials: azblob.Credentials{SAS: token}})
		wantErr(t, err, cloud.ErrAccessDenied, "SAS token")
		// The same SAS, valid: the store works through it.
		good := accountSAS(t, time.Now().Add(time.Hour))
		if err := check(t, azuritetest.Account, azuritetest.Container, azblob.Options{Endpoint: srv.Endpoint, Credentials: azblob.Credentials{SAS: good}}); err != nil {
			t.Fatalf("valid SAS: %v", err)
		}
	})
	t.Run("BadConnectionString", func(t *testing.T) {
		_, err := azblob.New(t.Context(), "", "c", "", azblob.Options{Credentials: azblob.Credentials{ConnectionString: "AccountName=x"}})
		if err == nil || !strings.Contains(err.Error(), "AZURE_STORAGE_CONNECTION_STRING") || !strings.Contains(err.Error(), "AccountKey or SharedAccessSignature") {
			t.Fatalf("err=%v, want it to name the connection string and what it lacks", err)
		}
	})
	t.Run("NoAccount", func(t *testing.T) {
		t.Setenv("AZURE_STORAGE_ACCOUNT", "")
		t.Setenv("AZURE_STORAGE_ACCOUNT_NAME", "")
		_, err := azblob.New(t.Context(), "", "ckpts", "", azblob.Options{Credentials: key})
		if err == nil || !strings.Contains(err.Error(), "az://ckpts@ACCOUNT") {
			t.Fatalf("err=%v, want it to say how to name the account", err)
		}
	})
}

// TestDefaultChainError: with no key, SAS or connection string the SDK's
// chain is used, and its failure says what it tried and what is missing.
// AZURE_TOKEN_CREDENTIALS narrows the chain to the environment credential,
// so that the test never asks a metadata endpoint (169.254.169.254).
func TestDefaultChainError(t *testing.T) {
	for _, k := range []string{"AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_KEY",
		"AZURE_STORAGE_ACCOUNT_KEY", "AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE"} {
		t.Setenv(k, "")
	}
	t.Setenv("AZURE_TOKEN_CREDENTIALS", "EnvironmentCredential")
	err := check(t, "acct", "ckpts", azblob.Options{Endpoint: "https://127.0.0.1:1/acct"})
	t.Logf("error: %v", err)
	if err == nil {
		t.Fatal("check without any credential succeeded")
	}
	for _, w := range []string{"DefaultAzureCredential", "EnvironmentCredential", "AZURE_TENANT_ID"} {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("err=%q does not say %q", err, w)
		}
	}
}

// accountSAS is an account SAS of the development account, valid until
// expiry (started an hour before it).
func accountSAS(t *testing.T, expiry time.Time) string {
	t.Helper()
	cred, err := service.NewSharedKeyCredential(azuritetest.Account, azuritetest.Key)
	if err != nil {
		t.Fatal(err)
	}
	q, err := sas.AccountSignatureValues{
		Protocol: sas.ProtocolHTTPSandHTTP, StartTime: expiry.Add(-2 * time.Hour), ExpiryTime: expiry,
		Permissions:   (&sas.AccountPermissions{Read: true, Write: true, Delete: true, List: true, Create: true, Add: true}).String(),
		ResourceTypes: (&sas.AccountResourceTypes{Service: true, Container: true, Object: true}).String(),
	}.SignWithSharedKey(cred)
	if err != nil {
		t.Fatal(err)
	}
	return q.Encode()
}

// TestServiceUnavailableStorm: behind a proxy that answers 503 to a third
// of the staged blocks and commits, a Put's requests are retried by the
// SDK and the object arrives whole; under a storm of every request, Put
// fails once its context ends and nothing is committed, not even a part.
func TestServiceUnavailableStorm(t *testing.T) {
	srv := azuritetest.New(t)
	proxy := faultproxy.New(t, srv.URL)
	st := newStore(t, srv, azblob.Options{Endpoint: proxy.URL + "/" + azuritetest.Account, BlockSize: 1 << 20, Concurrency: 4})
	isPut := func(r *http.Request) bool { return r.Method == http.MethodPut }
	data := cloudtest.Random(5, 6<<20+77)

	proxy.Set(faultproxy.Fault{Mode: faultproxy.SlowDown, Fraction: 0.33, Match: isPut})
	if err := st.Put(t.Context(), "storm/obj", bytes.NewReader(data), int64(len(data)), cloud.PutOptions{}); err != nil {
		t.Fatalf("put through a partial 503 storm: %v", err)
	}
	if proxy.Stats().Faults == 0 {
		t.Fatal("the proxy injected no fault")
	}
	proxy.Clear()
	rc, err := st.Get(t.Context(), "storm/obj", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	_, err = got.ReadFrom(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("read back %d bytes (%v), want the %d written", got.Len(), err, len(data))
	}

	// Every block stages, then every commit is refused until the deadline.
	isCommit := func(r *http.Request) bool { return isPut(r) && r.URL.Query().Get("comp") == "blocklist" }
	proxy.Set(faultproxy.Fault{Mode: faultproxy.SlowDown, Match: isCommit})
	ctx, cancel := contextWithTimeout(t, 3*time.Second)
	defer cancel()
	err = st.Put(ctx, "storm/half", bytes.NewReader(data), int64(len(data)), cloud.PutOptions{})
	if err == nil {
		t.Fatal("put with every commit refused succeeded")
	}
	proxy.Clear()
	if _, err := st.Stat(t.Context(), "storm/half"); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("stat after a refused commit: %v, want ErrNotExist (nothing committed)", err)
	}
}

func contextWithTimeout(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), d)
}
