package all

import (
	"errors"
	"testing"
)

func TestParseURI(t *testing.T) {
	for _, tc := range []struct{ uri, scheme, bucket, prefix string }{
		{"s3://bucket/runs/exp42", "s3", "bucket", "runs/exp42"},
		{"s3://my.bucket-1/", "s3", "my.bucket-1", ""},
		{"S3://bucket", "s3", "bucket", ""},
		{"gs://b_k/a/b/", "gs", "b_k", "a/b"},
		{"az://ckpts/runs/exp42", "az", "ckpts", "runs/exp42"},
		{"AZ://my-ckpts@acct01/runs/", "az", "my-ckpts@acct01", "runs"},
		{"file:///var/lib/ck", "file", "", "/var/lib/ck"},
		{"./ck", "file", "", "./ck"},
		{"/abs/ck", "file", "", "/abs/ck"},
	} {
		s, b, p, err := parseURI(tc.uri)
		if err != nil || s != tc.scheme || b != tc.bucket || p != tc.prefix {
			t.Errorf("parseURI(%q)=%q,%q,%q,%v; want %q,%q,%q", tc.uri, s, b, p, err, tc.scheme, tc.bucket, tc.prefix)
		}
	}
	for uri, want := range map[string]error{
		"":                  errMalformedURI,
		"s3://":             errMalformedURI,
		"s3:/bucket":        errMalformedURI,
		"s3://Upper/x":      errMalformedURI,
		"gs://b/../x":       errMalformedURI,
		"file://relative/x": errMalformedURI,
		"azure://c/x":       errUnknownScheme,
		"az://a--b/x":       errMalformedURI,
		"az://Ckpts/x":      errMalformedURI,
		"az://ck@Acct/x":    errMalformedURI,
		"az://ck@/x":        errMalformedURI,
		"az://ck/../x":      errMalformedURI,
		"http://host/x":     errUnknownScheme,
	} {
		if _, _, _, err := parseURI(uri); !errors.Is(err, want) {
			t.Errorf("parseURI(%q) err=%v, want %v", uri, err, want)
		}
	}
}

func TestOpenBadURI(t *testing.T) {
	_, err := Open(t.Context(), "azure://c/x", Options{})
	if !errors.Is(err, errUnknownScheme) {
		t.Fatalf("unknown scheme: err=%v", err)
	}
	_, err = Open(t.Context(), "s3://", Options{})
	if !errors.Is(err, errMalformedURI) {
		t.Fatalf("malformed: err=%v", err)
	}
}
