package azblob

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
)

// The environment the store reads, the names the Azure CLI, the SDKs and
// the other tools that serve Azure Blob (adlfs, object_store, azcopy)
// already use. Nothing here is spotagent's own.
const (
	envConnString  = "AZURE_STORAGE_CONNECTION_STRING" // az CLI, every SDK
	envAccount     = "AZURE_STORAGE_ACCOUNT"           // az CLI
	envAccountName = "AZURE_STORAGE_ACCOUNT_NAME"      // adlfs, object_store
	envKey         = "AZURE_STORAGE_KEY"               // az CLI
	envAccountKey  = "AZURE_STORAGE_ACCOUNT_KEY"       // adlfs, object_store
	envSAS         = "AZURE_STORAGE_SAS_TOKEN"         // az CLI, adlfs
	envEndpoint    = "AZURE_STORAGE_ENDPOINT"          // object_store: the blob service URL (an emulator)
)

// The emulator's well-known account and key (public, in Microsoft's
// documentation), for UseDevelopmentStorage=true.
const (
	devAccount  = "devstoreaccount1"
	devKey      = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
	devEndpoint = "http://127.0.0.1:10000/devstoreaccount1"
)

// Credentials is how the store authenticates. Exactly one way is used:
// the first of these that is set (fields before the environment), so an
// error can say which one was tried:
//  1. ConnectionString (AZURE_STORAGE_CONNECTION_STRING): AccountKey or
//     SharedAccessSignature, BlobEndpoint; UseDevelopmentStorage=true is
//     the emulator's well-known account.
//  2. SAS (AZURE_STORAGE_SAS_TOKEN): a shared access signature.
//  3. AccountKey (AZURE_STORAGE_KEY, AZURE_STORAGE_ACCOUNT_KEY): shared key.
//  4. Otherwise the SDK's DefaultAzureCredential: a service principal from
//     AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET, workload identity
//     on AKS (AZURE_FEDERATED_TOKEN_FILE), the VM's managed identity, the
//     Azure CLI's login.
type Credentials struct {
	ConnectionString string
	SAS              string
	AccountKey       string
}

// FromEnv fills the unset fields of c from the environment.
func (c Credentials) FromEnv() Credentials {
	if c.ConnectionString == "" && c.SAS == "" && c.AccountKey == "" {
		c.ConnectionString = os.Getenv(envConnString)
		c.SAS = os.Getenv(envSAS)
		c.AccountKey = firstEnv(envKey, envAccountKey)
	}
	return c
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// connString is a parsed storage connection string.
type connString struct {
	account, key, sas, endpoint string
}

// parseConnString reads the keys of an Azure Storage connection string.
func parseConnString(s string) (connString, error) {
	kv := map[string]string{}
	for part := range strings.SplitSeq(strings.TrimRight(s, ";"), ";") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return connString{}, errors.New("connection string: want key=value pairs separated by ';'")
		}
		kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if strings.EqualFold(kv["UseDevelopmentStorage"], "true") {
		ep := devEndpoint
		if proxy := kv["DevelopmentStorageProxyUri"]; proxy != "" {
			ep = strings.TrimRight(proxy, "/") + "/" + devAccount
		}
		return connString{account: devAccount, key: devKey, endpoint: ep}, nil
	}
	cs := connString{account: kv["AccountName"], key: kv["AccountKey"], sas: kv["SharedAccessSignature"], endpoint: kv["BlobEndpoint"]}
	if cs.endpoint == "" && cs.account != "" {
		proto, suffix := kv["DefaultEndpointsProtocol"], kv["EndpointSuffix"]
		if proto == "" {
			proto = "https"
		}
		if suffix == "" {
			suffix = "core.windows.net"
		}
		cs.endpoint = proto + "://" + cs.account + ".blob." + suffix
	}
	switch {
	case cs.endpoint == "":
		return connString{}, errors.New("connection string: needs AccountName or BlobEndpoint")
	case cs.key == "" && cs.sas == "":
		return connString{}, errors.New("connection string: needs AccountKey or SharedAccessSignature")
	case cs.key != "" && cs.account == "":
		return connString{}, errors.New("connection string: AccountKey needs AccountName")
	}
	return cs, nil
}

// clientFor builds the container client for account and container with
// the first credential c holds, and names it for errors and logs.
// endpoint, when not empty, is the blob service URL (an emulator's).
func clientFor(account, containerName, endpoint string, c Credentials, copts *container.ClientOptions) (*container.Client, string, error) {
	serviceURL := func(ep string) string {
		if ep == "" {
			ep = "https://" + account + ".blob.core.windows.net"
		}
		return strings.TrimRight(ep, "/") + "/" + url.PathEscape(containerName)
	}
	switch {
	case c.ConnectionString != "":
		cs, err := parseConnString(c.ConnectionString)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", envConnString, err)
		}
		if cs.account != "" && account != "" && cs.account != account {
			return nil, "", fmt.Errorf("%s is for account %q, the store names %q", envConnString, cs.account, account)
		}
		ep := cs.endpoint
		if endpoint != "" {
			ep = endpoint
		}
		if cs.key != "" {
			return sharedKeyClient(cs.account, cs.key, serviceURL(ep), "shared key of "+cs.account+" from the connection string", copts)
		}
		return sasClient(serviceURL(ep), cs.sas, "SAS from the connection string", copts)
	case c.SAS != "":
		return sasClient(serviceURL(endpoint), c.SAS, "SAS token", copts)
	case c.AccountKey != "":
		return sharedKeyClient(account, c.AccountKey, serviceURL(endpoint), "shared key of "+account, copts)
	}
	cred, err := azidentity.NewDefaultAzureCredential(nil)
	if err != nil {
		return nil, "", fmt.Errorf("azure default credential chain (environment, workload identity, managed identity, az login): %w", err)
	}
	cl, err := container.NewClient(serviceURL(endpoint), cred, copts)
	return cl, "DefaultAzureCredential (environment, workload identity, managed identity, az login)", err
}

func sharedKeyClient(account, key, u, name string, copts *container.ClientOptions) (*container.Client, string, error) {
	cred, err := container.NewSharedKeyCredential(account, key)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", name, err)
	}
	cl, err := container.NewClientWithSharedKeyCredential(u, cred, copts)
	return cl, name, err
}

func sasClient(u, sas, name string, copts *container.ClientOptions) (*container.Client, string, error) {
	cl, err := container.NewClientWithNoCredential(u+"?"+strings.TrimPrefix(sas, "?"), copts)
	return cl, name, err
}

var _ azcore.TokenCredential = (*azidentity.DefaultAzureCredential)(nil)
