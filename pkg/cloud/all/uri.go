package all

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// errUnknownScheme and errMalformedURI describe a store URI that cannot be
// opened; compare with errors.Is.
var (
	errUnknownScheme = errors.New("unknown store scheme (want s3://, gs://, az://, file:// or a path)")
	errMalformedURI  = errors.New("malformed store URI")
)

var (
	schemeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	// Lower-case letters, digits, '.', '-' and (GCS only, but harmless) '_';
	// 3 to 63 characters, starting and ending with a letter or digit.
	bucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$`)
	// Azure: a container is 3 to 63 lower-case letters, digits and single
	// hyphens, starting and ending with a letter or digit; an account 3
	// to 24 lower-case letters and digits.
	containerRE = regexp.MustCompile(`^[a-z0-9](-?[a-z0-9]){2,62}$`)
	accountRE   = regexp.MustCompile(`^[a-z0-9]{3,24}$`)
)

// parseURI splits a store URI. s3://bucket/prefix and gs://bucket/prefix
// give the bucket and the prefix without surrounding slashes;
// az://container/prefix and az://container@account/prefix give the
// container (with "@account" when named) as the bucket; file:///abs
// and a plain path (relative or absolute) give scheme "file", no bucket and
// the path as prefix.
func parseURI(uri string) (scheme, bucket, prefix string, err error) {
	if uri == "" {
		return "", "", "", fmt.Errorf("%w: empty", errMalformedURI)
	}
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		if schemeRE.MatchString(uri) {
			return "", "", "", fmt.Errorf("%w %q: want scheme://bucket/prefix", errMalformedURI, uri)
		}
		return "file", "", uri, nil
	}
	switch strings.ToLower(scheme) {
	case "file":
		if !strings.HasPrefix(rest, "/") {
			return "", "", "", fmt.Errorf("%w %q: want file:///absolute/path", errMalformedURI, uri)
		}
		return "file", "", rest, nil
	case "s3", "gs":
		scheme = strings.ToLower(scheme)
	case "az":
		return parseAzure(uri, rest)
	default:
		return "", "", "", fmt.Errorf("%w: %q", errUnknownScheme, uri)
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	if !bucketRE.MatchString(bucket) || strings.Contains(bucket, "..") {
		return "", "", "", fmt.Errorf("%w %q: invalid bucket name %q", errMalformedURI, uri, bucket)
	}
	prefix = strings.Trim(prefix, "/")
	if prefix != "" && cloud.ValidKey(prefix) != nil {
		return "", "", "", fmt.Errorf("%w %q: invalid prefix", errMalformedURI, uri)
	}
	return scheme, bucket, prefix, nil
}

// parseAzure reads az://CONTAINER[@ACCOUNT]/PREFIX: the container first,
// as fsspec (adlfs), object_store (Rust, Polars, DuckDB) and Arrow write
// az://, so a URI from the training code's own data loading means the same
// here; the account, when not in the environment (AZURE_STORAGE_ACCOUNT)
// or a connection string, after an "@", as in abfs://container@account.
func parseAzure(uri, rest string) (scheme, bucket, prefix string, err error) {
	bucket, prefix, _ = strings.Cut(rest, "/")
	ctr, account, hasAccount := strings.Cut(bucket, "@")
	if len(ctr) > 63 || !containerRE.MatchString(ctr) {
		return "", "", "", fmt.Errorf("%w %q: invalid container name %q", errMalformedURI, uri, ctr)
	}
	if hasAccount && !accountRE.MatchString(account) {
		return "", "", "", fmt.Errorf("%w %q: invalid storage account name %q", errMalformedURI, uri, account)
	}
	prefix = strings.Trim(prefix, "/")
	if prefix != "" && cloud.ValidKey(prefix) != nil {
		return "", "", "", fmt.Errorf("%w %q: invalid prefix", errMalformedURI, uri)
	}
	return "az", bucket, prefix, nil
}

// CheckURI reports whether uri is a store URI Open could parse, without
// opening anything: for flags checked before the agent touches a store.
func CheckURI(uri string) error {
	_, _, _, err := parseURI(uri)
	return err
}
